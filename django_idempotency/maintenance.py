"""The operators' statements: stale records, releasing or failing them, deleting expired ones,
and the counts of :func:`stats`.

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
from django.db import DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Count, Min, Q, QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from django_idempotency import problems, store
from django_idempotency.durations import human
from django_idempotency.models import IdempotencyKey
from django_idempotency.responses import StoredResponse
from django_idempotency.store import _prep

logger = logging.getLogger("django_idempotency")

PROCESSING = IdempotencyKey.Status.PROCESSING
FAILED = IdempotencyKey.Status.FAILED


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
    """
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
    select = f"SELECT {q('id')}, {q('expires_at')} FROM {table} WHERE {where} "
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


#: ``idempotency_cleanup --batch-size``'s default.
DEFAULT_BATCH_SIZE = 1000
#: Expired records one ``idempotency_cleanup`` run with the defaults (no ``--sleep``) is relied on
#: to delete in a minute: a default batch every 20 ms, the 50,000 rows per second that
#: ``docs/scale.rst`` sets as the cleanup's floor (it measured about 300,000 on PostgreSQL on two
#: cores, a batch's statement taking 2.6 ms at the median and 4.8 ms at p99; the floor leaves room
#: for a busy server, SQLite or MySQL). A backlog above it means cleanup is not running, or not
#: often enough.
CLEANUP_ROWS_PER_MINUTE = DEFAULT_BATCH_SIZE * 50 * 60


@dataclass(frozen=True)
class Stats:
    """The table's health, as ``idempotency_stats`` and the admin's list show it."""

    by_status: dict[str, int]
    #: What ``idempotency_cleanup`` would delete now.
    expired: int
    stale: int
    #: Since the oldest stale record's claim, and since the longest-expired lock (seconds).
    oldest_stale_age: float | None
    longest_stale_for: float | None
    #: Bytes on disk; ``None`` when the database does not say (``size_source`` says how).
    table_bytes: int | None
    index_bytes: int | None
    size_source: str

    @property
    def total(self) -> int:
        return sum(self.by_status.values())

    @property
    def warnings(self) -> list[str]:
        if self.expired <= CLEANUP_ROWS_PER_MINUTE:
            return []
        return [
            f"{self.expired:,} expired records are more than one idempotency_cleanup run deletes "
            f"in a minute ({CLEANUP_ROWS_PER_MINUTE:,} at the defaults): is it scheduled?"
        ]

    @property
    def stale_ages(self) -> str:
        """``oldest claimed 42m ago, stale for 41m``; empty when nothing is stale."""
        if self.oldest_stale_age is None or self.longest_stale_for is None:
            return ""
        return (
            f"oldest claimed {human(self.oldest_stale_age)} ago, "
            f"stale for {human(self.longest_stale_for)}"
        )

    @property
    def size(self) -> str:
        if self.table_bytes is None:
            return self.size_source
        text = f"table {_bytes(self.table_bytes)}"
        if self.index_bytes is not None:
            text += f", indexes {_bytes(self.index_bytes)}"
        return f"{text} ({self.size_source})"


def stats(alias: str) -> Stats:
    """Counts in one scan of the table (conditional aggregates), then its size on disk."""
    now = timezone.now()
    is_stale = stale(now)
    rows = (
        IdempotencyKey.objects.using(alias)
        .order_by()
        .values("status")
        .annotate(
            count=Count("pk"),
            expired=Count("pk", filter=deletable(now)),
            stale=Count("pk", filter=is_stale),
            oldest_claim=Min("created_at", filter=is_stale),
            oldest_unlock=Min("unlock_at", filter=is_stale),
        )
    )
    by_status = dict.fromkeys(IdempotencyKey.Status.values, 0)
    expired = stale_count = 0
    oldest_claim: datetime | None = None
    oldest_unlock: datetime | None = None
    for row in rows:
        by_status[row["status"]] = row["count"]
        expired += row["expired"]
        stale_count += row["stale"]
        oldest_claim = row["oldest_claim"] or oldest_claim  # only processing rows are stale
        oldest_unlock = row["oldest_unlock"] or oldest_unlock
    table_bytes, index_bytes, source = table_size(alias)
    return Stats(
        by_status=by_status,
        expired=expired,
        stale=stale_count,
        oldest_stale_age=_seconds_since(oldest_claim, now),
        longest_stale_for=_seconds_since(oldest_unlock, now),
        table_bytes=table_bytes,
        index_bytes=index_bytes,
        size_source=source,
    )


def _seconds_since(moment: datetime | None, now: datetime) -> float | None:
    return None if moment is None else round((now - moment).total_seconds(), 3)


def size_query(vendor: str, table: str) -> tuple[str, list[Any], str] | None:
    """The statement giving ``(table bytes, index bytes)`` on ``vendor``, its parameters and its
    name for the output; ``None`` where there is none (SQLite without ``dbstat``: see
    :func:`table_size`)."""
    if vendor == "postgresql":
        # The table's bytes include its TOAST (large bodies); the indexes are counted apart.
        return (
            "SELECT pg_total_relation_size(t) - pg_indexes_size(t), pg_indexes_size(t) "
            "FROM (SELECT %s::regclass AS t) AS target",
            [f'"{table}"'],
            "pg_total_relation_size, pg_indexes_size",
        )
    if vendor == "mysql":  # MySQL and MariaDB; InnoDB's figures are estimates
        return (
            "SELECT data_length, index_length FROM information_schema.TABLES "
            "WHERE table_schema = DATABASE() AND table_name = %s",
            [table],
            "information_schema.TABLES",
        )
    if vendor == "sqlite":
        # dbstat is a compile-time option of SQLite (on in most Python builds).
        return (
            "SELECT COALESCE(SUM(CASE WHEN name = %s THEN pgsize END), 0), "
            "COALESCE(SUM(CASE WHEN name <> %s THEN pgsize END), 0) FROM dbstat "
            "WHERE name IN (SELECT name FROM sqlite_master WHERE tbl_name = %s)",
            [table, table, table],
            "dbstat",
        )
    return None


def table_size(alias: str) -> tuple[int | None, int | None, str]:
    """``(table bytes, index bytes, how they were measured)``, ``None`` for what is unknown.

    SQLite without ``dbstat`` only knows the whole file's size (``page_count * page_size``):
    given as the table's, said so in the source, and the indexes are unknown.
    """
    connection = connections[alias]
    table = IdempotencyKey._meta.db_table
    query = size_query(connection.vendor, table)
    with connection.cursor() as cursor:
        if query is not None:
            sql, params, source = query
            try:
                with transaction.atomic(using=alias):  # a failure must not break the caller's
                    cursor.execute(sql, params)
                    row = cursor.fetchone()
            except DatabaseError:
                row = None
            if row is not None:
                return int(row[0]), int(row[1]), source
        if connection.vendor == "sqlite":
            cursor.execute("PRAGMA page_count")
            pages = cursor.fetchone()[0]
            cursor.execute("PRAGMA page_size")
            return pages * cursor.fetchone()[0], None, "page_count * page_size (the whole file)"
    return None, None, "unknown"


def _bytes(count: int) -> str:
    if count < 1024:
        return f"{count:,} bytes"
    value = count / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            break
        value /= 1024
    return f"{value:,.1f} {unit}"
