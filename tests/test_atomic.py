"""Atomic mode: claim, view and result commit together or not at all."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.http import HttpRequest, HttpResponse

from django_idempotency import IdempotencyKey, idempotent
from tests.conftest import executions
from tests.vendors import LOCK_WAIT

pytestmark = pytest.mark.django_db

Post = Callable[..., Any]


def test_first_request_commits_and_retries_replay(post: Post, key: str) -> None:
    first = post("/atomic/", {"a": 1}, key=key)
    retry = post("/atomic/", {"a": 1}, key=key)
    assert first.status_code == 201
    assert retry.content == first.content
    assert retry["Idempotent-Replayed"] == "true"
    assert executions("atomic") == 1
    assert IdempotencyKey.objects.get().status == IdempotencyKey.Status.COMPLETED


def test_exception_rolls_back_the_view_and_the_claim(post: Post, key: str) -> None:
    with pytest.raises(RuntimeError):
        post("/atomic/?fail=1", key=key)
    assert executions() == 0
    assert not IdempotencyKey.objects.exists()
    assert post("/atomic/?fail=", key=key).status_code == 201


def test_retryable_status_rolls_the_claim_back_with_the_view_work(post: Post, key: str) -> None:
    """A response that says "try again" leaves nothing of the attempt: its retry is the
    first to write (committed, the first's work stayed while its retry ran the view again)."""
    post("/atomic-status/503/", key=key)
    post("/atomic-status/503/", key=key)
    assert executions("atomic-status-503") == 0
    assert not IdempotencyKey.objects.exists()


def test_deterministic_4xx_is_stored(post: Post, key: str) -> None:
    post("/atomic-status/404/", key=key)
    assert post("/atomic-status/404/", key=key)["Idempotent-Replayed"] == "true"
    assert IdempotencyKey.objects.get().status == IdempotencyKey.Status.FAILED


def test_drf_mixin_atomic(post: Post, key: str) -> None:
    first = post("/drf-atomic/", {"a": 1}, key=key)
    retry = post("/drf-atomic/", {"a": 1}, key=key)
    assert first.status_code == 201
    assert retry.content == first.content
    assert executions("drf-atomic") == 1


def test_atomic_needs_a_sync_view() -> None:
    async def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse()

    with pytest.raises(ImproperlyConfigured, match="atomic=True needs a sync view"):
        idempotent(atomic=True)(view)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ttl": 0}, "ttl must be positive"),
        ({"lock_timeout": "60"}, "lock_timeout must be a timedelta"),
        ({"in_progress": "queue"}, "in_progress must be one of"),
        ({"methods": "POST"}, "methods must be a non-empty list"),
        ({"methods": ["GET"]}, "lists safe methods"),
        ({"heartbeat": "off"}, "heartbeat must be True or False"),
    ],
)
def test_bad_options_fail_at_decoration(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        idempotent(**options)


@pytest.mark.server_db
@pytest.mark.parametrize("outer", [0, 1])
def test_the_claims_lock_wait_limit_never_leaks(post: Post, key: str, outer: int) -> None:
    """The claim waits at most wait_timeout; the view, and the caller's transaction, keep theirs.

    The test's own transaction stands for a caller's (ATOMIC_REQUESTS, a consumer's batch):
    atomic mode's block is a savepoint inside it.
    """
    set_limit, show_limit, values = LOCK_WAIT[connection.vendor]
    with connection.cursor() as cursor:
        cursor.execute(set_limit, [values[outer]])
        first = post("/atomic-lock-timeout/", key=key)
        assert (first.status_code, first.json()) == (201, {"lock_timeout": values[outer]})
        replay = post("/atomic-lock-timeout/", key=key)
        assert replay["Idempotent-Replayed"] == "true"
        cursor.execute(show_limit)
        assert cursor.fetchone() == (values[outer],)


@pytest.mark.django_db(transaction=True)
def test_a_cut_as_the_block_opened_leaves_the_thread_out_of_it(
    post: Post, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watchdog cut the connection just as atomic mode's block had opened (an hour's
    MariaDB soak, a load average of 60): the attempt claims again or is a ``503``, and the
    block is left. It was not: the thread's connection stayed in it, and every later request
    on the thread answered ``500`` (``TransactionManagementError``), 1,004 in that hour."""
    from django_idempotency._store import deadlines

    real, cuts = deadlines.unwatch, []

    def unwatch(watch: Any) -> bool:
        if connection.in_atomic_block and not cuts:
            cuts.append(real(watch))
            return True
        return real(watch)

    monkeypatch.setattr(deadlines, "unwatch", unwatch)
    # A server store claims again at once on a new connection; SQLite's answers 503.
    first = post("/atomic/", {"a": 1}, key=key)
    assert cuts and not connection.in_atomic_block
    assert first.status_code in (201, 503)
    assert post("/atomic/", {"a": 1}, key=key).status_code == 201
    assert executions("atomic") == 1
