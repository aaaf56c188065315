"""``idempotency_cleanup`` with ``call_command``, on SQLite and on PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_idempotency import IdempotencyKey
from django_idempotency import _store as store
from tests.factories import IdempotencyKeyFactory

pytestmark = pytest.mark.django_db

PROCESSING = IdempotencyKey.Status.PROCESSING


def cleanup(*args: str, **options: Any) -> str:
    out = StringIO()
    call_command("idempotency_cleanup", *args, stdout=out, **options)
    return out.getvalue()


def expired(count: int, **fields: Any) -> list[IdempotencyKey]:
    fields.setdefault("completed", True)
    return IdempotencyKeyFactory.create_batch(count, expired=True, **fields)


def remaining() -> int:
    return IdempotencyKey.objects.count()


def test_deletes_expired_and_keeps_the_rest() -> None:
    expired(3)
    live = IdempotencyKeyFactory(completed=True)
    in_flight = IdempotencyKeyFactory()
    stale_expired = IdempotencyKeyFactory(expired=True, stale=True)

    output = cleanup()

    assert set(IdempotencyKey.objects.values_list("pk", flat=True)) == {live.pk, in_flight.pk}
    assert not IdempotencyKey.objects.filter(pk=stale_expired.pk).exists()
    assert "Deleted 4 expired idempotency records in 1 batch " in output


def test_never_deletes_an_expired_record_whose_lock_is_live() -> None:
    locked = IdempotencyKeyFactory(expired=True)  # processing, unlock_at a minute ahead
    assert locked.status == PROCESSING and locked.is_expired and not locked.is_stale
    expired(2)

    cleanup("--batch-size", "1")

    assert list(IdempotencyKey.objects.values_list("pk", flat=True)) == [locked.pk]


def test_batches_and_progress_at_verbosity_2() -> None:
    expired(25)

    output = cleanup(batch_size=10, verbosity=2)

    assert remaining() == 0
    assert "Batch 1: deleted 10 (10 in all" in output
    assert "Batch 2: deleted 10 (20 in all" in output
    assert "Batch 3: deleted 5 (25 in all" in output
    assert "Deleted 25 expired idempotency records in 3 batches" in output
    assert "rows/s" in output


def test_records_expiring_at_the_same_instant_all_go() -> None:
    # The batches resume from the last expires_at seen: ties must not be skipped.
    at = timezone.now() - timedelta(hours=1)
    expired(25, expires_at=at)

    cleanup(batch_size=10)

    assert remaining() == 0


def test_a_live_lock_in_the_oldest_batch_does_not_stop_the_run() -> None:
    oldest = timezone.now() - timedelta(days=2)
    locked = IdempotencyKeyFactory(expires_at=oldest)
    expired(12)

    output = cleanup(batch_size=5)

    assert list(IdempotencyKey.objects.values_list("pk", flat=True)) == [locked.pk]
    assert "Deleted 12 " in output


def test_max_batches() -> None:
    expired(25)

    output = cleanup(batch_size=10, max_batches=2)

    assert remaining() == 5
    assert "Deleted 20 expired idempotency records in 2 batches" in output
    assert "Stopped by --max-batches" in output


def test_limit() -> None:
    expired(25)

    output = cleanup("--limit", "15", "--batch-size", "10")

    assert remaining() == 10
    assert "Deleted 15 expired idempotency records in 2 batches" in output
    assert "Stopped by --limit" in output


def test_max_runtime_stops_between_batches() -> None:
    expired(25)

    output = cleanup(batch_size=10, max_runtime=0.2, sleep=0.3)

    assert remaining() == 15
    assert "Stopped by --max-runtime" in output


def test_dry_run_counts_only() -> None:
    expired(25)
    IdempotencyKeyFactory(expired=True)  # live lock: not counted

    output = cleanup(batch_size=10, dry_run=True)

    assert remaining() == 26
    assert "Would delete 25 expired idempotency records in 3 batches of up to 10" in output


def test_dry_run_respects_the_limits() -> None:
    expired(25)

    output = cleanup(batch_size=10, dry_run=True, limit=12)

    assert "Would delete 12 expired idempotency records in 2 batches" in output
    assert "(25 expired in all)" in output


def test_nothing_to_do() -> None:
    IdempotencyKeyFactory(completed=True)

    assert "Deleted 0 expired idempotency records in 0 batches" in cleanup()
    assert remaining() == 1


def test_quiet_at_verbosity_0() -> None:
    expired(5)

    assert cleanup(batch_size=2, verbosity=0) == ""
    assert remaining() == 0


@pytest.mark.django_db(transaction=True, databases=["default", "idempotency"])
def test_another_database_alias() -> None:
    expired(3)

    cleanup(database="idempotency")

    assert remaining() == 0


@pytest.mark.parametrize(
    "options",
    [
        {"batch_size": 0},
        {"batch_size": -5},
        {"max_batches": 0},
        {"limit": -1},
        {"sleep": -1.0},
        {"max_runtime": 0},
        {"database": "nope"},
    ],
)
def test_bad_options_are_command_errors(options: dict[str, Any]) -> None:
    expired(2)

    with pytest.raises(CommandError):
        cleanup(**options)

    assert remaining() == 2


def test_bad_option_values_from_the_command_line() -> None:
    with pytest.raises(CommandError, match="invalid int value"):
        cleanup("--batch-size", "many")
    with pytest.raises(CommandError, match="must be a whole number from 1 to"):
        cleanup("--batch-size", "0")


def test_expired_records_matches_what_a_batch_deletes() -> None:
    expired(4)
    IdempotencyKeyFactory(expired=True)
    IdempotencyKeyFactory(completed=True)
    now = timezone.now()
    assert store.using("default").expired_records(now=now).count() == 4

    batch = store.using("default").delete_expired_batch(now=now, batch_size=100)

    assert batch.deleted == 4
    assert batch.last_expires_at is not None and batch.last_expires_at <= now
    assert remaining() == 2
