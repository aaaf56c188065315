"""A DRF view the body-limit tests (tests/test_body_limits.py) send large bodies to under
gunicorn; no request of theirs reaches the database."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from rest_framework.authentication import BaseAuthentication, TokenAuthentication
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency.rest_framework import IdempotencyMixin


class _User:
    is_authenticated = True
    pk = 1


class Bearer(BaseAuthentication):
    """``Authorization: Bearer good`` is a user, without a query."""

    def authenticate(self, request: Request) -> tuple[Any, None] | None:
        if request.META.get("HTTP_AUTHORIZATION") == "Bearer good":
            return _User(), None
        return None


def _scope(request: HttpRequest) -> str:
    return "bearer"


class Protected(IdempotencyMixin, APIView):
    authentication_classes = [TokenAuthentication, Bearer]
    permission_classes = [IsAuthenticated]
    idempotency_scope = _scope

    def post(self, request: Request) -> Response:
        return Response({"length": len(request.body)}, status=201)
