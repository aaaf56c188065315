"""The operators' actions: stale records, releasing or failing them, deleting expired ones.

The two commands and the admin actions all go through these functions, so there is one way to
do each thing; the statements are the store's. Every write is fenced like an attempt's own: a
record is only released or failed while it is still ``processing`` under the same
``lock_token`` and its lock is still expired, so a record that a retry has just taken over (or
that its owner renewed) is left alone; and an expired record whose lock is still live is never
deleted.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import connections
from django.db.models import Q, QuerySet
from django.utils import timezone

from django_idempotency import _rules as rules
from django_idempotency import _store as store
from django_idempotency import _telemetry as telemetry
from django_idempotency import problems
from django_idempotency._store import Batch, StoredResponse
from django_idempotency.models import IdempotencyKey

__all__ = [
    "Batch",
    "deletable",
    "delete_expired_batch",
    "expired_records",
    "mark_failed",
    "release",
    "stale",
    "stale_records",
]

logger = logging.getLogger("django_idempotency")


def stale(cutoff: datetime) -> Q:
    """:data:`~django_idempotency._rules.STALE` by ``cutoff``, for a queryset."""
    return rules.STALE.filter(cutoff)


def deletable(now: datetime) -> Q:
    """:data:`~django_idempotency._rules.DELETABLE` at ``now``, for a queryset."""
    return rules.DELETABLE.filter(now)


def stale_records(alias: str, *, older_than: timedelta = timedelta(0)) -> QuerySet[IdempotencyKey]:
    """Records stuck in ``processing`` whose lock expired at least ``older_than`` ago."""
    connection = connections[alias]
    return store.for_connection(connection).stale_records(connection, older_than=older_than)


def expired_records(alias: str, *, now: datetime | None = None) -> QuerySet[IdempotencyKey]:
    """The records :func:`delete_expired_batch` would delete."""
    connection = connections[alias]
    return store.for_connection(connection).expired_records(connection, now=now or timezone.now())


def delete_expired_batch(
    alias: str,
    *,
    now: datetime,
    batch_size: int,
    after: datetime | None = None,
    pks: list[int] | None = None,
) -> Batch:
    """Delete up to ``batch_size`` expired records in one short transaction of its own
    (:meth:`.Store.delete_expired_batch`)."""
    connection = connections[alias]
    return store.for_connection(connection).delete_expired_batch(
        connection, now=now, batch_size=batch_size, after=after, pks=pks
    )


def release(alias: str, record: IdempotencyKey) -> bool:
    """Delete a stale record so the client's retry claims it afresh and runs the view again.

    ``False`` when the record is gone, was taken over, or its lock was renewed meanwhile.
    """
    released = record.lock_token is not None and store.release(
        alias, record.pk, record.lock_token, stale_at=timezone.now()
    )
    if released:
        _log_resolved("Released", record)
    return released


def _abandoned_response() -> StoredResponse:
    """What :func:`mark_failed` stores."""
    response = problems.request_abandoned()
    return StoredResponse(
        response.status_code, [["Content-Type", problems.CONTENT_TYPE]], response.content
    )


def mark_failed(alias: str, record: IdempotencyKey) -> bool:
    """Give a stale record a definite stored failure: retries replay it and never run again.

    ``False`` when the record is gone, was taken over, or its lock was renewed meanwhile.
    """
    failed = record.lock_token is not None and store.store_response(
        alias, record.pk, record.lock_token, _abandoned_response(), stale_at=timezone.now()
    )
    if failed:
        _log_resolved("Marked as failed", record)
    return failed


def _log_resolved(action: str, record: IdempotencyKey) -> None:
    logger.warning(
        "%s stale idempotency record %s (scope %r, key %s).",
        action,
        record.pk,
        record.scope,
        record.key_hash[:12],
        extra=telemetry.log_facts(
            "recovered", record.key_hash, record.scope, record.attempt, record.lock_token
        ),
    )
