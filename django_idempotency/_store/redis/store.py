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
from django_idempotency._base.durations import microseconds
from django_idempotency._conf.values import display_name
from django_idempotency._store import deadlines
from django_idempotency._store.claims import new_token
from django_idempotency._store.contract import (
    ClaimHandle,
    Lock,
    StoreContract,
    StoredResponse,
    StoreFeatures,
)
from django_idempotency._store.outbox import Backlog, Release
from django_idempotency._store.redis import (
    clients,
    codec,
    faults,
    names,
    operations,
    renewal,
    running,
    scans,
    scripts,
    waits,
)
from django_idempotency._store.redis import outbox as messages
from django_idempotency._store.redis.codec import as_instant, as_micros, as_text, as_time
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
        #: The operation ids of those records (:mod:`.operations`), and the pks whose id was
        #: handed out (its index written: written again when the record's expiry moves).
        self._oids: dict[int, str] = {}
        self._named: set[int] = set()
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
            text = (
                getattr(scripts, name, None)
                or getattr(operations, name, None)
                or getattr(messages, name)
            )
            script = self._scripts[name] = self.client.register_script(text)
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
                    names.new_id(),
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
        if reply[-1]:  # the record's operation id: absent on a record of an older version
            self._oids[pk] = as_text(reply[-1])
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
        headers, body = stored.sealed
        status = rules.stored_status(stored.status)
        key, scope, key_hash = self._records[pk]
        index = self._cluster is False
        done = self._releasing(
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
            release,
            scope,
        )
        if done and not index:
            self._index(scope, key_hash, stored.ttl)
        if done and pk in self._named:  # its expiry may have moved: its index's with it
            self._name_again(key, self._oids[pk])
        self._forget(pk)
        return bool(done)

    def _releasing(
        self,
        name: str,
        keys: list[str],
        args: list[Any],
        bound: float | None,
        release: Release | None,
        scope: str,
    ) -> Any:
        """Run the fenced write ``name``, and with it (``release``: the outbox's staged
        messages) the release of its messages, in one script (:mod:`.outbox`): they exist
        exactly when the write applied."""
        if release is None:
            return self._run(name, keys, args, bound)
        if self._cluster:  # refused before (E065, the view's first request, enqueue)
            raise RedisFault(f"Redis store {self.display_name!r}: {messages.ON_CLUSTER}.")
        index = scope_index(scope, self.prefix)
        keys, args = messages.releasing(keys, args, release, index, self.prefix)
        return messages.released(self._run(f"{name}_RELEASING", keys, args, bound), release)

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
        encoded = json.dumps(data, separators=(",", ":"))
        saved = bool(
            self._releasing(
                "RECOVERY_POINT",
                [self._key(pk)],
                [str(token), name, encoded, as_micros(lock_timeout)],
                deadlines.bound(lock_timeout) if bound is None else bound,
                release,
                self._records[pk][1],
            )
        )
        return saved  # lost (LockLost): the claim's release still comes, and its script refuses

    def unlock(
        self, pk: int, token: Any, *, connection: Any = None, bound: float | None = None
    ) -> bool:
        try:
            return bool(self._run("UNLOCK", [self._key(pk)], [str(token)], bound))
        finally:
            self._forget(pk)

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
            self._forget(pk)

    def renew(
        self,
        leases: Sequence[tuple[ClaimHandle, Any]],
        lock_timeout: timedelta,
        bound: float | None = None,
    ) -> set[tuple[ClaimHandle, Any]]:
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

    def census(self, stuck_after: timedelta = timedelta(hours=1)) -> dict[str, Any]:
        """The store's records by status, how many are processing with their lock lapsed,
        and its operations running and stuck (silent for ``stuck_after``)
        (:func:`.scans.census`)."""
        return scans.census(self.client, self.prefix, stuck_after)

    # -- a record as an operation (:mod:`.operations`) ---------------------------------------

    def _forget(self, pk: int) -> None:
        """The claim's writes are over: its record is no longer this process's."""
        self._records.pop(pk, None)
        self._oids.pop(pk, None)
        self._named.discard(pk)

    def operation_name(self, pk: int) -> str:
        """What a live claim's operation id is made of (:func:`.names.name`), its index
        written first: the id handed out names the record from then on."""
        oid = self._oids.get(pk)
        if oid is None:  # the claim is over, or its record predates operation ids
            raise LookupError(f"No operation id for the claim {pk} of {self.display_name!r}.")
        if pk not in self._named:
            self._name_again(self._key(pk), oid)
            self._named.add(pk)
        return names.name(self.alias, oid)

    def found_operation(self, record: Any) -> tuple[int | str, datetime] | None:
        """The operation name and life of another call's record (a duplicate's ``202``), its
        index written; ``None``: the record is gone, or predates operation ids."""
        scope = record.scope
        key = record_key(scope, record.key_hash, self.prefix)
        try:
            oid, created, expires = self.client.hmget(key, "oid", "ca", "ea")
            if oid is None or created is None:
                return None
            fields = (created, expires, scope)
            operations.index(self.client, key, as_text(oid), self.prefix, fields)
        except failures() as exc:
            raise self.refusal(exc) from exc
        return names.name(self.alias, as_text(oid)), as_instant(created)

    def _name_again(self, key: str, oid: str) -> None:
        try:
            operations.index(self.client, key, oid, self.prefix)
        except failures() as exc:
            raise self.refusal(exc) from exc

    def read_operation(self, oid: int | str) -> Any:
        """Operation ``oid`` (:func:`.operations.read`); ``None``: no such operation."""
        try:
            return operations.read(self.client, self.alias, self.prefix, str(oid))
        except failures() as exc:
            raise self.refusal(exc) from exc

    def of_scopes(
        self, scopes: set[str], *, before: int | None, limit: int, state: str | None
    ) -> list[Any]:
        """The scopes' operations whose ids were handed out (:func:`.operations.listed`)."""
        try:
            return operations.listed(
                self.client, self.alias, self.prefix, scopes, before, limit, state
            )
        except failures() as exc:
            raise self.refusal(exc) from exc

    def stuck(self, older_than: timedelta) -> list[IdempotencyKey]:
        """Operations handed on with no word for ``older_than`` (:func:`.operations.stuck`)."""
        try:
            return operations.stuck(
                self.client, self.alias, self.prefix, as_micros(older_than), self.read
            )
        except failures() as exc:
            raise self.refusal(exc) from exc

    def complete_operation(self, operation: Any, stored: StoredResponse) -> bool:
        """Replace the operation's stored ``202`` by its final response, once
        (:data:`.operations.COMPLETE_OPERATION`); ``False``: it was not (any longer) one."""
        headers, body = stored.sealed
        oid = operation.pk.partition("-")[2]
        key = record_key(operation.scope, operation.key_hash, self.prefix)
        index = self._cluster is False
        reply = self._op(
            "COMPLETE_OPERATION",
            [key, scope_index(operation.scope, self.prefix)] if index else [key],
            [
                oid,
                microseconds(operation.created_at),
                rules.stored_status(stored.status),
                stored.status,
                json.dumps(headers, separators=(",", ":")),
                b"" if body is None else body,
                "0" if body is None else "1",
                "" if stored.ttl is None else as_micros(stored.ttl),
                operation.key_hash,
            ],
        )
        if not reply:
            return False
        if stored.ttl is not None:
            if not index:
                self._index(operation.scope, operation.key_hash, stored.ttl)
            try:
                fields = (microseconds(operation.created_at), int(reply), operation.scope)
                operations.index(self.client, key, oid, self.prefix, fields)
            except failures():
                logger.warning("Could not index a completed operation.", exc_info=True)
        return True

    def set_progress(self, operation: Any, name: str, data: Any) -> bool:
        """Set the operation's progress (its record's recovery point ``name``), fenced as
        :meth:`complete_operation` is."""
        reply = self._op(
            "OPERATION_PROGRESS",
            [record_key(operation.scope, operation.key_hash, self.prefix)],
            [
                operation.pk.partition("-")[2],
                microseconds(operation.created_at),
                name,
                json.dumps(data, separators=(",", ":")),
            ],
        )
        return bool(reply)

    def _op(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """An operation's write, tried once (applied with its reply lost, a second try would
        find it applied and say so: refused): a fault is :class:`StoreUnavailable`."""
        try:
            return self._run(name, keys, args, None, tries=1)
        except RedisFault as exc:
            raise self.refusal(exc) from exc

    # -- the outbox (:mod:`.outbox`): the relay's side -----------------------------------------

    def outbox_refusal(self) -> str | None:
        """Why the store cannot serve the outbox (a cluster: :mod:`.outbox`), or ``None``."""
        self.client  # noqa: B018 (made: its topology known)
        return messages.ON_CLUSTER if self._cluster else None

    def _relayed(self, name: str, keys: list[str], args: list[Any]) -> Any:
        return self._run(name, keys, args, None)

    def take(self, size: int, lease: timedelta) -> list[messages.Taken]:
        """Claim up to ``size`` messages due now for ``lease`` (a relay's batch)."""
        return messages.take(self._relayed, self.prefix, size, lease)

    def mark_sent(self, keys: Sequence[str], *, counted: bool) -> int:
        """Mark messages (their keys) sent."""
        return messages.mark_sent(self._relayed, self.prefix, keys, counted=counted)

    def mark_failed(self, key: str, error: str, retry_at: datetime | None, *, counted: bool) -> int:
        """Record a failed send: tried again at ``retry_at``, or failed for good (``None``)."""
        return messages.mark_failed(
            self._relayed, self.prefix, key, error, retry_at, counted=counted
        )

    def resend(self, keys: Sequence[str]) -> int:
        """Make failed messages pending and due now (``idempotency_relay --retry-failed``)."""
        return messages.resend(self._relayed, self.prefix, keys)

    def backlog(self) -> Backlog:
        """The outbox's pending and failed messages, and its oldest undelivered release."""
        try:
            return messages.backlog(self.client, self.prefix)
        except failures() as exc:
            raise self.refusal(exc) from exc

    def failed_messages(self) -> list[messages.FailedMessage]:
        """The messages failed for good, oldest release first (``--failed``)."""
        try:
            return messages.failed(self.client, self.prefix)
        except failures() as exc:
            raise self.refusal(exc) from exc

    def message_key(self, scope: str, key_hash: str, message_id: str) -> str:
        """The key of a message the record ``(scope, key_hash)`` released."""
        return messages.message_key(
            record_key(scope, key_hash, self.prefix), message_id, self.prefix
        )
