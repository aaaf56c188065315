"""The example's background work, started through the outbox (``docs/outbox.rst``).

:func:`in_process` makes a function a stand-in for a Celery task: the outbox sends it as it
sends one (``apply_async(args, kwargs, task_id=message_id)``, the message id as the task's id),
and it runs the function in a thread of the process that hands the message over: the web
process right after its commit (the outbox's fast path), or ``manage.py idempotency_relay``
for what that missed. It keeps the example one process with no broker, which is all it is for:
it is no queue. A process that dies while the thread runs loses that run, as the message was
already marked sent. A project writes the same function as a Celery task (``@shared_task``) or
a ``django.tasks`` task, and the outbox sends it to the broker and its workers instead, with
nothing else changed: the staging, the release with the result, the message id, and the
consumer protected by ``idempotent_function`` keyed by that id.
"""

from __future__ import annotations

import csv
import io
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from django.core.mail import send_mail
from django.db import connections
from django.http import JsonResponse

from django_idempotency import Claim, complete_operation, idempotent_function
from example_project.payments.models import Charge

logger = logging.getLogger(__name__)

#: How long the export pretends to work, in seconds (the README's session polls meanwhile).
EXPORT_SECONDS = float(os.environ.get("EXAMPLE_EXPORT_SECONDS", "2"))


class InProcessTask:
    """What the outbox needs of a Celery task: a ``name`` (the dotted path it is found at) and
    ``apply_async``. The function receives the message id as ``message_id``."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func
        self.name = f"{func.__module__}.{func.__name__}"

    def apply_async(
        self,
        args: list[Any] | tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        task_id: str | None = None,
        **options: Any,
    ) -> None:
        # Not a daemon: a relay run with --once finishes the work it handed over before exiting.
        threading.Thread(target=self._run, args=(list(args), dict(kwargs or {}), task_id)).start()

    def _run(self, args: list[Any], kwargs: dict[str, Any], task_id: str | None) -> None:
        try:
            self.func(*args, message_id=task_id, **kwargs)
        except Exception:
            logger.exception("The task %s (message %s) failed.", self.name, task_id)
        finally:
            connections.close_all()


def in_process(func: Callable[..., Any]) -> InProcessTask:
    return InProcessTask(func)


@in_process
def email_receipt(charge_id: int, *, message_id: str) -> None:
    """A charge's receipt, staged by ``POST /api/charges/`` (``views.py``): once per message,
    though a message may be handed over twice."""
    _email_receipt(charge_id, message_id=message_id)


@idempotent_function(key="message_id", name="example.email_receipt")
def _email_receipt(charge_id: int, *, message_id: str, idempotency: Claim) -> None:
    charge = Charge.objects.get(pk=charge_id)
    send_mail(
        f"Receipt for charge {charge.pk}",
        f"We charged {charge.amount} {charge.currency.upper()} ({charge.provider_id}).",
        None,
        ["customer@example.com"],
    )


@in_process
def export_charges(operation_id: str, *, message_id: str) -> None:
    """The export, started by ``POST /api/exports/`` (``exports.py``): once per message."""
    _export_charges(operation_id, message_id=message_id)


@idempotent_function(key="message_id", name="example.export_charges")
def _export_charges(operation_id: str, *, message_id: str, idempotency: Claim) -> None:
    time.sleep(EXPORT_SECONDS)
    rows = list(Charge.objects.order_by("id").values_list("id", "amount", "currency"))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["id", "amount", "currency"])
    writer.writerows(rows)
    complete_operation(
        operation_id, JsonResponse({"charges": len(rows), "csv": out.getvalue()}, status=201)
    )
