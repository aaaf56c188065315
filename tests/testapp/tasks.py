"""Django tasks (``django.tasks``, Django 6.0+) protected by ``idempotent_function``: the example
of docs/consumers.rst, run by tests/test_tasks.py. Only imported on Django 6.0 and later."""

from __future__ import annotations

import threading

from django.tasks import TaskContext, task

from django_idempotency import idempotent_function
from tests.testapp.models import Execution


@task()
@idempotent_function(key="order_id", lock_timeout=300, in_progress="wait")
def send_receipt(order_id: int, email: str) -> dict[str, int]:
    receipt = Execution.objects.create(label="receipt", payload=email)  # sending the email
    return {"receipt": receipt.pk}


@task()
@idempotent_function(key="order_id")
async def send_receipt_async(order_id: int, email: str) -> dict[str, int]:
    receipt = await Execution.objects.acreate(label="receipt", payload=email)
    return {"receipt": receipt.pk}


@task()
@idempotent_function(key="order_id")
def fail_once(order_id: int) -> str:
    Execution.objects.create(label="attempt", payload=str(order_id))
    if Execution.objects.filter(label="attempt").count() == 1:
        raise ConnectionError("the mail server hung up")
    return "sent"


@task(takes_context=True)
@idempotent_function(key="order_id")
def send_receipt_with_context(context: TaskContext, order_id: int, email: str) -> dict[str, int]:
    receipt = Execution.objects.create(label="receipt", payload=email)
    return {"receipt": receipt.pk, "attempt": context.attempt}


#: Set by tests/test_tasks.py once a duplicate is waiting: the first run of
#: :func:`send_receipt_failing_first` then fails.
DUPLICATE_WAITING = threading.Event()


@task()
@idempotent_function(key="order_id", lock_timeout=300, in_progress="wait")
def send_receipt_failing_first(order_id: int, email: str) -> dict[str, int]:
    Execution.objects.create(label="attempt", payload=email)
    if Execution.objects.filter(label="attempt").count() == 1:
        DUPLICATE_WAITING.wait(timeout=30)
        raise ConnectionError("the mail server hung up")
    receipt = Execution.objects.create(label="receipt", payload=email)
    return {"receipt": receipt.pk}


@task()
def outbox_receipt(order_id: int, outbox_message_id: str) -> None:
    """The outbox's consumer (docs/outbox.rst): the message id comes as ``outbox_message_id``."""
    _outbox_receipt(order_id=order_id, message_id=outbox_message_id)


@idempotent_function(key="message_id", name="tests.tasks.outbox_receipt")
def _outbox_receipt(order_id: int, message_id: str) -> None:
    Execution.objects.create(label="outbox-receipt", payload=f"{order_id}:{message_id}")


@task()
def outbox_plain(order_id: int) -> None:
    """A task that does not ask for its message id."""
    Execution.objects.create(label="outbox-plain", payload=str(order_id))
