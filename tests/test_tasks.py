"""``idempotent_function`` under Django's tasks framework: a task enqueued twice with one key runs
its effect once, on the ImmediateBackend (Django's default ``TASKS``: each task runs in the
enqueuing thread).

``django.tasks`` is new in Django 6.0: on Django 5.2 this module is skipped (CI's Django 6.0 and
6.1 legs run it, and CI allows only this skip on PostgreSQL). Two-phase mode, so the claim
commits on its own as in a worker: ``transaction=True``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

tasks = pytest.importorskip("django.tasks", reason="needs Django 6.0+ (django.tasks)")

from django_idempotency import IdempotencyKey  # noqa: E402
from django_idempotency._store.claims import Claims  # noqa: E402
from tests.conftest import executions  # noqa: E402
from tests.testapp import tasks as testapp_tasks  # noqa: E402
from tests.testapp.tasks import (  # noqa: E402
    fail_once,
    send_receipt,
    send_receipt_async,
    send_receipt_failing_first,
    send_receipt_with_context,
)

pytestmark = pytest.mark.django_db(transaction=True)
SUCCESSFUL = tasks.TaskResultStatus.SUCCESSFUL
FAILED = tasks.TaskResultStatus.FAILED


@pytest.mark.parametrize("receipt_task", [send_receipt, send_receipt_async], ids=["sync", "async"])
def test_a_task_enqueued_twice_with_one_key_runs_once(receipt_task: tasks.Task) -> None:
    first = receipt_task.enqueue(order_id=1001, email="ada@example.com")
    second = receipt_task.enqueue(order_id=1001, email="ada@example.com")

    assert (first.status, second.status) == (SUCCESSFUL, SUCCESSFUL)
    assert first.id != second.id  # two tasks, one effect
    assert executions("receipt") == 1
    assert second.return_value == first.return_value == {"receipt": first.return_value["receipt"]}
    assert IdempotencyKey.objects.get().status == IdempotencyKey.Status.COMPLETED


def test_another_key_is_another_effect() -> None:
    send_receipt.enqueue(order_id=1001, email="ada@example.com")
    send_receipt.enqueue(order_id=1002, email="ada@example.com")
    assert executions("receipt") == 2


def test_the_same_key_with_other_arguments_fails_the_task_and_runs_nothing() -> None:
    send_receipt.enqueue(order_id=1001, email="ada@example.com")
    reused = send_receipt.enqueue(order_id=1001, email="grace@example.com")

    assert reused.status == FAILED
    assert reused.errors[0].exception_class.__name__ == "IdempotencyKeyMismatch"
    assert executions("receipt") == 1


def test_a_failed_task_releases_its_key_so_enqueuing_it_again_runs_it() -> None:
    failed = fail_once.enqueue(order_id=7)
    retried = fail_once.enqueue(order_id=7)
    replayed = fail_once.enqueue(order_id=7)

    assert failed.status == FAILED
    assert failed.errors[0].exception_class is ConnectionError
    assert (retried.status, retried.return_value) == (SUCCESSFUL, "sent")
    assert (replayed.status, replayed.return_value) == (SUCCESSFUL, "sent")
    assert executions("attempt") == 2


def test_a_task_taking_its_context_leaves_the_context_out_of_the_payload() -> None:
    """The TaskContext is not JSON, and differs between runs of one task: the default payload
    is the task's own arguments, so the duplicate matches and runs nothing."""
    first = send_receipt_with_context.enqueue(order_id=1001, email="ada@example.com")
    second = send_receipt_with_context.enqueue(order_id=1001, email="ada@example.com")
    reused = send_receipt_with_context.enqueue(order_id=1001, email="grace@example.com")

    assert (first.status, second.status) == (SUCCESSFUL, SUCCESSFUL), first.errors
    receipt = first.return_value["receipt"]
    assert second.return_value == first.return_value == {"receipt": receipt, "attempt": 1}
    assert reused.errors[0].exception_class.__name__ == "IdempotencyKeyMismatch"
    assert executions("receipt") == 1


def test_a_duplicate_waiting_while_the_first_fails_runs_the_task_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Wait mode, as docs/consumers.rst recommends: a duplicate started while the first run is
    in flight waits for it; the first fails and releases the key, and the duplicate runs the
    task. Dropping the duplicate (conflict mode) would leave no receipt at all.

    The first run fails only once the duplicate is seen polling the record (the waiter's
    ``peek_status``, spied on and passed through), so the duplicate met the key in flight.
    """
    peek_status = Claims.peek_status

    def spied(self: Claims, *args: Any) -> Any:
        testapp_tasks.DUPLICATE_WAITING.set()
        return peek_status(self, *args)

    monkeypatch.setattr(Claims, "peek_status", spied)
    testapp_tasks.DUPLICATE_WAITING.clear()
    results: dict[str, tasks.TaskResult] = {}

    def enqueue(name: str) -> None:
        results[name] = send_receipt_failing_first.enqueue(order_id=7, email="ada@example.com")

    first = threading.Thread(target=enqueue, args=("first",))
    first.start()
    while executions("attempt") == 0:  # the first run holds the key
        assert first.is_alive()
        time.sleep(0.01)
    enqueue("duplicate")
    first.join(timeout=60)

    assert results["first"].status == FAILED
    assert results["first"].errors[0].exception_class is ConnectionError
    assert results["duplicate"].status == SUCCESSFUL, results["duplicate"].errors
    assert executions("receipt") == 1


def test_the_outbox_enqueues_a_task_with_its_message_id() -> None:
    """Issue 41: ``claim.enqueue`` takes a ``django.tasks`` task; the message id reaches it as
    ``outbox_message_id``, so a consumer keyed by it has one effect when the message is sent
    again (an operator's re-send here; a relay killed before marking it, in production)."""
    from django.core.management import call_command
    from django.utils import timezone

    from django_idempotency import Claim, idempotent_function
    from django_idempotency.models import OutboxMessage
    from django_idempotency.testing import outbox_sent
    from tests.testapp.tasks import outbox_plain, outbox_receipt

    @idempotent_function(key="order_id", name="tests.tasks.place_order")
    def place_order(order_id: int, *, idempotency: Claim) -> str:
        idempotency.enqueue(outbox_plain, order_id)
        return idempotency.enqueue(outbox_receipt, order_id)

    message = place_order(order_id=7)
    outbox_sent()  # the fast path sends from its own thread, after the commit
    assert list(payloads("outbox-receipt")) == [f"7:{message}"]
    assert list(payloads("outbox-plain")) == ["7"]
    OutboxMessage.objects.update(state="pending", available_at=timezone.now())  # re-sent
    call_command("idempotency_relay", "--once", verbosity=0)
    assert list(payloads("outbox-receipt")) == [f"7:{message}"]  # once per message
    assert list(payloads("outbox-plain")) == ["7", "7"]  # unprotected: twice


def payloads(label: str) -> Any:
    from tests.testapp.models import Execution

    return Execution.objects.filter(label=label).values_list("payload", flat=True)
