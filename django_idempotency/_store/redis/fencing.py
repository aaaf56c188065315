"""A live claim's writes, each a script fenced by its token (:mod:`.scripts`): the result (with
the outbox's messages it releases, :mod:`.outbox`), a recovery point, the unlock, the release,
and many locks renewed at once (:mod:`.renewal`); and the indexes a write moves with it."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from django_idempotency._base import rules
from django_idempotency._store import deadlines
from django_idempotency._store.claims import new_token
from django_idempotency._store.contract import ClaimHandle, StoredResponse
from django_idempotency._store.outbox import Release
from django_idempotency._store.redis import operations, outbox, outbox_slots, renewal
from django_idempotency._store.redis.codec import as_micros
from django_idempotency._store.redis.faults import RedisFault, failures, refused
from django_idempotency._store.redis.handles import Handles
from django_idempotency._store.redis.keyspace import scope_index
from django_idempotency._store.redis.server import Server

logger = logging.getLogger("django_idempotency")


class FencedWrites:
    """The fenced writes of the live claims in ``handles`` on ``server``; ``refusal`` and
    ``shown`` are the store's (:meth:`~.contract.StoreContract.refusal`, its display name)."""

    def __init__(
        self,
        server: Server,
        handles: Handles,
        refusal: Callable[[BaseException], Exception],
        shown: str,
    ) -> None:
        self.server = server
        self.handles = handles
        self.refusal = refusal
        self.shown = shown
        #: The writers' additions to the relay's slot index (:mod:`.outbox_slots`).
        self.slot_index = outbox_slots.WriterIndex()

    def store_response(
        self, pk: int, token: Any, stored: StoredResponse, bound: float | None, release: Any
    ) -> bool:
        """The store's :meth:`~.contract.StoreContract.store_response`."""
        key, scope, key_hash = self.handles.records[pk]
        index = self.server.cluster is False
        done = self.releasing(
            "COMPLETE",
            [key, scope_index(scope, self.server.prefix)] if index else [key],
            _result_args(token, stored, key_hash),
            bound,
            release,
            scope,
        )
        if done and not index:
            self.index(scope, key_hash, stored.ttl)
        if done and pk in self.handles.named:  # its expiry may have moved: its index's with it
            self.name_again(key, self.handles.oids[pk])
        self.handles.forget(pk)
        return bool(done)

    def release_stale(self, key: str, token: Any) -> bool:
        """An operator's release of the stale record ``key`` (:data:`.scripts.STALE_RELEASE`)."""
        return bool(self.server.run("STALE_RELEASE", [key], [str(token)], None))

    def fail_stale(
        self, key: str, scope: str, key_hash: str, token: Any, stored: StoredResponse
    ) -> bool:
        """An operator's failure of the stale record ``key`` (:data:`.scripts.STALE_FAIL`):
        its token becomes the operator's own, so its owner's result write is refused."""
        index = self.server.cluster is False
        done = self.server.run(
            "STALE_FAIL",
            [key, scope_index(scope, self.server.prefix)] if index else [key],
            [*_result_args(token, stored, key_hash), new_token()],
            None,
        )
        if done and not index:
            self.index(scope, key_hash, stored.ttl)
        return bool(done)

    def releasing(
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
        exactly when the write applied. On a cluster into the record's slot's queues, by the
        write's variant without the scope's index (``SLOT_``: written after, another slot's),
        and the slot's tag added to the relay's index after it (:mod:`.outbox_slots`)."""
        if release is None:
            return self.server.run(name, keys, args, bound)
        cluster = bool(self.server.cluster)
        index = scope_index(scope, self.server.prefix)
        keys, args = outbox.releasing(keys, args, release, index, self.server.prefix, cluster)
        script = f"{'SLOT_' if cluster else ''}{name}_RELEASING"
        done = outbox.released(self.server.run(script, keys, args, bound), release)
        # Its slot indexed for the relay; also when the write was applied already (2): its
        # first try's reply lost, that try added no tag.
        if cluster and done in (1, 2) and release.messages:
            tag = outbox_slots.slot_tag(keys[0])
            self.slot_index.add(self.server.client, self.server.prefix, tag)
        return done

    def index(self, scope: str, key_hash: str, ttl: timedelta | None) -> None:
        """On a cluster: add a finished record to its scope's index (erasure), after its
        script; the index forgets records past their expiry, and expires after the last."""
        from django_idempotency._conf.settings import conf

        lasts = ttl or conf.TTL
        now = time.time()
        index = scope_index(scope, self.server.prefix)
        try:
            pipe = self.server.client.pipeline(transaction=False)
            pipe.zadd(index, {key_hash: now + lasts.total_seconds()})
            pipe.zremrangebyscore(index, "-inf", now)
            pipe.expire(index, int(lasts.total_seconds()) + 1, gt=True)
            pipe.expire(index, int(lasts.total_seconds()) + 1, nx=True)
            pipe.execute()
        except Exception:  # the result is stored: only erasure would miss it
            logger.warning("Could not index an idempotency record for erasure.", exc_info=True)

    def name_again(self, key: str, oid: str) -> None:
        """Write the index of operation ``oid`` (record ``key``) again, or first
        (:func:`.operations.index`)."""
        with refused(self.refusal):
            operations.index(self.server.client, key, oid, self.server.prefix)

    def save_recovery_point(
        self,
        pk: int,
        token: Any,
        name: str,
        data: Any,
        lock_timeout: timedelta,
        bound: float | None,
        release: Any,
    ) -> bool:
        """The store's :meth:`~.contract.StoreContract.save_recovery_point`."""
        encoded = json.dumps(data, separators=(",", ":"))
        saved = bool(
            self.releasing(
                "RECOVERY_POINT",
                [self.handles.key(pk)],
                [str(token), name, encoded, as_micros(lock_timeout)],
                deadlines.bound(lock_timeout) if bound is None else bound,
                release,
                self.handles.records[pk][1],
            )
        )
        return saved  # lost (LockLost): the claim's release still comes, and its script refuses

    def final(self, name: str, pk: int, token: Any, bound: float | None) -> bool:
        """The unlock or the release (``name``, a script taking the token alone): it spends
        the claim's handle, whatever its outcome."""
        try:
            return bool(self.server.run(name, [self.handles.key(pk)], [str(token)], bound))
        finally:
            self.handles.forget(pk)

    def renew(
        self,
        leases: Sequence[tuple[ClaimHandle, Any]],
        lock_timeout: timedelta,
        bound: float | None,
    ) -> set[tuple[ClaimHandle, Any]]:
        """The store's :meth:`~.contract.StoreContract.renew` (see :mod:`.renewal`)."""
        known = [(pk, token) for pk, token in leases if pk in self.handles.records]
        if not known:
            return set()
        lock = as_micros(lock_timeout)
        seconds = deadlines.bound(lock_timeout) if bound is None else bound
        server = self.server
        try:
            script = server.script("RENEW")
            locks = [(pk, token, self.handles.key(pk)) for pk, token in known]
            if server.wire.pool is not None:
                results = renewal.bounded(server.wire, script, locks, lock, seconds)
            elif server.cluster:
                return renewal.on_cluster(
                    server.client, server.wire, script, locks, lock, seconds, self.shown
                )
            else:
                results = renewal.pipelined(server.client, script, locks, lock)
        except failures() as exc:
            raise RedisFault(f"Redis store {self.shown!r}: {exc}") from exc
        # A lock found lost keeps its record's entry: the owner's result write or release still
        # comes, and its script refuses it (without the entry, that write would be an error).
        return {lease for lease, result in zip(known, results, strict=True) if result}


def _result_args(token: Any, stored: StoredResponse, key_hash: str) -> list[Any]:
    """A result write's ARGV (:data:`.scripts.COMPLETE`'s)."""
    headers, body = stored.sealed
    return [
        str(token),
        rules.stored_status(stored.status),
        "" if stored.status is None else stored.status,
        json.dumps(headers, separators=(",", ":")),
        b"" if body is None else body,
        "0" if body is None else "1",
        "" if stored.ttl is None else as_micros(stored.ttl),
        key_hash,
    ]
