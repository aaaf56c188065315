"""The operators' statements: stale records, releasing or failing them, deleting expired ones.

The two commands and the admin actions all go through these functions, so there is one way to
do each thing. Every write is a short statement (or a short transaction) fenced like the
store's own writes: a record is only released or failed while it is still ``processing`` under
the same ``lock_token`` and its lock is still expired, so a record that a retry has just taken
over (or that its owner renewed) is left alone; and an expired record whose lock is still live
is never deleted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import OperationalError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Q, QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from django_idempotency import mysql, problems, store
from django_idempotency.models import IdempotencyKey
from django_idempotency.responses import StoredResponse
from django_idempotency.store import _prep

logger = logging.getLogger("django_idempotency")

PROCESSING = IdempotencyKey.Status.PROCESSING
FAILED = IdempotencyKey.Status.FAILED
_DEADLOCK_RETRIES = 5
_EXPIRES_INDEX = next(i.name for i in IdempotencyKey._meta.indexes if i.fields == ["expires_at"])


def stale(cutoff: datetime) -> Q:
    """Stuck in ``processing``, with a lock that expired by ``cutoff``."""
    return Q(status=PROCESSING, unlock_at__lte=cutoff)


def stale_records(alias: str, *, older_than: timedelta = timedelta(0)) -> QuerySet[IdempotencyKey]:
    """Records stuck in ``processing`` whose lock expired at least ``older_than`` ago."""
    cutoff = timezone.now() - older_than
    return IdempotencyKey.objects.using(alias).filter(stale(cutoff)).order_by("unlock_at", "pk")


def deletable(now: datetime) -> Q:
    """Expired, and not a ``processing`` record whose lock is still live (or has none)."""
    return Q(expires_at__lte=now) & (~Q(status=PROCESSING) | Q(unlock_at__lte=now))


def expired_records(alias: str, *, now: datetime | None = None) -> QuerySet[IdempotencyKey]:
    """The records :func:`delete_expired_batch` would delete."""
    return IdempotencyKey.objects.using(alias).filter(deletable(now or timezone.now()))


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
    )


@dataclass(frozen=True)
class Batch:
    """One batch of :func:`delete_expired_batch`."""

    deleted: int
    #: The largest ``expires_at`` seen: the next batch starts there (``None``: nothing left).
    last_expires_at: datetime | None


def delete_expired_batch(
    alias: str,
    *,
    now: datetime,
    batch_size: int,
    after: datetime | None = None,
    pks: list[int] | None = None,
) -> Batch:
    """Delete up to ``batch_size`` expired records in one short transaction of its own.

    The rows are picked by primary key on the ``expires_at`` index, from ``after`` on (so a long
    run does not rescan the dead rows it left behind), and on PostgreSQL locked with
    ``FOR UPDATE SKIP LOCKED``: two runs at once share the rows instead of waiting for each
    other, and a row a claim is rewriting right now is left for the next run. ``pks`` restricts
    the batch to those records (the admin's selection).

    On MySQL two runs' locks on the secondary indexes can still deadlock: InnoDB rolls the
    victim's batch back whole, and it is run again.
    """
    retries = _DEADLOCK_RETRIES
    while True:
        try:
            return _delete_expired_batch(alias, now, batch_size, after, pks)
        except OperationalError as exc:
            if not retries or mysql.error_code(exc) != mysql.DEADLOCK:
                raise
            retries -= 1


def _delete_expired_batch(
    alias: str, now: datetime, batch_size: int, after: datetime | None, pks: list[int] | None
) -> Batch:
    connection = connections[alias]
    q = connection.ops.quote_name
    table = q(IdempotencyKey._meta.db_table)
    db_now = _prep("expires_at", now, connection)
    where = f"{q('expires_at')} <= %s AND ({q('status')} <> %s OR {q('unlock_at')} <= %s)"
    where_params: list[Any] = [db_now, PROCESSING, db_now]
    if after is not None:
        where += f" AND {q('expires_at')} >= %s"
        where_params.append(_prep("expires_at", after, connection))
    if pks is not None:
        if not pks:
            return Batch(0, None)
        in_pks, in_params = _in_ids(connection, pks)
        where += f" AND {in_pks}"
        where_params += in_params
    hint = mysql.force_index(q(_EXPIRES_INDEX)) if connection.vendor == mysql.VENDOR else ""
    select = f"SELECT {q('id')}, {q('expires_at')} FROM {table}{hint} WHERE {where} "
    select += f"ORDER BY {q('expires_at')} LIMIT %s"
    if connection.features.has_select_for_update_skip_locked:
        select += " FOR UPDATE SKIP LOCKED"
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # The batch's commit need not wait for its WAL flush (nor make the claims' commits
            # queue behind it): a delete lost in a crash is redone by the next run, and a later
            # claim's synchronous commit flushes it anyway.
            cursor.execute("SET LOCAL synchronous_commit TO OFF")
            # One statement, and only a count and a timestamp back to Python.
            cursor.execute(
                f"WITH batch AS ({select}), gone AS (DELETE FROM {table} USING batch "
                f"WHERE {table}.{q('id')} = batch.{q('id')} RETURNING {table}.{q('expires_at')}) "
                f"SELECT count(*), max({q('expires_at')}) FROM gone",
                [*where_params, batch_size],
            )
            deleted, last = cursor.fetchone()
            return Batch(deleted, last) if deleted else Batch(0, None)
        cursor.execute(select, [*where_params, batch_size])
        rows = cursor.fetchall()
        if not rows:
            return Batch(0, None)
        deleted = 0
        ids = [row[0] for row in rows]
        for start in range(0, len(ids), 500):  # SQLite caps a statement's parameters
            in_ids, in_params = _in_ids(connection, ids[start : start + 500])
            if connection.vendor == mysql.VENDOR:  # the rows are locked: no second look
                cursor.execute(mysql.delete_locked_sql(table, q("id"), in_ids), in_params)
            else:
                cursor.execute(
                    f"DELETE FROM {table} WHERE {in_ids} AND {where}", [*in_params, *where_params]
                )
            deleted += cursor.rowcount
    last = max(row[1] for row in rows)
    if isinstance(last, str):  # SQLite may hand back the stored text
        last = parse_datetime(last)
    if settings.USE_TZ and timezone.is_naive(last):  # ... or a naive one, in its time zone
        last = timezone.make_aware(last, connection.timezone)
    return Batch(deleted, last)


def _in_ids(connection: BaseDatabaseWrapper, ids: list[int]) -> tuple[str, list[Any]]:
    column = connection.ops.quote_name("id")
    if connection.vendor == "postgresql":
        return f"{column} = ANY(%s)", [ids]
    return f"{column} IN ({', '.join(['%s'] * len(ids))})", list(ids)
