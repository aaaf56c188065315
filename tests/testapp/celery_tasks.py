"""The Celery task of docs/consumers.rst's Celery recipe, run by tests/test_celery.py on real
workers and brokers. ``Execution`` rows stand for the invoice and the email."""

from __future__ import annotations

import os
import time

from celery import shared_task
from django.db import transaction

from django_idempotency import Claim, IdempotencyInProgress, idempotent_function
from tests.testapp.models import Execution


@shared_task(
    bind=True,
    autoretry_for=(IdempotencyInProgress,),  # a copy of it still runs elsewhere: try later
    retry_backoff=1,  # within 1, 2, 4, 8... s (a random part of each)
    retry_backoff_max=30,  # about LOCK_TIMEOUT: a killed worker's key is free by then
    max_retries=None,
)
@idempotent_function(key="order_id")
def invoice_order(self, order_id: int, *, idempotency: Claim) -> dict[str, int]:
    if idempotency.recovery_point == "":
        with transaction.atomic():  # the invoice and the note that it exists: both or neither
            invoice = Execution.objects.create(label="invoice", payload=str(order_id))
            idempotency.set_recovery_point("invoiced", {"invoice": invoice.pk})
    invoice_id = idempotency.recovery_data["invoice"]
    mailer.send_invoice(invoice_id, idempotency_key=idempotency.derived_key("email"))
    return {"invoice": invoice_id}


class mailer:  # stands for a mail provider's client module
    @staticmethod
    def send_invoice(invoice_id: int, *, idempotency_key: str) -> None:
        """Send the invoice (an ``email`` row). A worker started with
        ``IDEMPOTENCY_TEST_HANG_IN_MAILER`` parks the first call here, as a worker killed
        between committing the invoice and storing the task's result would: it records its
        process id (a ``hanging`` row) and sleeps until the test kills it."""
        if os.environ.get("IDEMPOTENCY_TEST_HANG_IN_MAILER") and not (
            Execution.objects.filter(label="hanging").exists()
        ):
            Execution.objects.create(label="hanging", payload=str(os.getpid()))
            while True:
                time.sleep(60)
        Execution.objects.create(label="email", payload=idempotency_key)


@shared_task(
    bind=True,
    autoretry_for=(IdempotencyInProgress,),
    retry_backoff=1,
    retry_backoff_max=10,
    max_retries=None,
)
def send_receipt(self, order_id: int) -> None:
    """The consumer of tests/test_outbox_celery.py's web processes and relays: protected by
    ``idempotent_function`` keyed by the message id (Celery's ``task_id``), so a message
    delivered twice has one effect (a ``receipt`` row). docs/outbox.rst's own consumer, its
    worker killed mid-task, is tests/test_docs_examples.py's."""
    _send_receipt(order_id=order_id, message_id=self.request.id)


@idempotent_function(key="message_id", name="tests.receipt")
def _send_receipt(order_id: int, message_id: str, *, idempotency: Claim) -> None:
    Execution.objects.create(label="receipt", payload=str(order_id))
