"""The Celery task of docs/operations.rst's recipe, run by tests/test_celery_operations.py on real
workers: it writes the export (an ``export-file`` row) and completes the operation; a worker
started with ``IDEMPOTENCY_TEST_PARK_AT`` parks at that point of the first run, to be killed."""

from __future__ import annotations

import os
import time

from celery import shared_task
from django.db import transaction
from django.http import JsonResponse

from django_idempotency import (
    Claim,
    IdempotencyInProgress,
    OperationError,
    complete_operation,
    idempotent_function,
)
from tests.testapp.models import Execution


@shared_task(
    bind=True,
    autoretry_for=(IdempotencyInProgress,),  # a copy of it still runs elsewhere: try later
    retry_backoff=1,
    retry_backoff_max=30,
    max_retries=None,
)
def export(self, operation_id: str) -> None:  # type: ignore[no-untyped-def]
    run_export(operation_id, message_id=self.request.id)  # the outbox message's id


@idempotent_function(key="message_id")
def run_export(operation_id: str, *, message_id: str, idempotency: Claim) -> dict[str, str]:
    if idempotency.recovery_point == "":
        with transaction.atomic():  # the file and the note that it exists: both or neither
            Execution.objects.create(label="export-file", payload=operation_id)
            idempotency.set_recovery_point("written")
    _park("before-complete")
    try:
        complete_operation(operation_id, JsonResponse({"file": "orders.csv"}, status=201))
    except OperationError as exc:
        if exc.reason != "completed":  # a worker killed after completing: done already
            raise
        Execution.objects.create(label="already-completed", payload=operation_id)
    _park("after-complete")
    return {"file": "orders.csv"}


def _park(where: str) -> None:
    if os.environ.get("IDEMPOTENCY_TEST_PARK_AT") == where and not (
        Execution.objects.filter(label="export-parked").exists()
    ):
        Execution.objects.create(label="export-parked", payload=str(os.getpid()))
        while True:
            time.sleep(60)
