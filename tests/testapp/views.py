"""Views the tests protect; each records its executions as Execution rows."""

from __future__ import annotations

import asyncio
import json
import time

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.utils.decorators import method_decorator
from django.views import View
from rest_framework import serializers, viewsets
from rest_framework.decorators import api_view
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import idempotent
from django_idempotency.rest_framework import IdempotencyMixin
from tests.testapp.models import Execution
from tests.vendors import LOCK_WAIT


def _run(request: HttpRequest, label: str) -> Execution:
    delay = float(request.GET.get("sleep", 0))
    if delay:
        time.sleep(delay)
    return Execution.objects.create(label=label, payload=request.body.decode("latin-1"))


@idempotent
def create(request: HttpRequest) -> HttpResponse:
    execution = _run(request, "create")
    response = JsonResponse({"id": execution.pk, "n": Execution.objects.count()}, status=201)
    response["Location"] = f"/things/{execution.pk}"
    response["X-Not-Stored"] = "1"
    response.set_cookie("session-ish", "secret")
    return response


@idempotent(required=True)
def required(request: HttpRequest) -> HttpResponse:
    _run(request, "required")
    return JsonResponse({"ok": True})


@idempotent
def status(request: HttpRequest, code: int) -> HttpResponse:
    _run(request, f"status-{code}")
    return JsonResponse({"status": code}, status=code)


@idempotent
def explode(request: HttpRequest) -> HttpResponse:
    _run(request, "explode")
    raise RuntimeError("boom")


@idempotent
def binary(request: HttpRequest) -> HttpResponse:
    _run(request, "binary")
    return HttpResponse(bytes(range(256)) * 4, content_type="application/octet-stream")


@idempotent
def streaming(request: HttpRequest) -> StreamingHttpResponse:
    _run(request, "streaming")
    return StreamingHttpResponse(iter([b"a", b"b"]))


@idempotent
def large(request: HttpRequest) -> HttpResponse:
    _run(request, "large")
    return HttpResponse(b"x" * int(request.GET.get("size", 100)))


@idempotent(lock_timeout=1)
def short_lock(request: HttpRequest) -> HttpResponse:
    execution = _run(request, "short-lock")
    return JsonResponse({"id": execution.pk})


@idempotent(in_progress="wait", wait_timeout=5)
def wait(request: HttpRequest) -> HttpResponse:
    execution = _run(request, "wait")
    return JsonResponse({"id": execution.pk})


@idempotent(in_progress="wait", wait_timeout=0.3)
def wait_short(request: HttpRequest) -> HttpResponse:
    execution = _run(request, "wait-short")
    return JsonResponse({"id": execution.pk})


@idempotent(atomic=True, wait_timeout=0.3)
def atomic_short_wait(request: HttpRequest) -> HttpResponse:
    execution = _run(request, "atomic-short-wait")
    return JsonResponse({"id": execution.pk})


@idempotent(atomic=True, wait_timeout=5)
def atomic(request: HttpRequest) -> HttpResponse:
    execution = _run(request, "atomic")
    if request.GET.get("fail"):
        raise RuntimeError("rolled back")
    return JsonResponse({"id": execution.pk}, status=201)


@idempotent(atomic=True, wait_timeout=5)
def atomic_lock_timeout(request: HttpRequest) -> HttpResponse:
    """Reports the lock_timeout the view runs with: the claim's wait limit must not leak."""
    with connection.cursor() as cursor:
        cursor.execute(LOCK_WAIT[connection.vendor][1])
        (value,) = cursor.fetchone()
    return JsonResponse({"lock_timeout": value}, status=201)


@idempotent(atomic=True)
def atomic_status(request: HttpRequest, code: int) -> HttpResponse:
    _run(request, f"atomic-status-{code}")
    return JsonResponse({"status": code}, status=code)


@idempotent
def recovery(request: HttpRequest) -> HttpResponse:
    """Three steps; header ``X-Crash-After: STEP`` dies after STEP, like a killed worker."""
    claim = request.idempotency  # type: ignore[attr-defined]
    done = []
    steps = ["reserve", "charge", "ship"]
    start = steps.index(claim.recovery_point) + 1 if claim.recovery_point else 0
    for step in steps[start:]:
        Execution.objects.create(label=f"step-{step}", payload=claim.derived_key(step))
        claim.set_recovery_point(step, {"step": step})
        done.append(step)
        if request.headers.get("X-Crash-After") == step:
            raise KeyboardInterrupt  # like a dying process: the record is left as it is
    return JsonResponse({"done": done, "attempt": claim.attempt, "key": claim.derived_key()})


@idempotent
async def async_create(request: HttpRequest) -> HttpResponse:
    delay = float(request.GET.get("sleep", 0))
    if delay:
        await asyncio.sleep(delay)
    execution = await Execution.objects.acreate(label="async", payload=request.body.decode())
    return JsonResponse({"id": execution.pk}, status=201)


@idempotent
async def async_explode(request: HttpRequest) -> HttpResponse:
    await Execution.objects.acreate(label="async-explode")
    raise RuntimeError("boom")


@method_decorator(idempotent(required=True), name="dispatch")
class ClassView(View):
    def post(self, request: HttpRequest) -> HttpResponse:
        execution = _run(request, "class")
        return JsonResponse({"id": execution.pk}, status=201)

    def get(self, request: HttpRequest) -> HttpResponse:
        return JsonResponse({"count": Execution.objects.count()})


class ExecutionSerializer(serializers.ModelSerializer[Execution]):
    class Meta:
        model = Execution
        fields = ["id", "label", "payload"]


class ExecutionViewSet(IdempotencyMixin, viewsets.ModelViewSet):  # type: ignore[type-arg]
    queryset = Execution.objects.all()
    serializer_class = ExecutionSerializer
    idempotency_required = True


class DrfView(IdempotencyMixin, APIView):
    def post(self, request: HttpRequest) -> Response:
        execution = _run(request, "drf")
        return Response({"id": execution.pk, "data": request.data}, status=201)  # type: ignore[attr-defined]


class DrfAtomicView(IdempotencyMixin, APIView):
    idempotency_atomic = True
    idempotency_wait_timeout = 5

    def post(self, request: HttpRequest) -> Response:
        execution = _run(request, "drf-atomic")
        return Response({"id": execution.pk}, status=201)


class DecoratedApiView(APIView):
    """The pattern an existing package left unprotected: a decorated ``APIView.post``."""

    @method_decorator(idempotent)
    def post(self, request: HttpRequest) -> Response:
        execution = _run(request, "decorated-apiview")
        return Response({"id": execution.pk}, status=201)


class MisdecoratedApiView(APIView):
    """``@idempotent`` straight on a method: must fail loudly, never run unprotected."""

    @idempotent  # type: ignore[misc]
    def post(self, request: HttpRequest) -> Response:
        _run(request, "misdecorated")
        return Response({}, status=201)


@api_view(["POST"])
@idempotent
def api_view_inner(request: HttpRequest) -> Response:
    execution = _run(request, "api-view-inner")
    return Response({"id": execution.pk, "body": json.loads(request.body or b"{}")}, status=201)
