"""Views of tests/test_body_limits.py: each answers the length of the body it read."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from ninja import NinjaAPI, Status
from ninja.security import HttpBearer
from rest_framework.decorators import api_view, permission_classes
from rest_framework.parsers import BaseParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import idempotent
from django_idempotency.ninja import idempotent as ninja_idempotent
from django_idempotency.rest_framework import IdempotencyMixin


class MixinView(IdempotencyMixin, APIView):
    permission_classes = [IsAuthenticated]

    def post(self, request: Request) -> Response:
        return Response({"data": request.data}, status=201)


class TextParser(BaseParser):
    """Reads DRF's stream (its JSON and form parsers read ``request.body`` instead)."""

    media_type = "text/plain"

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> str:
        return str(stream.read().decode())


class TextView(IdempotencyMixin, APIView):
    permission_classes = [IsAuthenticated]
    parser_classes = [TextParser]

    def post(self, request: Request) -> Response:
        return Response({"data": request.data}, status=201)


@api_view(["POST"])
@permission_classes([IsAuthenticated])
@idempotent
def function_view(request: Request) -> Response:
    return Response({"data": request.data}, status=201)


@csrf_exempt
@idempotent
def plain(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"length": len(request.body)}, status=201)


@csrf_exempt
@idempotent
def stream(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"length": len(request.read())}, status=201)


@csrf_exempt
@idempotent
def upload(request: HttpRequest) -> JsonResponse:
    sizes: dict[str, Any] = {name: f.size for name, f in request.FILES.items()}
    return JsonResponse({"files": sizes}, status=201)


@csrf_exempt
@login_required
@idempotent
def logged_in(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"length": len(request.body)}, status=201)


class Bearer(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> str | None:
        return "alice" if token == "good" else None


api = NinjaAPI(urls_namespace="body-limits", auth=Bearer())


@api.post("/raw", response={201: dict[str, int]})
@ninja_idempotent
def ninja_raw(request: HttpRequest) -> Status[dict[str, int]]:
    return Status(201, {"length": len(request.body)})


urlpatterns = [
    path("ninja/", api.urls),
    path("mixin/", MixinView.as_view()),
    path("text/", TextView.as_view()),
    path("function/", function_view),
    path("plain/", plain),
    path("stream/", stream),
    path("upload/", upload),
    path("logged-in/", logged_in),
]
