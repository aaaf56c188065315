"""The operators' actions: releasing or failing stale records, and the counts of :func:`stats`.

The two commands and the admin actions all go through these functions, and read and delete
through the store's queries (:class:`~django_idempotency._store.maintenance.Maintenance`), so
there is one way to do each thing. Every write is fenced like an attempt's own: a
record is only released or failed while it is still ``processing`` under the same
``lock_token`` and its lock is still expired, so a record that a retry has just taken over (or
that its owner renewed) is left alone; and an expired record whose lock is still live is never
deleted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Min, Q
from django.utils import timezone

from django_idempotency import _store as store
from django_idempotency._base import rules
from django_idempotency._base.durations import human
from django_idempotency._call import telemetry
from django_idempotency._http import problems
from django_idempotency._store import StoredResponse
from django_idempotency._store.operations import ACCEPTED
from django_idempotency.models import IdempotencyKey

__all__ = ["Deletion", "Stats", "delete_expired", "in_batches", "mark_failed", "release", "stats"]

logger = logging.getLogger("django_idempotency")


def release(alias: str, record: IdempotencyKey) -> bool:
    """Delete a stale record so the client's retry claims it afresh and runs the view again.

    ``False`` when the record is gone, was taken over, or its lock was renewed meanwhile.
    """
    released = store.using(alias).release_stale(record)
    if released:
        _log_resolved("Released", record)
    return released


def _abandoned_response(record: IdempotencyKey) -> StoredResponse:
    """What :func:`mark_failed` stores in ``record``."""
    response = problems.request_abandoned()
    return StoredResponse(
        response.status_code,
        [["Content-Type", problems.CONTENT_TYPE]],
        response.content,
        owner=(record.scope, record.key_hash),
    )


def mark_failed(alias: str, record: IdempotencyKey) -> bool:
    """Give a stale record a definite stored failure: retries replay it and never run again.

    ``False`` when the record is gone, was taken over, or its lock was renewed meanwhile.
    """
    failed = store.using(alias).fail_stale(record, _abandoned_response(record))
    if failed:
        _log_resolved("Marked as failed", record)
    return failed


def fail_operation(alias: str, record: IdempotencyKey) -> bool:
    """Store an operator's ``operation-failed`` problem as a stuck operation's final response
    (``idempotency_recover --operations --fail``), as :func:`~django_idempotency.fail_operation`
    would. ``False`` when its final response was stored meanwhile, or it expired."""
    from django_idempotency._store import operations

    response = problems.operation_failed(
        detail="The operation stopped before it finished and was marked as failed by an "
        "operator. Check whether its effects took place before retrying with a new key."
    )
    stored = StoredResponse(
        response.status_code,
        [["Content-Type", problems.CONTENT_TYPE]],
        response.content,
        owner=(record.scope, record.key_hash),
    )
    failed = operations.complete(alias, operations.from_record(record, alias), stored)
    if failed:
        _log_resolved("Marked as failed", record, "stuck idempotency operation")
    return failed


def _log_resolved(
    action: str, record: IdempotencyKey, what: str = "stale idempotency record"
) -> None:
    logger.warning(
        "%s %s %s (scope %r, key %s).",
        action,
        what,
        record.pk,
        record.scope,
        record.key_hash[:12],
        extra=telemetry.log_facts(
            "recovered", record.key_hash, record.scope, record.attempt, record.lock_token
        ),
    )


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
class Deletion:
    """What :func:`in_batches` deleted, and the bound that stopped it (``""``: none did, the
    records were gone)."""

    deleted: int
    batches: int
    seconds: float
    stopped_by: str = ""


#: Told after each batch that deleted something: (this batch's count, the total so far, the
#: number of batches, the seconds since the start).
Progress = Callable[[int, int, int, float], None]


def in_batches(
    delete: Callable[[int], int],
    batch_size: int,
    *,
    max_batches: int | None = None,
    limit: int | None = None,
    max_runtime: float | None = None,
    sleep: float = 0.0,
    progress: Progress | None = None,
) -> Deletion:
    """Call ``delete(size)`` (which deletes up to ``size`` records in a short transaction and
    says how many) until a batch deletes fewer than it may, or a bound stops it: the loop of
    ``idempotency_cleanup`` and of :func:`.erasure.erase_scope`. A batch short of
    its size means nothing is left but rows others are working on: the next run takes them."""
    started = time.monotonic()
    deleted = batches = 0
    stopped_by = ""
    while True:
        if max_batches is not None and batches >= max_batches:
            stopped_by = "--max-batches"
            break
        if limit is not None and deleted >= limit:
            stopped_by = "--limit"
            break
        if max_runtime is not None and time.monotonic() - started >= max_runtime:
            stopped_by = "--max-runtime"
            break
        size = batch_size if limit is None else min(batch_size, limit - deleted)
        count = delete(size)
        if count:
            batches += 1
            deleted += count
            if progress is not None:
                progress(count, deleted, batches, time.monotonic() - started)
        if count < size:
            break
        if sleep:
            time.sleep(sleep)
    return Deletion(deleted, batches, time.monotonic() - started, stopped_by)


def delete_expired(alias: str, now: datetime, batch_size: int, **bounds: Any) -> Deletion:
    """Delete the records expired at ``now`` in batches (:func:`in_batches`' bounds), each
    batch starting where the last one's ``expires_at`` ended."""
    expired = store.using(alias)
    after: datetime | None = None

    def delete(size: int) -> int:
        nonlocal after
        batch = expired.delete_expired_batch(now=now, batch_size=size, after=after)
        after = batch.last_expires_at
        return batch.deleted

    return in_batches(delete, batch_size, **bounds)


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
    #: Long-running operations whose ``202`` waits for a final response, those of them with no
    #: word (completion, progress) for :data:`OPERATION_STUCK_AFTER`, and the longest silence.
    operations_running: int = 0
    operations_stuck: int = 0
    longest_operation_silence: float | None = None

    @property
    def total(self) -> int:
        return sum(self.by_status.values())

    @property
    def warnings(self) -> list[str]:
        warnings = []
        if self.expired > CLEANUP_ROWS_PER_MINUTE:
            warnings.append(
                f"{self.expired:,} expired records are more than one idempotency_cleanup run "
                f"deletes in a minute ({CLEANUP_ROWS_PER_MINUTE:,} at the defaults): is it "
                "scheduled?"
            )
        if self.operations_stuck:
            many = self.operations_stuck != 1
            after = human(OPERATION_STUCK_AFTER.total_seconds())
            warnings.append(
                f"{self.operations_stuck:,} long-running operation{'s' if many else ''} had no "
                f"final response nor progress for over {after} (their "
                "task died, raised without fail_operation(), or was never sent): "
                "idempotency_recover --operations lists them."
            )
        return warnings

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


#: An operation handed on (its ``202`` stored) with no final response nor progress for this
#: long is stuck, as ``idempotency_stats`` warns (``idempotency_recover --operations`` takes
#: any ``--older-than``).
OPERATION_STUCK_AFTER = timedelta(hours=1)


def stats(alias: str) -> Stats:
    """Counts in one scan of the table (conditional aggregates), then its size on disk."""
    now = timezone.now()
    is_stale = rules.STALE.filter(now)
    handed_on = Q(response_status=ACCEPTED, expires_at__gt=now)
    rows = (
        IdempotencyKey.objects.using(alias)
        .order_by()
        .values("status")
        .annotate(
            count=Count("pk"),
            expired=Count("pk", filter=rules.DELETABLE.filter(now)),
            stale=Count("pk", filter=is_stale),
            oldest_claim=Min("created_at", filter=is_stale),
            oldest_unlock=Min("unlock_at", filter=is_stale),
            operations=Count("pk", filter=handed_on),
            stuck=Count("pk", filter=handed_on & Q(updated_at__lte=now - OPERATION_STUCK_AFTER)),
            oldest_word=Min("updated_at", filter=handed_on),
        )
    )
    by_status = dict.fromkeys(IdempotencyKey.Status.values, 0)
    expired = stale_count = 0
    oldest_claim: datetime | None = None
    oldest_unlock: datetime | None = None
    operations = stuck = 0
    oldest_word: datetime | None = None
    for row in rows:
        operations += row["operations"]
        stuck += row["stuck"]
        oldest_word = row["oldest_word"] or oldest_word  # only completed rows hold a 202
        by_status[row["status"]] = row["count"]
        expired += row["expired"]
        stale_count += row["stale"]
        oldest_claim = row["oldest_claim"] or oldest_claim  # only processing rows are stale
        oldest_unlock = row["oldest_unlock"] or oldest_unlock
    table_bytes, index_bytes, source = store.using(alias).table_size()
    return Stats(
        by_status=by_status,
        expired=expired,
        stale=stale_count,
        oldest_stale_age=_seconds_since(oldest_claim, now),
        longest_stale_for=_seconds_since(oldest_unlock, now),
        table_bytes=table_bytes,
        index_bytes=index_bytes,
        size_source=source,
        operations_running=operations,
        operations_stuck=stuck,
        longest_operation_silence=_seconds_since(oldest_word, now),
    )


def _seconds_since(moment: datetime | None, now: datetime) -> float | None:
    return None if moment is None else round((now - moment).total_seconds(), 3)


def _bytes(count: int) -> str:
    if count < 1024:
        return f"{count:,} bytes"
    value = count / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            break
        value /= 1024
    return f"{value:,.1f} {unit}"
