"""A view or a function decides how its result is stored: ``no_store()`` and ``store_for()``
(issue 18 item 3), on every entry point, two-phase and atomic."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.http import HttpResponse
from django.test import override_settings
from django.utils import timezone

from django_idempotency import IdempotencyKey, key_released, no_store, store_for
from tests.conftest import executions, only_record, stored
from tests.test_functions import FLAVOURS, protect
from tests.testapp.models import Execution

pytestmark = [pytest.mark.urls("tests.storing_urls"), pytest.mark.django_db]

Post = Callable[..., Any]

VIEWS = [
    "/function/",
    "/async/",
    "/atomic/",
    "/class/",
    "/drf/",
    "/drf-atomic/",
    "/viewset/",
    "/api-view-inner/",
]


def _wait_past(moment: Any) -> None:
    assert moment - timezone.now() < timedelta(seconds=5), "the record outlives store_for's TTL"
    while timezone.now() <= moment:
        time.sleep(0.05)


@pytest.mark.parametrize("path", VIEWS)
def test_an_unmarked_response_is_stored_and_replayed(post: Post, key: str, path: str) -> None:
    first = post(path, key=key)
    retry = post(path, key=key)
    assert first.json() == retry.json() == {"runs": 1}
    assert retry["Idempotent-Replayed"] == "true"
    row = only_record()
    assert row.status == IdempotencyKey.Status.COMPLETED
    # Storing left expires_at as the claim set it: claim time plus the default TTL.
    assert row.expires_at == row.created_at + timedelta(hours=24)


@pytest.mark.parametrize("path", VIEWS)
def test_no_store_releases_the_key_and_the_retry_runs_again(
    post: Post, key: str, path: str
) -> None:
    first = post(f"{path}?store=no", key=key)
    retry = post(f"{path}?store=no", key=key)
    assert first.status_code == retry.status_code == 201
    assert (first.json(), retry.json()) == ({"runs": 1}, {"runs": 2})
    assert "Idempotent-Replayed" not in first
    assert "Idempotent-Replayed" not in retry
    assert not bool(stored())


@pytest.mark.parametrize("path", VIEWS)
def test_store_for_counts_its_ttl_from_when_the_result_is_stored(
    post: Post, key: str, path: str
) -> None:
    before = timezone.now()
    first = post(f"{path}?store=90", key=key)
    after = timezone.now()
    row = only_record()
    assert row.status == IdempotencyKey.Status.COMPLETED
    assert before + timedelta(seconds=90) <= row.expires_at <= after + timedelta(seconds=90)
    assert row.updated_at + timedelta(seconds=90) == row.expires_at
    retry = post(f"{path}?store=90", key=key)
    assert retry.content == first.content
    assert retry["Idempotent-Replayed"] == "true"


def test_store_for_may_keep_a_result_longer_than_the_views_ttl(post: Post, key: str) -> None:
    two_days = 2 * 24 * 3600
    before = timezone.now()
    post(f"/drf/?store={two_days}", key=key)
    row = only_record()
    assert row.expires_at >= before + timedelta(seconds=two_days)


@pytest.mark.parametrize("path", ["/function/", "/atomic/", "/drf/", "/api-view-inner/"])
def test_after_a_store_for_ttl_shorter_than_the_lock_the_key_is_absent(
    post: Post, key: str, path: str
) -> None:
    first = post(f"{path}?store=0.3", key=key)
    assert post(f"{path}?store=0.3", key=key)["Idempotent-Replayed"] == "true"
    _wait_past(only_record().expires_at)
    retry = post(f"{path}?store=0.3", key=key)
    assert (first.json(), retry.json()) == ({"runs": 1}, {"runs": 2})
    assert "Idempotent-Replayed" not in retry


def test_a_retryable_status_is_released_whatever_its_mark(post: Post, key: str) -> None:
    first = post("/function/?status=503&store=60", key=key)
    retry = post("/function/?status=503&store=60", key=key)
    assert (first.json(), retry.json()) == ({"runs": 1}, {"runs": 2})
    assert not bool(stored())


def test_store_for_keeps_a_deterministic_4xx_for_its_ttl(post: Post, key: str) -> None:
    before = timezone.now()
    post("/function/?status=409&store=30", key=key)
    retry = post("/function/?status=409&store=30", key=key)
    assert retry["Idempotent-Replayed"] == "true"
    row = only_record()
    assert row.status == IdempotencyKey.Status.FAILED
    ttl = timedelta(seconds=30)
    assert before + ttl <= row.expires_at <= timezone.now() + ttl


def test_a_response_without_a_key_passes_through_marked(post: Post) -> None:
    assert post("/function/?store=no", key=None).json() == {"runs": 1}
    assert post("/function/?store=5", key=None).json() == {"runs": 2}
    assert not bool(stored())


def test_no_store_is_reported_as_a_release(post: Post, key: str) -> None:
    reasons: list[str] = []

    def receive(sender: Any, reason: str, **kwargs: Any) -> None:
        reasons.append(reason)

    key_released.connect(receive)
    try:
        post("/drf/?store=no", key=key)
    finally:
        key_released.disconnect(receive)
    assert reasons == ["no_store"]


def test_both_return_the_response_itself() -> None:
    response = HttpResponse()
    assert no_store(response) is response
    assert store_for(response, timedelta(minutes=1)) is response
    assert store_for(response, 60) is response


@pytest.mark.parametrize(
    ("ttl", "error", "message"),
    [
        (0, ValueError, "must be positive"),
        (-5, ValueError, "must be positive"),
        (timedelta(0), ValueError, "must be positive"),
        (float("nan"), ValueError, "must be finite"),
        (timedelta(days=400_000), ValueError, "must be at most"),
        ("60", TypeError, "must be a timedelta or a number of seconds"),
        (True, TypeError, "must be a timedelta or a number of seconds"),
        (None, TypeError, "must be a timedelta or a number of seconds"),
    ],
)
def test_store_for_refuses_a_ttl_that_is_not_a_positive_duration(
    ttl: Any, error: type[Exception], message: str
) -> None:
    for result in (HttpResponse(), 42):
        with pytest.raises(error, match=rf"store_for\(\) ttl {message}"):
            store_for(result, ttl)


# idempotent_function: the result is wrapped, the caller gets it plain.


@pytest.mark.django_db(transaction=True)  # two-phase: outside a test transaction
@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("result", [None, 7, {"a": [1]}])
def test_function_no_store_returns_the_plain_result_and_runs_again(
    flavour: str, key: str, result: Any
) -> None:
    @protect(flavour, key="message_id")
    def handle(message_id: str) -> Any:
        Execution.objects.create(label="handle")
        return no_store(result)

    assert handle(key) is result
    assert handle(key) is result
    assert executions("handle") == 2
    assert not bool(stored())


def test_atomic_function_no_store_keeps_its_work_and_releases(key: str) -> None:
    @protect("sync", key="message_id", atomic=True)
    def handle(message_id: str) -> int:
        Execution.objects.create(label="handle")
        return no_store(executions("handle"))

    assert (handle(key), handle(key)) == (1, 2)
    assert not bool(stored())


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_function_store_for_sets_the_records_expiry(flavour: str, key: str) -> None:
    @protect(flavour, key="message_id")
    def handle(message_id: str) -> dict[str, int]:
        Execution.objects.create(label="handle")
        return store_for({"runs": executions("handle")}, timedelta(minutes=5))

    before = timezone.now()
    first = handle(key)
    after = timezone.now()
    assert first == {"runs": 1}
    row = only_record()
    assert before + timedelta(minutes=5) <= row.expires_at <= after + timedelta(minutes=5)
    assert handle(key) == first
    assert executions("handle") == 1


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_function_runs_again_once_its_store_for_ttl_passed(flavour: str, key: str) -> None:
    @protect(flavour, key="message_id")
    def handle(message_id: str) -> int:
        Execution.objects.create(label="handle")
        return store_for(executions("handle"), 0.3)

    assert (handle(key), handle(key)) == (1, 1)
    _wait_past(only_record().expires_at)
    assert handle(key) == 2


def test_function_last_mark_decides(key: str) -> None:
    @protect("sync", key="message_id")
    def handle(message_id: str) -> int:
        Execution.objects.create(label="handle")
        return store_for(no_store(executions("handle")), 60)

    assert (handle(key), handle(key)) == (1, 1)
    assert only_record().status == IdempotencyKey.Status.COMPLETED


@override_settings(IDEMPOTENCY={"ENABLED": False})
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_function_gets_the_plain_result_when_the_app_is_off(flavour: str, key: str) -> None:
    @protect(flavour, key="message_id")
    def handle(message_id: str) -> int:
        return no_store(store_for(5, 60))

    assert handle(key) == 5
