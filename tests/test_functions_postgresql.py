"""``idempotent_function`` under real concurrency: threads and killed processes on PostgreSQL."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection, connections, transaction
from django.utils import timezone

from django_idempotency import Claim, IdempotencyInProgress, IdempotencyKey, idempotent_function
from tests.conftest import executions, worker_environment
from tests.testapp.models import Execution
from tests.vendors import LOCK_WAIT

pytestmark = [pytest.mark.server_db, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parent.parent
STEPS = ["reserve", "charge", "ship"]


@idempotent_function(key="message_id")
def deliver(message_id: str, amount: int) -> dict[str, Any]:
    time.sleep(0.3)
    return {"id": Execution.objects.create(label="deliver", payload=str(amount)).pk}


@idempotent_function(key="message_id", in_progress="wait", wait_timeout=10)
def deliver_waiting(message_id: str) -> int:
    time.sleep(0.3)
    return Execution.objects.create(label="deliver-waiting").pk


@idempotent_function(key="message_id", atomic=True, wait_timeout=10)
def deliver_atomic(message_id: str) -> int:
    time.sleep(0.3)
    return Execution.objects.create(label="deliver-atomic").pk


@idempotent_function(key="message_id")
async def deliver_async(message_id: str) -> int:
    await asyncio.sleep(0.3)
    execution = await Execution.objects.acreate(label="deliver-async")
    return execution.pk


# hang_after is the test's remote control, not part of the order: it stays out of the payload.
@idempotent_function(key="order_id", payload=lambda order_id, **_: order_id, lock_timeout=2)
def fulfil(order_id: str, *, hang_after: str = "", idempotency: Claim) -> dict[str, Any]:
    """Three steps with external effects; ``hang_after`` parks the worker there to be killed."""
    point = idempotency.recovery_point
    for step in STEPS[STEPS.index(point) + 1 if point else 0 :]:
        Execution.objects.create(label=f"step-{step}", payload=idempotency.derived_key(step))
        idempotency.set_recovery_point(step, {"step": step})
        if step == hang_after:
            time.sleep(600)  # SIGKILL arrives here
    return {"attempt": idempotency.attempt, "resumed_from": point}


def storm(count: int, call: Callable[[], Any]) -> list[Any]:
    """Run ``call`` in ``count`` threads released at once; results or the exceptions raised."""
    barrier = threading.Barrier(count)

    def run(_: int) -> Any:
        try:
            barrier.wait(timeout=30)
            return call()
        except IdempotencyInProgress as exc:
            return exc
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(run, range(count), timeout=60))


def outcomes(results: list[Any]) -> Counter[str]:
    return Counter(
        "in_progress" if isinstance(result, IdempotencyInProgress) else "result"
        for result in results
    )


def test_twenty_deliveries_of_one_message_run_the_handler_once() -> None:
    assert connection.vendor != "sqlite"
    key = str(uuid.uuid4())
    results = storm(20, lambda: deliver(key, 42))
    counts = outcomes(results)
    assert executions("deliver") == 1
    assert counts["result"] >= 1 and counts["result"] + counts["in_progress"] == 20
    first = deliver(key, 42)
    assert all(result == first for result in results if isinstance(result, dict))
    assert IdempotencyKey.objects.get().status == IdempotencyKey.Status.COMPLETED


def test_twenty_deliveries_to_an_async_handler_run_it_once() -> None:
    key = str(uuid.uuid4())
    results = storm(20, lambda: async_to_sync(deliver_async)(key))
    assert executions("deliver-async") == 1
    first = async_to_sync(deliver_async)(key)
    assert all(result == first for result in results if isinstance(result, int))


@pytest.mark.parametrize(
    ("handler", "label"),
    [(deliver_waiting, "deliver-waiting"), (deliver_atomic, "deliver-atomic")],
)
def test_waiting_and_atomic_duplicates_all_get_the_result(
    handler: Callable[[str], int], label: str
) -> None:
    key = str(uuid.uuid4())
    results = storm(20, lambda: handler(key))
    assert executions(label) == 1
    assert results == [Execution.objects.get(label=label).pk] * 20


def test_distinct_messages_never_conflict() -> None:
    results = storm(20, lambda: deliver(str(uuid.uuid4()), 1))
    assert outcomes(results) == {"result": 20}
    assert executions("deliver") == 20


def test_atomic_inside_a_transaction_does_not_leak_the_lock_wait_limit() -> None:
    set_limit, show_limit, (_, outer) = LOCK_WAIT[connection.vendor]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(set_limit, [outer])
        deliver_atomic(str(uuid.uuid4()))
        cursor.execute(show_limit)
        assert cursor.fetchone() == (outer,)


def spawn_worker(order_id: str) -> subprocess.Popen[bytes]:
    """A real worker process on the pytest-django test database, parked after "charge"."""
    code = (
        "import django, sys; django.setup(); "
        "from tests.test_functions_postgresql import fulfil; "
        "fulfil(sys.argv[1], hang_after='charge')"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, order_id], cwd=ROOT, env=worker_environment()
    )


def test_killed_handler_is_taken_over_after_its_lock_expires_and_resumes() -> None:
    order_id = str(uuid.uuid4())
    worker = spawn_worker(order_id)
    try:
        deadline = time.monotonic() + 30
        while not IdempotencyKey.objects.filter(recovery_point="charge").exists():
            assert worker.poll() is None, "the worker died before reaching its recovery point"
            assert time.monotonic() < deadline, "the worker never reached its recovery point"
            time.sleep(0.05)
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
    assert worker.returncode == -signal.SIGKILL
    record = IdempotencyKey.objects.get()
    assert record.status == IdempotencyKey.Status.PROCESSING
    if record.unlock_at is not None and record.unlock_at > timezone.now():
        with pytest.raises(IdempotencyInProgress):
            fulfil(order_id)  # the dead worker's lock has not expired yet
    assert record.unlock_at is not None
    time.sleep(max(0.0, (record.unlock_at - timezone.now()).total_seconds()) + 0.1)

    results = storm(10, lambda: fulfil(order_id))
    assert outcomes(results)["result"] >= 1
    outcome = next(result for result in results if isinstance(result, dict))
    assert outcome == {"attempt": 2, "resumed_from": "charge"}
    assert [executions(f"step-{step}") for step in STEPS] == [1, 1, 1]
    record.refresh_from_db()
    assert (record.status, record.attempt) == (IdempotencyKey.Status.COMPLETED, 2)
    assert fulfil(order_id) == outcome


def test_async_handler_in_a_thread_pool_sees_its_own_claim() -> None:
    """The claim parameter reaches an async handler run from worker threads, too."""

    @idempotent_function(key="event_id")
    async def handle(event_id: str, *, idempotency: Claim) -> str:
        await sync_to_async(Execution.objects.create)(label="async-claim")
        return idempotency.derived_key("downstream")

    key = str(uuid.uuid4())
    results = storm(5, lambda: async_to_sync(handle)(key))
    keys = {result for result in results if isinstance(result, str)}
    assert len(keys) == 1
    assert executions("async-claim") == 1
