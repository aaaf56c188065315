"""Views starting long-running operations (issue 43): each answers ``202 Accepted`` with its
operation's status URL, and records its executions as Execution rows."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import NinjaAPI
from rest_framework.authentication import TokenAuthentication
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import idempotent
from django_idempotency.ninja import auth_scope, operations_router
from django_idempotency.ninja import idempotent as ninja_idempotent
from django_idempotency.rest_framework import IdempotencyMixin
from tests.testapp.models import Execution
from tests.testapp.ninja_api import ApiKey


def _accepted(request: HttpRequest, label: str) -> HttpResponse:
    Execution.objects.create(label=label, payload=request.body.decode("latin-1"))
    claim = request.idempotency  # type: ignore[attr-defined]
    return JsonResponse(
        {"operation": claim.operation_id},
        status=202,
        headers={"Location": claim.operation_url, "Retry-After": "1"},
    )


@idempotent(in_progress="accepted")
def export(request: HttpRequest) -> HttpResponse:
    return _accepted(request, "export")


@idempotent(in_progress="accepted")
async def async_export(request: HttpRequest) -> HttpResponse:
    return await sync_to_async(_accepted)(request, "async-export")


@idempotent
def conflicting(request: HttpRequest) -> HttpResponse:
    return _accepted(request, "conflicting")


@idempotent
def started(request: HttpRequest) -> HttpResponse:
    """Reads its operation in its own code (a Redis store refuses it before it runs)."""
    Execution.objects.create(label="started")
    claim = request.idempotency  # type: ignore[attr-defined]
    return JsonResponse(
        {"operation": claim.operation_id}, status=202, headers={"Location": claim.operation_url}
    )


@idempotent
def created(request: HttpRequest) -> HttpResponse:
    """Finishes its work itself: its operation is finished with its own response."""
    Execution.objects.create(label="created")
    return JsonResponse({"done": True}, status=201)


class DrfExport(IdempotencyMixin, APIView):
    authentication_classes = [TokenAuthentication]
    permission_classes = [IsAuthenticated]
    idempotency_in_progress = "accepted"

    def post(self, request: Request) -> Response:
        Execution.objects.create(label="drf-export")
        claim = request.idempotency  # type: ignore[attr-defined]
        return Response(
            {"operation": claim.operation_id}, status=202, headers={"Location": claim.operation_url}
        )


api = NinjaAPI(urls_namespace="operations-ninja", title="Operations")

#: A ninja API whose schema has the status endpoint (``operations_router``).
status_api = NinjaAPI(urls_namespace="operations-status-ninja", title="Status")
status_api.add_router("/", operations_router())


@api.post("/exports", auth=ApiKey(), response={202: Any})
@ninja_idempotent(in_progress="accepted")
def ninja_export(request: HttpRequest) -> HttpResponse:
    return _accepted(request, "ninja-export")


def ninja_operation_scope(request: HttpRequest) -> str | None:
    """The status endpoint's scope for the ninja API's clients: its API key, as ninja's
    ``request.auth`` gives it to the operations (``OPERATION_SCOPE_FUNCTION``)."""
    auth = ApiKey()(request)
    return None if auth is None else auth_scope(auth)
