"""A long-running operation (``docs/operations.rst``): ``POST /api/exports/`` starts an export of
the charges and answers ``202 Accepted`` with its status URL; ``GET`` that URL until it has
finished; a retry of the ``POST`` with the same key then replays the export itself.

The work runs in a thread of the server process, started once the view's ``202`` is stored
(it waits for it): a stand-in for a real task queue that keeps the example one process. A
project starts the work through the outbox (``request.idempotency.enqueue(task, ...)``), which
sends it to Celery once the ``202`` is durable, and again if the process dies first, and guards
the task with ``idempotent_function`` (the recipe of ``docs/operations.rst``).
"""

from __future__ import annotations

import csv
import io
import os
import threading
import time

from django.db import connections
from django.http import JsonResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import OperationError, complete_operation
from django_idempotency.rest_framework import IdempotencyMixin
from example_project.payments.models import Charge

#: How long the export pretends to work, in seconds (the README's session polls meanwhile).
EXPORT_SECONDS = float(os.environ.get("EXAMPLE_EXPORT_SECONDS", "2"))


class ExportView(IdempotencyMixin, APIView):
    """Export every charge as CSV, e.g. `{}`: one export per key, answered `202 Accepted`.

    `Location` is the export's status URL: poll it (`GET`) until its `state` is `succeeded`;
    then a retry of this request with the same key answers the export itself. A retry while
    the export runs gets the same `202`.
    """

    idempotency_required = True
    idempotency_in_progress = "accepted"

    @extend_schema(
        request=None,
        responses={
            202: OpenApiResponse(
                response=inline_serializer("ExportStarted", {"operation": serializers.CharField()}),
                description="The export started; Location is its status URL.",
            ),
            201: OpenApiResponse(description="The export (CSV in JSON), once it has finished."),
        },
    )
    def post(self, request: Request) -> Response:
        claim = request.idempotency  # type: ignore[attr-defined]
        start(claim.operation_id)
        return Response(
            {"operation": claim.operation_id},
            status=202,
            headers={"Location": claim.operation_url, "Retry-After": "1"},
        )


def start(operation_id: str) -> None:
    threading.Thread(target=_export, args=(operation_id,), daemon=True).start()


def _export(operation_id: str) -> None:
    try:
        time.sleep(EXPORT_SECONDS)
        rows = list(Charge.objects.order_by("id").values_list("id", "amount", "currency"))
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["id", "amount", "currency"])
        writer.writerows(rows)
        final = JsonResponse({"charges": len(rows), "csv": out.getvalue()}, status=201)
        deadline = time.monotonic() + 30
        while True:
            try:
                complete_operation(operation_id, final)
                return
            except OperationError as exc:
                # "running": the view's 202 is not stored yet (this thread is no outbox).
                if exc.reason != "running" or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    finally:
        connections.close_all()
