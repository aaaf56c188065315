"""Views for tests/test_hostile_input.py and tests/test_properties.py (URLconf
``tests.hostile_urls``): each records its executions and answers with what it read."""

from __future__ import annotations

import hashlib
import time

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client
from django.views.decorators.csrf import csrf_protect
from rest_framework import exceptions, serializers
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import idempotent
from django_idempotency.rest_framework import IdempotencyMixin
from tests.testapp.models import Execution


def _record(label: str, payload: str = "") -> Execution:
    return Execution.objects.create(label=label, payload=payload)


@idempotent
def echo(request: HttpRequest) -> HttpResponse:
    """Answers with a digest of the body as the view reads it, and a count of executions."""
    body = request.body
    execution = _record("echo", hashlib.sha256(body).hexdigest())
    return JsonResponse(
        {"id": execution.pk, "sha256": execution.payload, "length": len(body)}, status=201
    )


@csrf_protect
@idempotent
def upload(request: HttpRequest) -> HttpResponse:
    """A browser form upload behind CSRF protection, which parses request.POST first."""
    files = {
        name: hashlib.sha256(upload.read()).hexdigest() for name, upload in request.FILES.items()
    }
    execution = _record("upload", repr(sorted(files.items())))
    return JsonResponse({"id": execution.pk, "fields": request.POST, "files": files}, status=201)


@idempotent
def stream(request: HttpRequest) -> HttpResponse:
    """Reads the body as a stream, as a view taking large uploads does."""
    digest, length = hashlib.sha256(), 0
    while chunk := request.read(8192):
        digest.update(chunk)
        length += len(chunk)
    execution = _record("stream", digest.hexdigest())
    return JsonResponse({"id": execution.pk, "sha256": digest.hexdigest(), "length": length})


@idempotent(ttl=0.2)
def short_ttl(request: HttpRequest) -> HttpResponse:
    """Runs past its TTL; meanwhile the same request comes again (from inside, same thread)."""
    execution = _record("short-ttl")
    if request.headers.get("X-Inner"):
        return JsonResponse({"id": execution.pk})
    time.sleep(0.4)
    inner = Client().post(
        request.path,
        request.body,
        content_type=request.content_type,
        headers={"Idempotency-Key": request.headers["Idempotency-Key"], "X-Inner": "1"},
    )
    return JsonResponse({"id": execution.pk, "duplicate": inner.status_code})


class NameSerializer(serializers.Serializer):  # type: ignore[type-arg]
    name = serializers.CharField()


class DrfAtomicValidatingView(IdempotencyMixin, APIView):
    idempotency_atomic = True

    def post(self, request: Request) -> Response:
        _record("drf-atomic-validating")
        serializer = NameSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        return Response(serializer.data, status=201)


class Unavailable(exceptions.APIException):
    status_code = 503


class DrfAtomicUnavailableView(IdempotencyMixin, APIView):
    """Answers DRF's 503 for an ``APIException`` (DRF marks the transaction for rollback)."""

    idempotency_atomic = True

    def post(self, request: Request) -> Response:
        _record("drf-atomic-unavailable")
        if request.data.get("fail"):
            raise Unavailable("downstream down")
        return Response({"ok": True}, status=201)


class DrfUploadView(IdempotencyMixin, APIView):
    parser_classes = [MultiPartParser]

    def post(self, request: Request) -> Response:
        files = {name: upload.size for name, upload in request.FILES.items()}
        execution = _record("drf-upload", repr(sorted(files.items())))
        return Response({"id": execution.pk, "files": files}, status=201)


class DrfPostOnlyView(IdempotencyMixin, APIView):
    idempotency_required = True

    def post(self, request: Request) -> Response:
        execution = _record("drf-post-only")
        return Response({"id": execution.pk}, status=201)


class DrfGetOnlyView(IdempotencyMixin, APIView):
    idempotency_required = True

    def get(self, request: Request) -> Response:
        return Response({"count": Execution.objects.count()})
