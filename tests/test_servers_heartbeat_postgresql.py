"""Lock renewal with real processes: gunicorn and uvicorn workers, and a function's worker.

``lock_timeout`` is 1 s (renewed every third of a second) so that "three times the lock
timeout" is a few seconds. Workers are frozen with ``SIGSTOP`` and killed with ``SIGKILL``; the
takeover time after a kill and the renewal statements of 100 attempts in flight are printed
(run with ``-s``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgiref.sync import async_to_sync
from django.db.backends.signals import connection_created

from django_idempotency import IdempotencyInProgress, idempotent_function
from django_idempotency._call import heartbeat
from tests.conftest import executions, worker_environment
from tests.servers import harness
from tests.test_servers_postgresql import (
    asgi,
    assert_409,
    assert_replay_of,
    in_background,
    post,
    server_database,
    wait_for_claim,
    wsgi,
)
from tests.testapp.models import Execution
from tests.waiting import wait_for

pytestmark = [pytest.mark.server_db, pytest.mark.django_db(transaction=True)]

__all__ = ["asgi", "server_database", "wsgi"]  # the servers' fixtures, shared

ROOT = Path(__file__).resolve().parent.parent
LOCK = 1.0
INTERVAL = LOCK / heartbeat.RENEWALS_PER_LOCK_TIMEOUT
#: Slack for a loaded 2-core machine on top of every bound below.
MARGIN = 1.0


def started(
    label: str = "renewed-start", worker: subprocess.Popen[str] | None = None
) -> tuple[int, int]:
    """The pid and attempt of the view's latest start (``renewed-start`` rows).

    A worker process started by the test imports Django and the test module first, which took
    over 10 s on a loaded CI machine: its start is given a minute, and a worker that exits before
    it starts fails the test with its own error output.
    """

    def start() -> Execution | None:
        if worker is not None and worker.poll() is not None:
            raise AssertionError(f"the worker exited before its start: {worker.communicate()}")
        return Execution.objects.filter(label=label).order_by("-pk").first()

    row = wait_for(start, "a view's start", timeout=10.0 if worker is None else 60.0)
    pid, attempt = row.payload.split(":")
    return int(pid), int(attempt)


def test_a_view_slower_than_its_lock_timeout_runs_once_while_retries_get_409(
    wsgi: harness.Server,
) -> None:
    key = str(uuid.uuid4())
    # Six locks long: the three retries, a second apart, land while it runs even when each
    # takes a second more on a loaded machine (at three locks, one retry came after it ended).
    first = in_background(lambda: post(wsgi, "/renewed/", key, X_Sleep=str(6 * LOCK)))
    started()
    retries = []
    for _ in range(3):
        time.sleep(1.0)
        retries.append(post(wsgi, "/renewed/", key))
    original = first()
    assert original.status_code == 201 and original.json()["attempt"] == 1
    for retry in retries:
        if retry.status_code == 409:
            assert_409(retry)
        else:  # the last retry may arrive just after the view finished
            assert_replay_of(retry, original)
    assert sum(retry.status_code == 409 for retry in retries) >= 2
    assert executions("renewed") == 1
    assert_replay_of(post(wsgi, "/renewed/", key), original)


def test_a_waiting_retry_of_a_renewed_view_gets_its_replay(wsgi: harness.Server) -> None:
    key = str(uuid.uuid4())
    first = in_background(lambda: post(wsgi, "/renewed-wait/", key, X_Sleep=str(3 * LOCK)))
    wait_for_claim(key)  # a fixed 0.5 s: a late first request waited on the "waiter" instead
    waiter = post(wsgi, "/renewed-wait/", key)
    original = first()
    assert original.status_code == 201
    assert_replay_of(waiter, original)
    assert executions("renewed-wait") == 1


def test_an_async_view_slower_than_its_lock_timeout_runs_once(asgi: harness.Server) -> None:
    key = str(uuid.uuid4())
    first = in_background(lambda: post(asgi, "/renewed-async/", key, X_Sleep=str(3 * LOCK)))
    wait_for_claim(key)
    # Past its lock timeout, counted from the claim (a fixed 2 s from the send: a claim late
    # by a second left no renewal to test, later still the retry came after the view ended).
    time.sleep(1.5 * LOCK)
    assert_409(post(asgi, "/renewed-async/", key))
    original = first()
    assert original.status_code == 201
    assert_replay_of(post(asgi, "/renewed-async/", key), original)
    assert executions("renewed-async") == 1


def take_over(send: Callable[[], Any], is_taken: Callable[[Any], bool], limit: float) -> float:
    """Retry every 50 ms until a retry takes the key over; the seconds it took."""
    begun = time.monotonic()
    while time.monotonic() - begun < limit:
        if is_taken(send()):
            return time.monotonic() - begun
        time.sleep(0.05)
    raise AssertionError(f"not taken over within {limit}s")


def test_a_killed_workers_key_is_taken_over_within_lock_timeout_and_an_interval(
    wsgi: harness.Server,
) -> None:
    key = str(uuid.uuid4())
    dying = in_background(lambda: post(wsgi, "/renewed/", key, X_Sleep="60"))
    pid, _ = started()
    time.sleep(2 * LOCK)  # renewed meanwhile: still the first attempt's
    assert post(wsgi, "/renewed/", key).status_code == 409
    os.kill(pid, signal.SIGKILL)
    took = take_over(
        lambda: post(wsgi, "/renewed/", key),
        lambda response: response.status_code == 201,
        LOCK + INTERVAL + MARGIN,
    )
    print(f"\n[heartbeat] gunicorn worker SIGKILLed: taken over after {took:.2f}s (lock 1s)")
    with pytest.raises(httpx.TransportError):
        dying()
    assert executions("renewed") == 1


def test_a_frozen_worker_loses_its_lock_and_learns_it_when_it_resumes(
    wsgi: harness.Server,
) -> None:
    key = str(uuid.uuid4())
    late = in_background(lambda: post(wsgi, "/renewed/", key, X_Sleep="5"))
    pid, _ = started()
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(LOCK + 0.5)  # no renewal while frozen: the lock expires
        new_owner = post(wsgi, "/renewed/", key)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert new_owner.status_code == 201 and new_owner.json()["attempt"] == 2
    # Resumed, its renewer finds the record another attempt's: the signal, then the refusal.
    wait_for(lambda: Execution.objects.filter(label="lock-lost").exists(), "lock_lost")
    resumed = late()
    assert resumed.status_code == 201
    assert resumed.json()["attempt"] == 1 and resumed.json()["lock_lost"] is True
    assert Execution.objects.get(label="lock-lost").payload == "1"
    assert Execution.objects.get(label="late-refused").payload == "1"
    assert "lost its lock" in wsgi.log()
    assert_replay_of(post(wsgi, "/renewed/", key), new_owner)


# idempotent_function in a worker process ----------------------------------------------------


@idempotent_function(key="job_id", payload=lambda job_id, *_: job_id, lock_timeout=LOCK)
def job(job_id: str, seconds: float) -> int:
    Execution.objects.create(label="job-start", payload=f"{os.getpid()}:1")
    time.sleep(seconds)
    return Execution.objects.create(label="job").pk


def job_lost_receiver(**kwargs: Any) -> None:
    Execution.objects.create(label="job-lock-lost", payload=str(kwargs["claim"].attempt))


def spawn(code: str, *args: str) -> subprocess.Popen[str]:
    """A worker process on the pytest-django test database, logging to its stderr."""
    setup = (
        "import django, logging, sys; django.setup(); "
        "logging.getLogger('django_idempotency').addHandler(logging.StreamHandler()); "
    )
    return subprocess.Popen(
        [sys.executable, "-c", setup + code, *args],
        cwd=ROOT,
        env=worker_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def spawn_job(job_id: str, seconds: float) -> subprocess.Popen[str]:
    return spawn(
        "from tests.test_servers_heartbeat_postgresql import job, job_lost_receiver; "
        "from django_idempotency import lock_lost; "
        "lock_lost.connect(job_lost_receiver); "
        "job(sys.argv[1], float(sys.argv[2]))",
        job_id,
        str(seconds),
    )


def in_progress_or_result(job_id: str) -> int | None:
    try:
        return job(job_id, 0)
    except IdempotencyInProgress:
        return None


def test_a_killed_function_worker_is_taken_over_within_lock_timeout_and_an_interval() -> None:
    job_id = str(uuid.uuid4())
    worker = spawn_job(job_id, 60)
    try:
        started("job-start", worker)
        time.sleep(2 * LOCK)
        assert in_progress_or_result(job_id) is None  # renewed: still the worker's
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
    took = take_over(
        lambda: in_progress_or_result(job_id), lambda result: result is not None, LOCK + 2
    )
    print(f"\n[heartbeat] function worker SIGKILLed: taken over after {took:.2f}s (lock 1s)")
    assert took <= LOCK + INTERVAL + MARGIN
    assert executions("job") == 1


def test_a_frozen_function_worker_loses_its_lock_and_its_result_is_refused() -> None:
    job_id = str(uuid.uuid4())
    worker = spawn_job(job_id, 5)
    started("job-start", worker)
    worker.send_signal(signal.SIGSTOP)
    try:
        time.sleep(LOCK + 0.5)
        new_result = in_progress_or_result(job_id)
    finally:
        worker.send_signal(signal.SIGCONT)
    assert new_result is not None
    _, stderr = worker.communicate(timeout=30)
    assert worker.returncode == 0, stderr
    assert Execution.objects.get(label="job-lock-lost").payload == "1"
    assert "lost its lock" in stderr and "was refused" in stderr
    assert executions("job") == 2  # the frozen worker finished its run too: refused
    assert job(job_id, 0) == new_result


@idempotent_function(key="job_id", lock_timeout=1.5)
async def async_job(job_id: str, seconds: float) -> str:
    await asyncio.sleep(seconds)
    return job_id


def hundred_jobs(seconds: float) -> None:
    """In a worker process: 100 async calls in flight at once on one event loop; prints the
    renewal statements its renewer sent and how long the calls took."""
    renewals = 0

    def count(execute: Any, sql: str, *args: Any) -> Any:
        nonlocal renewals
        renewals += sql.startswith("UPDATE")
        return execute(sql, *args)

    def created(connection: Any, **kwargs: Any) -> None:
        # A reconnection of the same wrapper signals again (MySQL): count its statements once.
        if threading.current_thread().name.startswith(heartbeat.THREAD_NAME) and (
            count not in connection.execute_wrappers
        ):
            connection.execute_wrappers.append(count)

    connection_created.connect(created)

    async def hundred() -> list[str]:
        return await asyncio.gather(*(async_job(str(uuid.uuid4()), seconds) for _ in range(100)))

    begun = time.monotonic()
    results = async_to_sync(hundred)()
    print(
        json.dumps(
            {"calls": len(set(results)), "renewals": renewals, "elapsed": time.monotonic() - begun}
        )
    )


def test_a_hundred_calls_in_a_worker_process_cost_one_renewal_per_interval() -> None:
    interval = 1.5 / heartbeat.RENEWALS_PER_LOCK_TIMEOUT
    worker = spawn(
        "from tests.test_servers_heartbeat_postgresql import hundred_jobs; hundred_jobs(4.5)"
    )
    stdout, stderr = worker.communicate(timeout=120)
    assert worker.returncode == 0, stderr
    figures = json.loads(stdout.splitlines()[-1])
    print(
        f"\n[heartbeat] 100 calls in flight in one process for {figures['elapsed']:.2f}s: "
        f"{figures['renewals']} renewal statements ({figures['elapsed'] / interval:.1f} "
        f"intervals of {interval:.2f}s)"
    )
    assert figures["calls"] == 100
    assert 3 <= figures["renewals"] <= figures["elapsed"] / interval + 1
