"""The Redis store: the same contract as the database's (SPEC sections 2 and 3) but atomic
mode, on one Redis server (a Sentinel's master) or a Redis Cluster, through the client of a
Django cache alias (Django's ``RedisCache``, django-redis) or one made from a URL.

It implements the store contract (:class:`.._store.contract.StoreContract`: the claim, fenced
writes, renewal, status poll), each a Lua script of :mod:`.scripts` run by :mod:`.running`; no
transaction is shared with the view's database, and it has no Django connection. The core's
``pk`` of a claim (its handle) is a number of this process (the claim's writes are always this
process's), mapped to the record's Redis key (:mod:`.keyspace`); a final write (the result, the
unlock, the release) spends it, whatever its outcome.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from django_idempotency._base import rules
from django_idempotency._conf.values import display_name
from django_idempotency._store import deadlines
from django_idempotency._store.claims import new_token
from django_idempotency._store.contract import Lock, StoreContract, StoredResponse, StoreFeatures
from django_idempotency._store.redis import (
    clients,
    codec,
    faults,
    renewal,
    running,
    scans,
    scripts,
    waits,
)
from django_idempotency._store.redis.codec import as_micros, as_text, as_time
from django_idempotency._store.redis.connections import Connections
from django_idempotency._store.redis.faults import RedisFault, failures
from django_idempotency._store.redis.keyspace import key_prefix, record_key, scope_index
from django_idempotency._store.rows import Record
from django_idempotency.models import IdempotencyKey

logger = logging.getLogger("django_idempotency")

#: How many times a claim is sent when it meets a fault (its reply lost: the second finds the
#: first's record by its token).
_CLAIM_TRIES = 2


class RedisStore(StoreContract):
    """The store of one Redis server (see the module's docstring)."""

    vendor = "redis"
    name = "Redis"
    #: :meth:`_run` tries a script again within its bound: an owner's result write is given
    #: what its lock has left (:func:`django_idempotency._call.fencing.fenced_write`). Writers
    #: do not take one lock in turn: a renewal is cut to a share of the time left
    #: (:func:`django_idempotency._call.heartbeat.renewal_bound`), as on a database server. No
    #: transaction is shared with the view's database, and no atomic mode.
    features = StoreFeatures(rides_out_faults=True)

    def __init__(self, alias: str, judge: Callable[[BaseException], bool]) -> None:
        self.alias = alias
        #: Whether a database error of the project's code is transient: the app's database's
        #: store says (given by the registry, which knows the database's stores).
        self._judge = judge
        self._client: Any = None
        self._prefix: str | None = None
        self._cluster: bool | None = None
        self._scripts: dict[str, Any] = {}
        #: The store's own connections (:mod:`.connections`), from the client's plain pool.
        self._wire = Connections()
        #: The records of this process's live claims: pk -> (Redis key, scope, key hash).
        self._records: dict[int, tuple[str, str, str]] = {}
        #: Whether the server has ``WAITAOF`` (Redis 7.2+), read at the first wait.
        self._waitaof: bool | None = None
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()

    # -- what the core reads of every store --------------------------------------------------

    @property
    def prefix(self) -> str:
        """The prefix of the store's keys (:func:`.keyspace.key_prefix`), read once."""
        if self._prefix is None:
            self._prefix = key_prefix(self.alias)
        return self._prefix

    @property
    def client(self) -> Any:
        if self._client is None:
            with self._lock:  # one client: a second one's end would close the first's sockets
                self._make_client()
        return self._client

    @property
    def bounds_each_call(self) -> bool:
        """Whether each call sets its own timeouts, on a connection of the store's own (a
        plain pool): read after :attr:`client`."""
        return self._wire.pool is not None

    def _make_client(self) -> None:
        """The store's one client, made by the first call of the process. Made twice by two
        first calls at once, the one dropped closed its pool when collected (redis-py's
        ``Redis.__del__``: a client made from a URL owns its pool), with the connections our
        idle list and the other threads' calls had from it: a read in flight met a closed
        socket, a ``500`` (CI's Redis fault leg; 1 of 42 fresh apps sent 20 requests at once)."""
        if self._client is None:
            client = clients.make_client(self.alias)
            #: A cluster's client: a script touches one slot, so a record's index is written
            #: apart from it (:meth:`_index`).
            self._cluster = clients.is_cluster(client)
            self._wire.pool = clients.own_pool(client)
            self._client = client

    def _script(self, name: str) -> Any:
        script = self._scripts.get(name)
        if script is None:
            script = self._scripts[name] = self.client.register_script(getattr(scripts, name))
        return script

    def is_fault(self, exc: BaseException) -> bool:
        # Faults are ridden out inside each call (:meth:`_run`), within its bound: the core's
        # reconnection on a new Django connection has nothing to do here.
        return False

    def is_transient(self, exc: BaseException) -> bool:
        """A database error of the project's code (the scope function reading the user):
        as the database's store says."""
        return isinstance(exc, RedisFault) or self._judge(exc)

    @property
    def display_name(self) -> str:
        """How messages and logs name the store: without the URL's password."""
        return display_name(self.alias)

    def expected_fault(self, exc: BaseException) -> bool:
        """A refusal caused by the connection or the server: an outage
        (:func:`.faults.expected`)."""
        return faults.expected(exc)

    # -- running a script --------------------------------------------------------------------

    def _run(
        self,
        name: str,
        keys: list[str],
        args: list[Any],
        bound: float | None,
        tries: int | None = None,
    ) -> Any:
        """Run a script within ``bound`` seconds (or ``tries``), again after a fault
        (:func:`.running.run`); then :class:`.faults.RedisFault`."""
        return running.run(self._eval, name, keys, args, bound, tries, self.alias)

    def _eval(self, name: str, keys: list[str], args: list[Any], seconds: float) -> Any:
        """One try of a script: on a connection of the store's own (:func:`.running.by_own`),
        or through redis-py's ``Script`` for a cluster, Sentinel's master, or a client
        without a plain pool. ``seconds``: what the try may take."""
        script = self._script(name)
        wait = self._wait_command(name, seconds)
        if self._wire.pool is None:
            return running.by_client(self.client, script, name, keys, args, wait)
        return running.by_own(self._wire, script, name, keys, args, seconds, wait)

    def _wait_command(self, name: str, seconds: float) -> tuple[Any, ...] | None:
        """The wait that follows a claim or a result write on its connection when
        ``REDIS_REPLICAS`` asks for replicas (:mod:`.waits`)."""
        if name not in waits.WAITED:
            return None
        from django_idempotency._conf.settings import conf

        replicas = conf.REDIS_REPLICAS
        if not replicas:
            return None
        if self._cluster:
            raise RedisFault(
                f"Redis store {self.alias!r}: REDIS_REPLICAS is not supported on a Redis "
                "Cluster (a WAIT must follow the write on its node's connection)."
            )
        if self._waitaof is None:
            version = waits.server_version(self._wire, self.client, seconds)
            self._waitaof = waits.has_waitaof(version)
        return waits.command(replicas, seconds, self._waitaof)

    # -- the claim ---------------------------------------------------------------------------

    def claim(
        self,
        identity: Any,
        *,
        ttl: timedelta,
        lock_timeout: timedelta,
        token: str | None = None,
        bound: float | None = None,
    ) -> Any:
        started = time.monotonic()
        token = token or new_token()
        key = record_key(identity.scope, identity.key_hash, self.prefix)
        if bound is None:
            bound = deadlines.bound(lock_timeout)
        try:
            reply = self._run(
                "CLAIM",
                [key],
                [
                    token,
                    identity.fingerprint,
                    identity.method,
                    identity.path,
                    as_micros(lock_timeout),
                    as_micros(ttl),
                    identity.scope,
                ],
                bound,
                tries=_CLAIM_TRIES,
            )
        except RedisFault as exc:
            if getattr(exc.__cause__, "short_wait", False):
                self._let_go(key, token, bound)
            raise self.refusal(exc) from exc
        if reply[0] == b"found":
            return codec.record(identity.scope, identity.key_hash, reply)
        return self._claimed(identity, key, token, reply, lock_timeout, started)

    def _claimed(
        self,
        identity: Any,
        key: str,
        token: str,
        reply: list[Any],
        lock_timeout: timedelta,
        started: float,
    ) -> Any:
        """The claim this call holds now (new, its own again, or taken over), its pk mapped
        to its record's key."""
        attempt, point, data, life = codec.claimed(reply)
        with self._lock:
            pk = next(self._numbers)
        self._records[pk] = (key, identity.scope, identity.key_hash)
        return identity.claimed(
            pk=pk,
            token_text=token,
            attempt=attempt,
            recovery_point=point,
            recovery_data=data,
            alias=self.alias,
            lock_timeout=lock_timeout,
            held_until=started + lock_timeout.total_seconds(),
            uncommitted=False,
            life=life,
        )

    def _let_go(self, key: str, token: str, bound: float) -> None:
        """A claim the replicas did not acknowledge answers ``503`` and its view never runs:
        its lock is let go at once (``UNLOCK``, fenced: the record and its recovery point
        kept), so the client's retry takes it over instead of waiting out the lock (``409``)."""
        try:
            self._run("UNLOCK", [key], [token], bound, tries=1)
        except RedisFault:
            logger.warning("Could not let go of an unacknowledged claim's lock.", exc_info=True)

    def created_at(self, pk: int) -> datetime | None:
        """When a live claim's record began (:attr:`.Claim.life`, its operation id): it read
        the database's table by the cache alias's name, which is no database."""
        import redis

        entry = self._records.get(pk)
        if entry is None:
            return None
        try:
            return as_time(self.client.hget(entry[0], "ca"))
        except redis.RedisError as exc:
            raise self.refusal(exc) from exc

    def read(self, scope: str, key_hash: str) -> IdempotencyKey | None:
        """The key's record, as a claim that found it would read it (tests, operators)."""

        try:
            values = self.client.hmget(record_key(scope, key_hash, self.prefix), *scripts.FIELDS)
            now = self.client.time()
        except failures() as exc:
            raise self.refusal(exc) from exc
        if values[0] is None:
            return None
        found: Record = codec.record(
            scope, key_hash, [b"found", now[0] * 1_000_000 + now[1], *values]
        )
        return found.instance()

    def expire(self, scope: str, key_hash: str) -> IdempotencyKey | None:
        """Expire the key's record now, as its TTL would: Redis deletes it
        (:func:`django_idempotency.testing.expire_key`). Returns it, expired now."""
        record = self.read(scope, key_hash)
        if record is not None:
            self.client.delete(record_key(scope, key_hash, self.prefix))
            record.expires_at = timezone.now()  # as the database's expire_key leaves it
        return record

    def read_finished(self, identity: Any, bound: float) -> None:
        return None  # atomic mode only, which the Redis store refuses

    def peek_status(self, scope: str, key_hash: str, bound: float | None = None) -> Lock | None:
        key = record_key(scope, key_hash, self.prefix)
        try:
            client = self.client  # made first: the pool is known then
            if self._wire.pool is not None:
                seconds = deadlines.LEAST if bound is None else bound
                (reply,) = self._wire.exchange([("HMGET", key, "st", "ua")], seconds, "HMGET")
                if isinstance(reply, Exception):
                    raise reply
                status, unlock = reply
            else:
                status, unlock = client.hmget(key, "st", "ua")
        except failures() as exc:
            raise self.refusal(exc) from exc
        if status is None:
            return None
        return Lock(as_text(status), as_time(unlock))

    # -- the fenced writes -------------------------------------------------------------------

    def _key(self, pk: int) -> str:
        return self._records[pk][0]

    def store_response(
        self,
        pk: int,
        token: Any,
        stored: StoredResponse,
        *,
        stale_at: datetime | None = None,
        connection: Any = None,
        bound: float | None = None,
        release: Any = None,
    ) -> bool:
        assert release is None, "the outbox needs the database store (Claim.enqueue refuses)"
        headers, body = stored.sealed
        status = rules.stored_status(stored.status)
        key, scope, key_hash = self._records[pk]
        index = self._cluster is False
        done = self._run(
            "COMPLETE",
            [key, scope_index(scope, self.prefix)] if index else [key],
            [
                str(token),
                status,
                "" if stored.status is None else stored.status,
                json.dumps(headers, separators=(",", ":")),
                b"" if body is None else body,
                "0" if body is None else "1",
                "" if stored.ttl is None else as_micros(stored.ttl),
                key_hash,
            ],
            bound,
        )
        if done and not index:
            self._index(scope, key_hash, stored.ttl)
        self._records.pop(pk, None)
        return bool(done)

    def _index(self, scope: str, key_hash: str, ttl: timedelta | None) -> None:
        """On a cluster: add a finished record to its scope's index (erasure), after its
        script; the index forgets records past their expiry, and expires after the last."""
        from django_idempotency._conf.settings import conf

        lasts = ttl or conf.TTL
        now = time.time()
        index = scope_index(scope, self.prefix)
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.zadd(index, {key_hash: now + lasts.total_seconds()})
            pipe.zremrangebyscore(index, "-inf", now)
            pipe.expire(index, int(lasts.total_seconds()) + 1, gt=True)
            pipe.expire(index, int(lasts.total_seconds()) + 1, nx=True)
            pipe.execute()
        except Exception:  # the result is stored: only erasure would miss it
            logger.warning("Could not index an idempotency record for erasure.", exc_info=True)

    def finished(self, pk: int, token: Any, connection: Any) -> bool:
        return False  # a result stored whose reply was lost returns 2: never asked

    def has_recovery_point(self, pk: int, token: Any, name: str, connection: Any) -> bool:
        return False  # a recovery point written again matches again: never asked

    def save_recovery_point(
        self,
        pk: int,
        token: Any,
        name: str,
        data: Any,
        lock_timeout: timedelta,
        *,
        connection: Any = None,
        bound: float | None = None,
        release: Any = None,
    ) -> bool:
        assert release is None, "the outbox needs the database store (Claim.enqueue refuses)"
        encoded = json.dumps(data, separators=(",", ":"))
        saved = bool(
            self._run(
                "RECOVERY_POINT",
                [self._key(pk)],
                [str(token), name, encoded, as_micros(lock_timeout)],
                deadlines.bound(lock_timeout) if bound is None else bound,
            )
        )
        return saved  # lost (LockLost): the claim's release still comes, and its script refuses

    def unlock(
        self, pk: int, token: Any, *, connection: Any = None, bound: float | None = None
    ) -> bool:
        try:
            return bool(self._run("UNLOCK", [self._key(pk)], [str(token)], bound))
        finally:
            self._records.pop(pk, None)

    def release(
        self,
        pk: int,
        token: Any,
        *,
        stale_at: datetime | None = None,
        connection: Any = None,
        bound: float | None = None,
    ) -> bool:
        try:
            return bool(self._run("RELEASE", [self._key(pk)], [str(token)], bound))
        finally:
            self._records.pop(pk, None)

    def renew(
        self,
        leases: Sequence[tuple[int, Any]],
        lock_timeout: timedelta,
        bound: float | None = None,
    ) -> set[tuple[int, Any]]:
        """Push the locks of many claims forward (:mod:`.renewal`): one write of fenced
        scripts on a connection of the store's own, one pipeline of the client, or on a
        cluster each node's locks apart; within ``bound`` seconds (the renewer's; by default
        a statement's share of the lock)."""

        known = [(pk, token) for pk, token in leases if pk in self._records]
        if not known:
            return set()
        lock = as_micros(lock_timeout)
        seconds = deadlines.bound(lock_timeout) if bound is None else bound
        try:
            script = self._script("RENEW")
            locks = [(pk, token, self._key(pk)) for pk, token in known]
            if self._wire.pool is not None:
                results = renewal.bounded(self._wire, script, locks, lock, seconds)
            elif self._cluster:
                return renewal.on_cluster(
                    self.client, self._wire, script, locks, lock, seconds, self.display_name
                )
            else:
                results = renewal.pipelined(self.client, script, locks, lock)
        except failures() as exc:
            raise RedisFault(f"Redis store {self.display_name!r}: {exc}") from exc
        # A lock found lost keeps its record's entry: the owner's result write or release still
        # comes, and its script refuses it (a KeyError there was a crash instead, CI once).
        return {lease for lease, result in zip(known, results, strict=True) if result}

    # -- operations --------------------------------------------------------------------------

    def erase_scope(self, scope: str, *, dry_run: bool = False) -> tuple[int, int]:
        """Delete the scope's finished records now: (deleted, in progress)."""
        return scans.erase(self.client, self._erase, scope, self.prefix, dry_run)

    def _erase(self, key: str) -> Any:
        return self._run("ERASE", [key], [], None)

    def count(self) -> int:
        """How many records the store holds (a ``SCAN`` of its prefix: an operator's figure)."""
        return scans.count(self.client, self.prefix)

    def records_of(self, key_hash: str) -> list[IdempotencyKey]:
        """The key's records in every scope (each read as :meth:`read` reads it, unsaved
        instances), oldest first: tests, operators."""
        return scans.key_records(self.client, self.prefix, key_hash, self.read)

    def census(self) -> dict[str, Any]:
        """The store's records by status, and how many are processing with their lock lapsed
        (:func:`.scans.census`)."""
        return scans.census(self.client, self.prefix)
