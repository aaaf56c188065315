"""A database record as an operation (:mod:`.operations`), as the store contract offers it
(:class:`~.contract.StoreContract`): read by primary key, listed by scope, its final response
and its progress written in one statement each, fenced by its stored ``202`` of this life.

An operation's name is its record's primary key, which its id's MAC covers; its state is
:mod:`.operation_states`' filter.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from django_idempotency._base import rules
from django_idempotency._store.bound import BoundStore
from django_idempotency._store.contract import ClaimHandle, Operation, StoredResponse
from django_idempotency._store.operation_states import state_filter
from django_idempotency._store.writes import COMPLETED
from django_idempotency.models import IdempotencyKey

#: The status of a stored response that hands the work on (:data:`.operations.ACCEPTED`).
_ACCEPTED = 202

#: The columns an operation reads, in :class:`~.operations.Operation`'s order after ``pk``.
_FIELDS = (
    "scope",
    "key_hash",
    "status",
    "response_status",
    "response_headers",
    "response_body",
    "created_at",
    "expires_at",
    "unlock_at",
    "recovery_point",
    "recovery_data",
)


class TableOperations(BoundStore):
    """The operations of the table's records (see the module's docstring)."""

    def operation_name(self, pk: ClaimHandle) -> int | str:
        """A claim's record's primary key."""
        return pk

    def found_operation(self, record: Any) -> tuple[int | str, datetime] | None:
        """The record's primary key and life, as its claim read them (no statement)."""
        if record.pk is None:
            return None
        return record.pk, record.created_at

    def read_operation(self, name: int | str) -> Operation | None:
        """Record ``name``'s operation: one read by primary key; ``None``: no such record.
        Raises :class:`~django_idempotency.StoreUnavailable` on a database fault."""
        with self.guard():
            row = self._records().filter(pk=name).values_list(*_FIELDS).first()
        if row is None:
            return None
        return _operation(self.alias, name, list(row))

    def of_scopes(
        self, scopes: set[str], *, before: int | None, limit: int, state: str | None
    ) -> list[Operation]:
        """One indexed read of the scopes' records (the unique index's ``scope`` prefix),
        those with a primary key under ``before``."""
        now = timezone.now()
        records = self._records().filter(scope__in=scopes, expires_at__gt=now)
        if before is not None:
            records = records.filter(pk__lt=before)
        if state is not None:
            records = records.filter(state_filter(state, now))
        with self.guard():
            rows = list(records.order_by("-pk").values_list("pk", *_FIELDS)[:limit])
        return [_operation(self.alias, pk, row) for pk, *row in rows]

    def stuck(self, older_than: timedelta) -> QuerySet[IdempotencyKey]:
        """The records whose ``202`` is stored, unexpired, not updated for ``older_than``."""
        now = timezone.now()
        return (
            self._records()
            .filter(
                status=COMPLETED,
                response_status=_ACCEPTED,
                expires_at__gt=now,
                updated_at__lte=now - older_than,
            )
            .order_by("updated_at", "pk")
        )

    def complete_operation(self, operation: Operation, stored: StoredResponse) -> bool:
        """The same values as a view's result write (sealed, compressed, encrypted), fenced by
        the ``202`` and the expiry instead of a lock token, which the task finishing the work
        does not hold: one ``UPDATE``."""
        now = timezone.now()
        changes: dict[str, Any] = {
            "status": rules.stored_status(stored.status),
            "response_status": stored.status,
            "response_headers": stored.sealed[0],
            "response_body": stored.sealed[1],
            "updated_at": now,
        }
        if stored.ttl is not None:
            changes["expires_at"] = now + stored.ttl
        with self.guard():
            updated = self._handed_on(operation, now).update(**changes)
        return bool(updated)

    def set_progress(self, operation: Operation, name: str, data: Any) -> bool:
        """One ``UPDATE`` fenced as :meth:`complete_operation`'s; ``updated_at`` moves with
        it: an operation that reports progress is not stuck."""
        now = timezone.now()
        with self.guard():
            updated = self._handed_on(operation, now).update(
                recovery_point=name, recovery_data=data, updated_at=now
            )
        return bool(updated)

    def _records(self) -> QuerySet[IdempotencyKey]:
        return IdempotencyKey.objects.using(self.alias)

    def _handed_on(self, operation: Operation, now: datetime) -> QuerySet[IdempotencyKey]:
        return self._records().filter(
            pk=operation.pk,
            scope=operation.scope,
            key_hash=operation.key_hash,
            created_at=operation.created_at,  # this life of the record, not a later one
            status=COMPLETED,
            response_status=_ACCEPTED,
            expires_at__gt=now,
        )


def _operation(alias: str, pk: int | str, row: list[Any]) -> Operation:
    """A row read (:data:`_FIELDS`) as its operation, its body as bytes."""
    if isinstance(row[5], memoryview):
        row[5] = bytes(row[5])
    values: tuple[Any, ...] = (pk, *row, alias)
    return Operation(*values)
