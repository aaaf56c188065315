"""Cleanup on the real PostgreSQL with real threads: two runs share the work (SKIP LOCKED)."""

from __future__ import annotations

import re
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.utils import timezone

from django_idempotency import Claim, IdempotencyKey
from tests import factories
from tests.factories import IdempotencyKeyFactory

pytestmark = [pytest.mark.server_db, pytest.mark.django_db(transaction=True)]


def make_expired(count: int) -> None:
    records = IdempotencyKeyFactory.build_batch(count, expired=True, completed=True)
    IdempotencyKey.objects.bulk_create(records, batch_size=1000)


def run_cleanup(barrier: threading.Barrier | None = None, **options: object) -> str:
    out = StringIO()
    try:
        if barrier is not None:
            barrier.wait(timeout=30)
        call_command("idempotency_cleanup", stdout=out, **options)
        return out.getvalue()
    finally:
        connections.close_all()


def deleted_by(output: str) -> int:
    match = re.search(r"Deleted (\d+) expired", output)
    assert match, output
    return int(match[1])


def test_two_cleanups_at_once_share_the_work() -> None:
    assert connection.vendor != "sqlite"
    make_expired(3000)
    barrier = threading.Barrier(2)

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(run_cleanup, barrier, batch_size=50, sleep=0.01) for _ in range(2)]
        outputs = [future.result(timeout=120) for future in futures]

    counts = [deleted_by(output) for output in outputs]
    # A run whose batch another run keeps (SKIP LOCKED, or on MySQL and MariaDB a batch still
    # deadlocked after its retries) stops and leaves those rows to it "or the next one"
    # (MySQLStore.delete_batch): under CI's load both runs once left one batch of 50. The
    # next run, cron's, deletes what is left; nothing is deleted twice and nothing is lost.
    left = IdempotencyKey.objects.count()
    assert left <= 2 * 50, left  # at most a batch each
    after = deleted_by(run_cleanup(batch_size=50)) if left else 0
    assert IdempotencyKey.objects.count() == 0
    # Every row deleted exactly once, and both runs did part of it.
    assert sum(counts) + after == 3000
    assert all(count > 0 for count in counts), counts


def test_cleanup_skips_a_row_locked_by_another_transaction_instead_of_waiting() -> None:
    make_expired(20)
    locked_pk = IdempotencyKey.objects.order_by("expires_at").values_list("pk", flat=True)[0]
    holding = threading.Event()
    done = threading.Event()

    def hold_lock() -> None:
        try:
            with transaction.atomic():
                IdempotencyKey.objects.select_for_update().get(pk=locked_pk)
                holding.set()
                done.wait(timeout=60)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_lock)
    holder.start()
    try:
        assert holding.wait(timeout=30)
        with ThreadPoolExecutor(max_workers=1) as pool:
            # Blocking on the lock would time out here instead of returning.
            output = pool.submit(run_cleanup, None, batch_size=5).result(timeout=30)
    finally:
        done.set()
        holder.join(timeout=30)

    assert deleted_by(output) == 19
    assert list(IdempotencyKey.objects.values_list("pk", flat=True)) == [locked_pk]


def test_claims_during_a_cleanup_are_never_lost() -> None:
    """A claim replacing an expired record while the cleanup deletes it keeps its new record."""
    keys = [str(uuid.uuid4()) for _ in range(300)]
    past = timezone.now() - timedelta(hours=1)
    IdempotencyKey.objects.bulk_create(
        IdempotencyKeyFactory.build(key=key, expires_at=past, completed=True) for key in keys
    )
    barrier = threading.Barrier(2)

    def claim(key: str) -> bool:
        """As the engine does: ``None`` means a concurrent change (the cleanup's), claim again."""
        for _ in range(5):
            found = factories.claim(key)
            if found is not None:
                return isinstance(found, Claim)
        return False

    def claim_all() -> list[bool]:
        try:
            barrier.wait(timeout=30)
            return [claim(key) for key in keys]
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=2) as pool:
        claims = pool.submit(claim_all)
        cleaned = pool.submit(run_cleanup, barrier, batch_size=10)
        claimed = claims.result(timeout=120)
        cleaned.result(timeout=120)

    # Every claim succeeded (an expired record counts as absent) and every one of them is
    # still there, live: the cleanup deleted only records that were still expired.
    assert all(claimed)
    assert IdempotencyKey.objects.count() == 300
    assert not IdempotencyKey.objects.filter(expires_at__lte=timezone.now()).exists()
