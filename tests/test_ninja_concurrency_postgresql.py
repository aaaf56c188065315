"""Ninja operations under real threads against a real server (PostgreSQL, MariaDB)."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
from django.db import connections
from django.test import Client
from django.utils import timezone

from django_idempotency import IdempotencyKey
from tests.conftest import executions, problem_slug
from tests.held import owner_held_until, waiting_threads
from tests.test_concurrency_postgresql import outcome, storm
from tests.testapp import ninja_api

pytestmark = [pytest.mark.server_db, pytest.mark.django_db(transaction=True)]


def post(path: str, key: str, **headers: str) -> Any:
    try:
        return Client().post(
            path,
            {"amount": 4200},
            content_type="application/json",
            headers={"Idempotency-Key": key, **headers},
        )
    finally:
        connections.close_all()


def assert_one_execution(responses: list[Any], label: str) -> Counter[str]:
    counts = Counter(outcome(response) for response in responses)
    assert executions(label) == 1
    assert counts["executed"] == 1
    executed = next(r for r in responses if outcome(r) == "executed")
    for response in responses:
        if outcome(response) == "replay":
            assert response.content == executed.content
    return counts


@pytest.mark.parametrize(
    ("path", "label"),
    [
        ("/ninja/charges?sleep=0.3", "ninja-charge"),
        ("/ninja/async?sleep=0.3", "ninja-async"),
        ("/ninja/atomic?sleep=0.3", "ninja-atomic"),
    ],
)
def test_a_storm_of_one_key_runs_the_operation_once(path: str, label: str) -> None:
    assert_one_execution(storm(20, path, str(uuid.uuid4())), label)


@pytest.mark.parametrize(
    ("path", "label"),
    [("/ninja/wait", "ninja-wait"), ("/ninja/router/charges", "ninja-router")],
)
def test_in_wait_mode_every_duplicate_gets_the_replay(
    path: str, label: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner is held at its claim until the seven others wait for it (a fixed 0.5 s run
    let late duplicates replay without waiting)."""
    waiting = waiting_threads(monkeypatch)
    responses = owner_held_until(
        partial(storm, 8, path, str(uuid.uuid4())),
        lambda: len(waiting) == 7,
        "the seven duplicates to wait for the owner",
    )
    counts = assert_one_execution(responses, label)
    assert counts == {"executed": 1, "replay": 7}


def test_a_duplicate_of_an_operation_in_flight_gets_409() -> None:
    key, name = str(uuid.uuid4()), str(uuid.uuid4())
    ninja_api.ENTERED[name], ninja_api.RELEASE[name] = threading.Event(), threading.Event()
    path = f"/ninja/gate?name={name}"
    with ThreadPoolExecutor(max_workers=1) as pool:
        first = pool.submit(post, path, key)
        try:
            assert ninja_api.ENTERED[name].wait(timeout=30)
            duplicate = post(path, key)
        finally:
            ninja_api.RELEASE[name].set()
        assert first.result(timeout=30).status_code == 201
    assert (duplicate.status_code, problem_slug(duplicate)) == (409, "request-in-progress")
    assert duplicate["Retry-After"] == "1"
    assert post(path, key)["Idempotent-Replayed"] == "true"
    assert executions("ninja-gate") == 1


def test_a_stale_record_is_taken_over_by_exactly_one_retry_which_resumes() -> None:
    key = str(uuid.uuid4())
    with pytest.raises(KeyboardInterrupt):
        post("/ninja/recovery", key, **{"X-Crash": "1"})
    IdempotencyKey.objects.update(unlock_at=timezone.now() - timedelta(seconds=1))
    responses = storm(10, "/ninja/recovery", key)
    counts = Counter(outcome(response) for response in responses)
    assert counts["executed"] == 1
    assert counts["executed"] + counts["replay"] + counts["409"] == 10
    record = IdempotencyKey.objects.get()
    assert (record.status, record.attempt) == (IdempotencyKey.Status.COMPLETED, 2)
    assert executions("ninja-recovery-charge") == 1
    assert executions("ninja-recovery-ship") == 1
