"""A long-running operation (``docs/operations.rst``): ``POST /api/exports/`` starts an export of
the charges and answers ``202 Accepted`` with its status URL; ``GET`` that URL until it has
finished; a retry of the ``POST`` with the same key then replays the export itself.

The view starts the work through the outbox (``request.idempotency.enqueue(task, ...)``): the
message is released with the view's stored ``202``, sent right after its commit (and by
``manage.py idempotency_relay`` if the process died first), and the task, protected by
``idempotent_function`` keyed by the message id, completes the operation once
(``tasks.py``: the recipe of ``docs/operations.rst``, with a stand-in for Celery that runs the
task in a thread of the sending process).
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency.rest_framework import IdempotencyMixin
from example_project.payments.tasks import EXPORT_SECONDS, export_charges

__all__ = ["EXPORT_SECONDS", "ExportView"]


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
        claim.enqueue(export_charges, claim.operation_id)
        return Response(
            {"operation": claim.operation_id},
            status=202,
            headers={"Location": claim.operation_url, "Retry-After": "1"},
        )
