"""The Redis store: the same contract as the database's (SPEC sections 2 and 3) but atomic
mode, on one Redis server (a Sentinel's master) or a Redis Cluster, through the client of a
Django cache alias (Django's ``RedisCache``, django-redis) or one made from a URL.

It implements the store contract (:class:`.._store.contract.StoreContract`: the claim, fenced
writes, renewal, status poll), each a Lua script of :mod:`.scripts` run by :mod:`.running`; no
transaction is shared with the view's database, and it has no Django connection. The core's
``pk`` of a claim (its handle) is a number of this process (the claim's writes are always this
process's), mapped to the record's Redis key (:mod:`.handles`); a final write (the result, the
unlock, the release) spends it, whatever its outcome.

:class:`RedisStore` composes the parts that do the work, each one concern: the server and its
scripts' runs (:mod:`.server`), the claim and a record's reads (:mod:`.claiming`), the fenced
writes (:mod:`.fencing`), the operations it keeps (:mod:`.kept_operations`), the operators'
scans (:mod:`.scans`) and the outbox's relay side (:mod:`.outbox`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django_idempotency._conf.values import display_name, short_error
from django_idempotency._store.contract import (
    Backlog,
    ClaimHandle,
    Lock,
    StoreContract,
    StoredResponse,
    StoreFeatures,
    Taken,
)
from django_idempotency._store.redis import faults, outbox, outbox_marks, scans
from django_idempotency._store.redis.claiming import Claims
from django_idempotency._store.redis.faults import RedisFault, refused
from django_idempotency._store.redis.fencing import FencedWrites
from django_idempotency._store.redis.handles import Handles
from django_idempotency._store.redis.kept_operations import KeptOperations
from django_idempotency._store.redis.keyspace import record_key
from django_idempotency._store.redis.outbox_slots import SlotIndex
from django_idempotency._store.redis.server import Server
from django_idempotency._store.redis.urls import (
    cache_options,
    option_values,
    redis_options,
    redis_path,
    redis_places,
    unambiguous,
    unknown_options,
)
from django_idempotency.models import IdempotencyKey


class RedisStore(StoreContract):
    """The store of one Redis server (see the module's docstring)."""

    vendor = "redis"
    name = "Redis"
    #: A script is tried again within its bound (:mod:`.running`): an owner's result write is
    #: given what its lock has left (:func:`django_idempotency._call.fencing.fenced_write`).
    #: Writers do not take one lock in turn: a renewal is cut to a share of the time left
    #: (:func:`django_idempotency._call.heartbeat.renewal_bound`), as on a database server. No
    #: transaction is shared with the view's database, and no atomic mode.
    features = StoreFeatures(rides_out_faults=True)
    expiry = "its records expire by Redis's own TTL"
    stats_group = "redis_stores"

    @classmethod
    def open(cls, alias: str) -> RedisStore:
        """The store of a cache alias's (``cache:<alias>``) or a URL's Redis."""
        from django_idempotency._conf.settings import conf
        from django_idempotency._store import using

        # A database error of the project's code (the scope function reading the user) is
        # the app's database's store's to judge.
        def judge(exc: BaseException) -> bool:
            return using(conf.DATABASE_ALIAS).is_transient(exc)

        return cls(alias, judge)

    @classmethod
    def validate(cls, value: str, name: str) -> None:
        """Refuse a Redis store without the redis package, and a URL whose port is not a
        number, whose password's ``/`` reads as another host to redis-py, or with an option
        redis-py cannot read (``db=x``), takes nowhere (a typo) or refuses when it connects
        (``protocol=9``), or a path that is no database number; and a cache alias's
        ``OPTIONS`` that can never work (:func:`.urls.cache_options`): at startup, not per
        call."""
        if importlib.util.find_spec("redis") is None:
            raise ValueError(
                f"{name} {display_name(value)!r} is a Redis store, but the redis package is not "
                "installed: pip install 'django-idempotency[redis]'."
            )
        if "://" not in value:  # a CACHES alias: its backend is Redis's (the registry says)
            cache_options(value)
            return
        if not value.startswith("unix://"):
            redis_places(value, 6379)
        unambiguous(value)
        redis_path(value)
        options = redis_options(value)
        unknown_options(value, options)
        option_values(value, options)

    def __init__(self, alias: str, judge: Callable[[BaseException], bool]) -> None:
        self.alias = alias
        #: Whether a database error of the project's code is transient: the app's database's
        #: store says (given by the registry, which knows the database's stores).
        self._judge = judge
        self._server = Server(alias)
        #: This process's live claims, by their handles.
        self._handles = Handles()
        shown = display_name(alias)
        self._claims = Claims(self._server, self._handles, self.refusal)
        self._writes = FencedWrites(self._server, self._handles, self.refusal, shown)
        self._operations = KeptOperations(self._writes, self.read, shown)
        #: The relay's view of a cluster's slot index (:mod:`.outbox_slots`).
        self._slots = SlotIndex()

    # -- what the core reads of every store --------------------------------------------------

    @property
    def prefix(self) -> str:
        """The prefix of the store's keys (:func:`.keyspace.key_prefix`), read once."""
        return self._server.prefix

    @property
    def client(self) -> Any:
        return self._server.client

    @property
    def bounds_each_call(self) -> bool:
        """Whether each call sets its own timeouts, on a connection of the store's own (a
        plain pool): read after :attr:`client`."""
        return self._server.wire.pool is not None

    def is_fault(self, exc: BaseException) -> bool:
        # Faults are ridden out inside each call (:mod:`.running`), within its bound: the
        # core's reconnection on a new Django connection has nothing to do here.
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

    def misconfigured(self, exc: BaseException) -> str | None:
        """A refusal of the store's credentials in ``exc`` (:func:`.faults.misconfigured`),
        in words without the password."""
        found = faults.misconfigured(exc)
        if found is None:
            return None
        return f"the server refuses its credentials ({short_error(found, self.alias)})"

    # -- the claim and a record's reads (:mod:`.claiming`) ------------------------------------

    def claim(
        self,
        identity: Any,
        *,
        ttl: timedelta,
        lock_timeout: timedelta,
        token: str | None = None,
        bound: float | None = None,
    ) -> Any:
        return self._claims.claim(identity, ttl, lock_timeout, token, bound)

    def created_at(self, pk: int) -> datetime | None:
        """When a live claim's record began (:attr:`.Claim.life`, its operation id): it read
        the database's table by the cache alias's name, which is no database."""
        return self._claims.created_at(pk)

    def read(self, scope: str, key_hash: str) -> IdempotencyKey | None:
        """The key's record, as a claim that found it would read it (tests, operators)."""
        return self._claims.read(scope, key_hash)

    def expire(self, scope: str, key_hash: str) -> IdempotencyKey | None:
        """Expire the key's record now, as its TTL would: Redis deletes it
        (:func:`django_idempotency.testing.expire_key`). Returns it, expired now."""
        return self._claims.expire(scope, key_hash)

    def read_finished(self, identity: Any, bound: float) -> None:
        return None  # atomic mode only, which the Redis store refuses

    def peek_status(self, scope: str, key_hash: str, bound: float | None = None) -> Lock | None:
        return self._claims.peek_status(scope, key_hash, bound)

    # -- the fenced writes (:mod:`.fencing`) --------------------------------------------------

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
        return self._writes.store_response(pk, token, stored, bound, release)

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
        return self._writes.save_recovery_point(pk, token, name, data, lock_timeout, bound, release)

    def unlock(
        self, pk: int, token: Any, *, connection: Any = None, bound: float | None = None
    ) -> bool:
        return self._writes.final("UNLOCK", pk, token, bound)

    def release(
        self,
        pk: int,
        token: Any,
        *,
        stale_at: datetime | None = None,
        connection: Any = None,
        bound: float | None = None,
    ) -> bool:
        return self._writes.final("RELEASE", pk, token, bound)

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
        return self._writes.renew(leases, lock_timeout, bound)

    # -- the operators' records (:mod:`.scans`) -----------------------------------------------

    def release_stale(self, record: IdempotencyKey) -> bool:
        """Delete a stale record an operator read, fenced by its token and the server's clock
        (:data:`.scripts.STALE_RELEASE`)."""
        key = record_key(record.scope, record.key_hash, self.prefix)
        with self.guard():
            return record.lock_token is not None and self._writes.release_stale(
                key, record.lock_token
            )

    def fail_stale(self, record: IdempotencyKey, stored: StoredResponse) -> bool:
        """Store an operator's failure in a stale record it read, fenced as
        :meth:`release_stale` (:data:`.scripts.STALE_FAIL`)."""
        key = record_key(record.scope, record.key_hash, self.prefix)
        with self.guard():
            return record.lock_token is not None and self._writes.fail_stale(
                key, record.scope, record.key_hash, record.lock_token, stored
            )

    def erase_scope(self, scope: str, *, dry_run: bool = False) -> tuple[int, int]:
        """Delete the scope's finished records now: (deleted, in progress)."""
        return scans.erase(self.client, self._erase, scope, self.prefix, dry_run)

    def _erase(self, key: str) -> Any:
        return self._server.run("ERASE", [key], [], None)

    def ping(self) -> None:
        """A ``PING`` on the store's client (made if need be: a cluster's, from its nodes).
        A database number above the server's ``databases`` is only the server's to tell (its
        ``SELECT`` refuses it): ``ImproperlyConfigured`` saying so, not "does not answer"."""
        import redis
        from django.core.exceptions import ImproperlyConfigured

        try:
            self.client.ping()
        except redis.ResponseError as exc:
            if "DB index is out of range" not in str(exc):
                raise
            pool = getattr(self.client, "connection_pool", None)
            db = getattr(pool, "connection_kwargs", {}).get("db", "?")
            raise ImproperlyConfigured(
                f"its server has no database {db} (its 'databases' setting is {db} or less)"
            ) from None

    def eviction_policies(self) -> dict[str, str]:
        """Each primary's ``maxmemory-policy`` (``CONFIG GET``: refused where renamed or
        forbidden to the store's user)."""
        return scans.eviction_policies(self.client)

    def unpersisted(self) -> list[str]:
        """The primaries without ``appendonly`` (``INFO persistence``)."""
        return scans.unpersisted(self.client)

    def unbounded_pool(self) -> str | None:
        """The client's pool, by its class's name, when its connections have no socket
        timeout and the store takes them call by call (Sentinel's, a blocking or a caching
        pool); ``None`` for a plain pool (each call sets its own timeouts) or a cluster's
        client (made with them), or a client that cannot be made (E060 or E062 says why)."""
        try:
            client = self.client
        except Exception:
            return None
        pool = getattr(client, "connection_pool", None)
        if self.bounds_each_call or pool is None:
            return None
        timeout = getattr(pool, "connection_kwargs", {}).get("socket_timeout")
        return None if timeout is not None else type(pool).__name__

    def count(self) -> int:
        """How many records the store holds (a ``SCAN`` of its prefix: an operator's figure)."""
        return scans.count(self.client, self.prefix)

    def records_of(self, key_hash: str) -> list[IdempotencyKey]:
        """The key's records in every scope (each read as :meth:`read` reads it, unsaved
        instances), oldest first: tests, operators."""
        return scans.key_records(self.client, self.prefix, key_hash, self.read)

    def browse(
        self, cursor: str, *, size: int, status: str | None = None
    ) -> tuple[list[IdempotencyKey], str | None]:
        """A page of the store's records by a ``SCAN`` cursor, a cluster's primaries in turn
        (:func:`.scans.browse`)."""
        with refused(self.refusal):
            return scans.browse(self.client, self.prefix, cursor, size, status)

    def census(self, stuck_after: timedelta = timedelta(hours=1)) -> dict[str, Any]:
        """The store's records by status, how many are processing with their lock lapsed,
        and its operations running and stuck (silent for ``stuck_after``)
        (:func:`.scans.census`)."""
        return scans.census(self.client, self.prefix, stuck_after)

    # -- a record as an operation (:mod:`.kept_operations`) -----------------------------------

    def operation_name(self, pk: int) -> str:
        return self._operations.operation_name(pk)

    def found_operation(self, record: Any) -> tuple[int | str, datetime] | None:
        return self._operations.found_operation(record)

    def read_operation(self, oid: int | str) -> Any:
        return self._operations.read_operation(oid)

    def of_scopes(
        self, scopes: set[str], *, before: int | None, limit: int, state: str | None
    ) -> list[Any]:
        return self._operations.of_scopes(scopes, before, limit, state)

    def stuck(self, older_than: timedelta) -> list[IdempotencyKey]:
        return self._operations.stuck(older_than)

    def complete_operation(self, operation: Any, stored: StoredResponse) -> bool:
        return self._operations.complete_operation(operation, stored)

    def set_progress(self, operation: Any, name: str, data: Any) -> bool:
        return self._operations.set_progress(operation, name, data)

    # -- the outbox (:mod:`.outbox`): the relay's side -----------------------------------------

    def outbox_refusal(self) -> str | None:
        """``None``: the store serves the outbox, on every topology. A client that cannot be
        made (a cluster's nodes down) is the store unavailable, as any call's fault is (the
        relay asks first: it says the store did not answer)."""
        with refused(self.refusal):
            self.client  # noqa: B018 (made: its topology known)
        return None

    def _relayed(self, name: str, keys: list[str], args: list[Any]) -> Any:
        return self._server.run(name, keys, args, None)

    @property
    def _cluster(self) -> bool:
        """Whether the store is a cluster's (its client made: its topology known)."""
        self.client  # noqa: B018
        return bool(self._server.cluster)

    def take(self, size: int, lease: timedelta) -> list[Taken]:
        """Claim up to ``size`` messages due now for ``lease`` (a relay's batch)."""
        with refused(self.refusal):
            index = self._slots if self._cluster else None
            return outbox.take(self._relayed, self.client, self.prefix, size, lease, index)

    def mark_sent(self, keys: Sequence[str], *, counted: bool) -> int:
        """Mark messages (their keys) sent."""
        return outbox_marks.mark_sent(
            self._relayed, self.client, self.prefix, keys, counted=counted, cluster=self._cluster
        )

    def mark_failed(self, key: str, error: str, retry_at: datetime | None, *, counted: bool) -> int:
        """Record a failed send: tried again at ``retry_at``, or failed for good (``None``)."""
        return outbox_marks.mark_failed(
            self._relayed, self.prefix, key, error, retry_at, counted=counted, cluster=self._cluster
        )

    def resend(self, keys: Sequence[str]) -> int:
        """Make failed messages pending and due now (``idempotency_relay --retry-failed``)."""
        return outbox_marks.resend(self._relayed, self.client, self.prefix, keys, self._cluster)

    def backlog(self) -> Backlog:
        """The outbox's pending and failed messages, and its oldest undelivered release."""
        with refused(self.refusal):
            return outbox.backlog(self._relayed, self.client, self.prefix, self._cluster)

    def failed_messages(self) -> list[outbox.FailedMessage]:
        """The messages failed for good, oldest release first (``--failed``)."""
        with refused(self.refusal):
            return outbox.failed(self._relayed, self.client, self.prefix, self._cluster)

    def message_key(self, scope: str, key_hash: str, message_id: str) -> str:
        """The key of a message the record ``(scope, key_hash)`` released."""
        return outbox.message_key(record_key(scope, key_hash, self.prefix), message_id, self.prefix)
