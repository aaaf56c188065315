"""A record as an operation (issue 43): the status endpoint's read by primary key, and the
operation's final response written once.

An operation is running while its record is ``processing`` (the request itself runs), or
finished with a stored ``202 Accepted`` (the view handed the work on); its final response
replaces the ``202`` once, in one statement whose condition is that ``202``: two concurrent
completions (a redelivered task) cannot both apply, and a final response is never a ``202``
(:func:`complete` refuses one), so no column marks it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone

from django_idempotency._base import rules
from django_idempotency._store import using
from django_idempotency._store.writes import COMPLETED, FAILED, StoredResponse
from django_idempotency.models import IdempotencyKey

__all__ = ["ACCEPTED", "Operation", "complete", "created_at", "read"]

#: The status of a stored response that hands the work on: its operation is still running.
ACCEPTED = 202

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
)


@dataclass(frozen=True)
class Operation:
    """What the status endpoint and ``complete_operation()`` read of a record."""

    pk: int
    scope: str
    key_hash: str
    status: str
    response_status: int | None
    response_headers: Any
    response_body: bytes | None
    created_at: datetime
    expires_at: datetime
    unlock_at: datetime | None = None

    @property
    def running(self) -> bool:
        """Its request still runs, or it answered ``202`` and the work goes on elsewhere."""
        return self.status == rules.PROCESSING or self.response_status == ACCEPTED

    def stalled(self, now: datetime) -> bool:
        """Its request's owner is gone: the record is stale (its lock lapsed, no attempt holds
        it), so it never finishes unless the original request is retried, which resumes it."""
        return rules.STALE.holds(self, now)

    def expired(self, now: datetime) -> bool:
        return self.expires_at <= now


def read(alias: str, pk: int) -> Operation | None:
    """Record ``pk``'s operation: one read by primary key; ``None``: no such record.
    Raises :class:`~django_idempotency.StoreUnavailable` on a database fault."""
    store = using(alias)
    with store.guard():
        row = IdempotencyKey.objects.using(alias).filter(pk=pk).values_list(*_FIELDS).first()
    if row is None:
        return None
    scope, key_hash, status, response_status, headers, body, created_at, expires_at, unlock = row
    if isinstance(body, memoryview):
        body = bytes(body)
    return Operation(
        pk, scope, key_hash, status, response_status, headers, body, created_at, expires_at, unlock
    )


def created_at(alias: str, pk: int) -> datetime | None:
    """When record ``pk``'s life began (:attr:`.Claim.created_at`; ``None``: no such record):
    read on the claim's own connection, so atomic mode's uncommitted record is found too."""
    store = using(alias)
    with store.guard():
        value = IdempotencyKey.objects.using(alias).filter(pk=pk).values_list("created_at").first()
    return None if value is None else value[0]


def complete(alias: str, operation: Operation, stored: StoredResponse) -> bool:
    """Replace the operation's stored ``202`` by its final response, once; ``False``: it was
    not (any longer) a ``202`` of an unexpired record (the caller reads it again to say why).

    The same values as a view's result write (:class:`StoredResponse`: sealed, compressed,
    encrypted), fenced by the ``202`` and the expiry instead of a lock token, which the task
    finishing the work does not hold.
    """
    now = timezone.now()
    changes: dict[str, Any] = {
        "status": COMPLETED if stored.status is None or stored.status < 400 else FAILED,
        "response_status": stored.status,
        "response_headers": stored.sealed[0],
        "response_body": stored.sealed[1],
        "updated_at": now,
    }
    if stored.ttl is not None:
        changes["expires_at"] = now + stored.ttl
    store = using(alias)
    with store.guard():
        updated = (
            IdempotencyKey.objects.using(alias)
            .filter(
                pk=operation.pk,
                scope=operation.scope,
                key_hash=operation.key_hash,
                created_at=operation.created_at,  # this life of the record, not a later one
                status=COMPLETED,
                response_status=ACCEPTED,
                expires_at__gt=now,
            )
            .update(**changes)
        )
    return bool(updated)
