"""The operations the Redis store keeps itself (the database's are its table's rows): a
record's operation id handed out with its index written, another call's operation found, read
and listed (:mod:`.operations`), and its final response and progress written once, fenced by
its stored ``202``."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django_idempotency._base import rules
from django_idempotency._base.durations import microseconds
from django_idempotency._store.contract import StoredResponse
from django_idempotency._store.redis import names, operations
from django_idempotency._store.redis.codec import as_instant, as_micros, as_text
from django_idempotency._store.redis.faults import RedisFault, failures, refused
from django_idempotency._store.redis.fencing import FencedWrites
from django_idempotency._store.redis.keyspace import record_key, scope_index
from django_idempotency.models import IdempotencyKey

logger = logging.getLogger("django_idempotency")


class KeptOperations:
    """The operations of the records ``writes`` writes (its server, its live claims);
    ``read`` reads a record as the store does, ``shown`` is the store's display name."""

    def __init__(
        self,
        writes: FencedWrites,
        read: Callable[[str, str], IdempotencyKey | None],
        shown: str,
    ) -> None:
        self.writes = writes
        self.server = writes.server
        self.handles = writes.handles
        self.refusal = writes.refusal
        self.read = read
        self.shown = shown

    def operation_name(self, pk: int) -> str:
        """What a live claim's operation id is made of (:func:`.names.name`), its index
        written first: the id handed out names the record from then on."""
        oid = self.handles.oids.get(pk)
        if oid is None:  # the claim is over, or its record predates operation ids
            raise LookupError(f"No operation id for the claim {pk} of {self.shown!r}.")
        if pk not in self.handles.named:
            self.writes.name_again(self.handles.key(pk), oid)
            self.handles.named.add(pk)
        return names.name(self.server.alias, oid)

    def found_operation(self, record: Any) -> tuple[int | str, datetime] | None:
        """The operation name and life of another call's record (a duplicate's ``202``), its
        index written; ``None``: the record is gone, or predates operation ids."""
        prefix = self.server.prefix
        scope = record.scope
        key = record_key(scope, record.key_hash, prefix)
        with refused(self.refusal):
            oid, created, expires = self.server.client.hmget(key, "oid", "ca", "ea")
            if oid is None or created is None:
                return None
            fields = (created, expires, scope)
            operations.index(self.server.client, key, as_text(oid), prefix, fields)
        return names.name(self.server.alias, as_text(oid)), as_instant(created)

    def read_operation(self, oid: int | str) -> Any:
        """Operation ``oid`` (:func:`.operations.read`); ``None``: no such operation."""
        server = self.server
        with refused(self.refusal):
            return operations.read(server.client, server.alias, server.prefix, str(oid))

    def of_scopes(
        self, scopes: set[str], before: int | None, limit: int, state: str | None
    ) -> list[Any]:
        """The scopes' operations whose ids were handed out (:func:`.operations.listed`)."""
        server = self.server
        with refused(self.refusal):
            return operations.listed(
                server.client, server.alias, server.prefix, scopes, before, limit, state
            )

    def stuck(self, older_than: timedelta) -> list[IdempotencyKey]:
        """Operations handed on with no word for ``older_than`` (:func:`.operations.stuck`)."""
        server = self.server
        with refused(self.refusal):
            return operations.stuck(
                server.client, server.alias, server.prefix, as_micros(older_than), self.read
            )

    def complete_operation(self, operation: Any, stored: StoredResponse) -> bool:
        """Replace the operation's stored ``202`` by its final response, once
        (:data:`.operations.COMPLETE_OPERATION`); ``False``: it was not (any longer) one."""
        headers, body = stored.sealed
        oid = operation.pk.partition("-")[2]
        prefix = self.server.prefix
        key = record_key(operation.scope, operation.key_hash, prefix)
        index = self.server.cluster is False
        reply = self._once(
            "COMPLETE_OPERATION",
            [key, scope_index(operation.scope, prefix)] if index else [key],
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
                self.writes.index(operation.scope, operation.key_hash, stored.ttl)
            self._index_completed(operation, key, oid, int(reply))
        return True

    def _index_completed(self, operation: Any, key: str, oid: str, expires: int) -> None:
        """The completed operation's index, moved with its record's new expiry."""
        try:
            fields = (microseconds(operation.created_at), expires, operation.scope)
            operations.index(self.server.client, key, oid, self.server.prefix, fields)
        except failures():
            logger.warning("Could not index a completed operation.", exc_info=True)

    def set_progress(self, operation: Any, name: str, data: Any) -> bool:
        """Set the operation's progress (its record's recovery point ``name``), fenced as
        :meth:`complete_operation` is."""
        reply = self._once(
            "OPERATION_PROGRESS",
            [record_key(operation.scope, operation.key_hash, self.server.prefix)],
            [
                operation.pk.partition("-")[2],
                microseconds(operation.created_at),
                name,
                json.dumps(data, separators=(",", ":")),
            ],
        )
        return bool(reply)

    def _once(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """An operation's write, tried once (applied with its reply lost, a second try would
        find it applied and say so: refused): a fault is :class:`StoreUnavailable`."""
        try:
            return self.server.run(name, keys, args, None, tries=1)
        except RedisFault as exc:
            raise self.refusal(exc) from exc
