"""``idempotency_recover`` with ``call_command``, and the fenced release / fail it relies on."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_idempotency import Claim, IdempotencyKey
from django_idempotency import _store as store
from django_idempotency._ops import maintenance
from tests import factories
from tests.conftest import executions, problem_slug
from tests.factories import IdempotencyKeyFactory

pytestmark = pytest.mark.django_db

Post = Callable[..., Any]
PROCESSING = IdempotencyKey.Status.PROCESSING
FAILED = IdempotencyKey.Status.FAILED


def recover(*args: str, **options: Any) -> str:
    out = StringIO()
    call_command("idempotency_recover", *args, stdout=out, **options)
    return out.getvalue()


def stale(minutes: float = 1, **fields: Any) -> IdempotencyKey:
    unlock_at = timezone.now() - timedelta(minutes=minutes)
    return IdempotencyKeyFactory(unlock_at=unlock_at, **fields)  # type: ignore[no-any-return]


def crashed(post: Post, key: str) -> IdempotencyKey:
    """A real request's record, put back the way a worker that died mid-view leaves it."""
    assert post("/create/", {"amount": 1}, key=key).status_code == 201
    record = IdempotencyKey.objects.get()
    IdempotencyKey.objects.filter(pk=record.pk).update(
        status=PROCESSING,
        response_status=None,
        response_headers=[],
        response_body=None,
        unlock_at=timezone.now() - timedelta(seconds=5),
    )
    record.refresh_from_db()
    return record


def test_lists_stale_records_only() -> None:
    old = stale(scope="user:7", method="PATCH", path="/orders/42/")
    IdempotencyKeyFactory()  # live lock
    IdempotencyKeyFactory(completed=True)

    output = recover()

    lines = output.splitlines()
    assert lines[0].split() == ["scope", "key", "method", "path", "age", "stale", "for", "attempt"]
    assert lines[1].split()[:4] == ["user:7", old.key_hash[:12], "PATCH", "/orders/42/"]
    assert lines[-1] == "1 stale idempotency record."
    assert IdempotencyKey.objects.count() == 3


def test_older_than_widens_the_margin() -> None:
    recent = stale(minutes=1)
    old = stale(minutes=120)

    output = recover(older_than="10m")

    assert old.key_hash[:12] in output
    assert recent.key_hash[:12] not in output
    assert recover("--older-than", "3h").endswith("0 stale idempotency records.\n")
    assert "2 stale" in recover("--older-than", "30")


@pytest.mark.parametrize("value", ["soon", "-5", "5w", ""])
def test_bad_older_than(value: str) -> None:
    with pytest.raises(CommandError, match="--older-than"):
        recover("--older-than", value)


def test_bad_options() -> None:
    with pytest.raises(CommandError, match="not both"):
        recover(release=True, fail=True)
    with pytest.raises(CommandError, match="not allowed with argument"):
        recover("--release", "--fail")
    with pytest.raises(CommandError, match="--limit"):
        recover(limit=0)
    with pytest.raises(CommandError, match="Unknown database"):
        recover(database="nope")


def test_release_lets_the_retry_run_again(post: Post, key: str) -> None:
    crashed(post, key)
    live = IdempotencyKeyFactory()

    output = recover(release=True)

    assert "released" in output
    assert "Released 1 of 1 stale idempotency record." in output
    assert list(IdempotencyKey.objects.values_list("pk", flat=True)) == [live.pk]
    response = post("/create/", {"amount": 1}, key=key)
    assert response.status_code == 201
    assert "Idempotent-Replayed" not in response
    assert executions("create") == 2


def test_fail_stores_a_definite_failure_that_retries_replay(post: Post, key: str) -> None:
    record = crashed(post, key)

    output = recover("--fail")

    assert "Marked as failed 1 of 1" in output
    record.refresh_from_db()
    assert record.status == FAILED
    assert record.unlock_at is None
    response = post("/create/", {"amount": 1}, key=key)
    assert response.status_code == 500
    assert response["Idempotent-Replayed"] == "true"
    assert problem_slug(response) == "request-abandoned"
    assert executions("create") == 1


def test_dry_run_changes_nothing() -> None:
    record = stale()

    release = recover("--release", "--dry-run")
    fail = recover("--fail", "--dry-run")

    assert "would release" in release
    assert "Would release 1 stale idempotency record (dry run" in release
    assert "Would fail 1 " in fail
    record.refresh_from_db()
    assert record.status == PROCESSING


def test_json_rows() -> None:
    record = stale(minutes=3, scope="tenant:9", path="/pay/")

    rows = json.loads(recover("--json", "--release"))

    assert len(rows) == 1
    row = rows[0]
    assert row["id"] == record.pk
    assert row["scope"] == "tenant:9"
    assert row["key_hash"] == record.key_hash
    assert row["method"] == "POST" and row["path"] == "/pay/"
    assert row["action"] == "released"
    assert 170 < row["stale_seconds"] < 3600
    assert row["age_seconds"] >= 0
    assert json.loads(recover("--json")) == []


def test_limit_takes_the_oldest_first() -> None:
    newer = stale(minutes=5)
    older = stale(minutes=50)

    rows = json.loads(recover("--json", "--limit", "1", "--fail"))

    assert [row["id"] for row in rows] == [older.pk]
    newer.refresh_from_db()
    assert newer.status == PROCESSING


def test_quiet_at_verbosity_0() -> None:
    stale()

    assert recover(release=True, verbosity=0) == ""
    assert not IdempotencyKey.objects.exists()


def take_over(record: IdempotencyKey) -> None:
    claimed = factories.claim(
        key_hash=record.key_hash,
        scope=record.scope,
        method=record.method,
        path=record.path,
        fingerprint=record.request_hash,
    )
    assert isinstance(claimed, Claim) and claimed.attempt == 2


@pytest.mark.parametrize("act", [maintenance.release, maintenance.mark_failed])
def test_a_record_taken_over_meanwhile_is_left_alone(act: Callable[..., bool]) -> None:
    record = stale()
    listed = list(store.using("default").stale_records())
    take_over(record)

    assert act("default", listed[0]) is False

    current = IdempotencyKey.objects.get(pk=record.pk)
    assert current.status == PROCESSING
    assert current.lock_token != record.lock_token


@pytest.mark.parametrize("act", [maintenance.release, maintenance.mark_failed])
def test_a_lock_renewed_by_its_owner_is_left_alone(act: Callable[..., bool]) -> None:
    record = stale()
    assert record.lock_token is not None
    store.using("default").save_recovery_point(
        record.pk, record.lock_token, "charged", None, timedelta(minutes=1)
    )

    assert act("default", record) is False
    assert IdempotencyKey.objects.get(pk=record.pk).status == PROCESSING


def test_the_command_reports_records_resolved_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, second = stale(minutes=10), stale(minutes=5)
    real_release = maintenance.release

    def release_after_a_takeover(alias: str, record: IdempotencyKey) -> bool:
        if record.pk == second.pk:
            take_over(second)
        return real_release(alias, record)

    monkeypatch.setattr(maintenance, "release", release_after_a_takeover)

    output = recover("--release")

    assert "skipped" in output
    assert "Released 1 of 2 stale idempotency records. 1 were resolved meanwhile" in output
    assert not IdempotencyKey.objects.filter(pk=first.pk).exists()
    assert IdempotencyKey.objects.filter(pk=second.pk).exists()
