"""The claim (:data:`.scripts.CLAIM`) and the reads of one record: as a claim that found it
would read it, its life's start, its status polled by a waiter, and its expiry now (tests)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from django_idempotency._store import deadlines
from django_idempotency._store.claims import new_token
from django_idempotency._store.contract import Lock
from django_idempotency._store.redis import codec, names, scripts
from django_idempotency._store.redis.codec import as_micros, as_text, as_time
from django_idempotency._store.redis.faults import RedisFault, refused
from django_idempotency._store.redis.handles import Handles
from django_idempotency._store.redis.keyspace import record_key
from django_idempotency._store.redis.server import Server
from django_idempotency._store.rows import Record
from django_idempotency.models import IdempotencyKey

logger = logging.getLogger("django_idempotency")

#: How many times a claim is sent when it meets a fault (its reply lost: the second finds the
#: first's record by its token).
_CLAIM_TRIES = 2


class Claims:
    """The claims and record reads of a store's ``server``, its live claims in ``handles``;
    ``refusal`` makes a failure the error the core raises (the store's
    :meth:`~.contract.StoreContract.refusal`)."""

    def __init__(
        self, server: Server, handles: Handles, refusal: Callable[[BaseException], Exception]
    ) -> None:
        self.server = server
        self.handles = handles
        self.refusal = refusal

    def claim(
        self,
        identity: Any,
        ttl: timedelta,
        lock_timeout: timedelta,
        token: str | None,
        bound: float | None,
    ) -> Any:
        """The store's :meth:`~.contract.StoreContract.claim`."""
        started = time.monotonic()
        token = token or new_token()
        key = record_key(identity.scope, identity.key_hash, self.server.prefix)
        if bound is None:
            bound = deadlines.bound(lock_timeout)
        try:
            reply = self.server.run(
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
        # The record's operation id (the reply's last) is absent on a record of an older version.
        oid = as_text(reply[-1]) if reply[-1] else None
        pk = self.handles.new(key, identity.scope, identity.key_hash, oid)
        return identity.claimed(
            pk=pk,
            token_text=token,
            attempt=attempt,
            recovery_point=point,
            recovery_data=data,
            alias=self.server.alias,
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
            self.server.run("UNLOCK", [key], [token], bound, tries=1)
        except RedisFault:
            logger.warning("Could not let go of an unacknowledged claim's lock.", exc_info=True)

    def created_at(self, pk: int) -> datetime | None:
        """The store's :meth:`~.contract.StoreContract.created_at`."""
        import redis

        entry = self.handles.records.get(pk)
        if entry is None:
            return None
        try:
            return as_time(self.server.client.hget(entry[0], "ca"))
        except redis.RedisError as exc:
            raise self.refusal(exc) from exc

    def read(self, scope: str, key_hash: str) -> IdempotencyKey | None:
        """The key's record, as a claim that found it would read it (tests, operators)."""
        key = record_key(scope, key_hash, self.server.prefix)
        with refused(self.refusal):
            values = self.server.client.hmget(key, *scripts.FIELDS)
            now = self.server.client.time()
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
            self.server.client.delete(record_key(scope, key_hash, self.server.prefix))
            record.expires_at = timezone.now()  # as the database's expire_key leaves it
        return record

    def peek_status(self, scope: str, key_hash: str, bound: float | None) -> Lock | None:
        """The store's :meth:`~.contract.StoreContract.peek_status`."""
        key = record_key(scope, key_hash, self.server.prefix)
        wire = self.server.wire
        with refused(self.refusal):
            client = self.server.client  # made first: the pool is known then
            if wire.pool is not None:
                seconds = deadlines.LEAST if bound is None else bound
                (reply,) = wire.exchange([("HMGET", key, "st", "ua")], seconds, "HMGET")
                if isinstance(reply, Exception):
                    raise reply
                status, unlock = reply
            else:
                status, unlock = client.hmget(key, "st", "ua")
        if status is None:
            return None
        return Lock(as_text(status), as_time(unlock))
