"""Views with their own scope, fingerprint and key format (issue 18), one of each kind."""

from __future__ import annotations

import re

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.decorators import method_decorator
from django.views import View
from rest_framework import viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import idempotent, json_fingerprint
from django_idempotency.rest_framework import IdempotencyMixin
from tests.testapp.models import Execution
from tests.testapp.views import ExecutionSerializer

ORDER_KEY = re.compile(r"order-[0-9]{1,10}")
#: Leaves out a client timestamp and a nonce: the volatile parts of the tests' bodies.
VOLATILE = json_fingerprint(exclude=["/sent_at", "/meta/nonce"])


def tenant_scope(request: HttpRequest) -> str:
    """Each tenant has its own keys."""
    return "tenant:" + request.headers.get("X-Tenant", "none")


def broken_scope(request: HttpRequest) -> str:
    raise LookupError("no tenant header")


def not_a_str_fingerprint(request: HttpRequest, scope: str) -> str:
    return 42  # type: ignore[return-value]


def _created(request: HttpRequest, label: str) -> HttpResponse:
    execution = Execution.objects.create(label=label, payload=request.body.decode("latin-1"))
    return JsonResponse({"id": execution.pk}, status=201)


@idempotent(key_format="uuid")
def uuid_keys(request: HttpRequest) -> HttpResponse:
    return _created(request, "uuid")


@idempotent(key_format=ORDER_KEY)
def order_keys(request: HttpRequest) -> HttpResponse:
    return _created(request, "order")


@idempotent(fingerprint=VOLATILE, scope=tenant_scope)
def volatile(request: HttpRequest) -> HttpResponse:
    return _created(request, "volatile")


@idempotent(fingerprint=VOLATILE, scope=tenant_scope, key_format="uuid")
async def async_volatile(request: HttpRequest) -> HttpResponse:
    execution = await Execution.objects.acreate(label="async-volatile")
    return JsonResponse({"id": execution.pk}, status=201)


@idempotent(scope=broken_scope)
def scope_raises(request: HttpRequest) -> HttpResponse:
    return _created(request, "scope-raises")


@idempotent(scope=broken_scope)
async def async_scope_raises(request: HttpRequest) -> HttpResponse:
    await Execution.objects.acreate(label="async-scope-raises")
    return HttpResponse(status=201)


@method_decorator(idempotent(scope=broken_scope), name="dispatch")
class ClassScopeRaises(View):
    def post(self, request: HttpRequest) -> HttpResponse:
        return _created(request, "class-scope-raises")


@idempotent(fingerprint=not_a_str_fingerprint)
def fingerprint_not_a_str(request: HttpRequest) -> HttpResponse:
    return _created(request, "fingerprint-not-a-str")


@method_decorator(
    idempotent(fingerprint=VOLATILE, scope=tenant_scope, key_format="uuid"), name="dispatch"
)
class ClassVolatile(View):
    def post(self, request: HttpRequest) -> HttpResponse:
        return _created(request, "class-volatile")


class DrfVolatile(IdempotencyMixin, APIView):
    idempotency_fingerprint = VOLATILE
    idempotency_scope = staticmethod(tenant_scope)
    idempotency_key_format = "uuid"

    def post(self, request: HttpRequest) -> Response:
        Execution.objects.create(label="drf-volatile")
        return Response({"ok": True}, status=201)


class VolatileViewSet(IdempotencyMixin, viewsets.ModelViewSet):  # type: ignore[type-arg]
    """A plain function as the class attribute: read from the class, it is never bound."""

    queryset = Execution.objects.all()
    serializer_class = ExecutionSerializer
    idempotency_fingerprint = VOLATILE
    idempotency_scope = tenant_scope
    idempotency_key_format = ORDER_KEY


def method_scope(self: object, request: HttpRequest) -> str:
    """A method written outside its class: the checks refuse it as a scope function."""
    return "x"
