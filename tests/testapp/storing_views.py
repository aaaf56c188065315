"""Views that decide how their response is stored (``tests.storing_urls``, issue 18 item 3).

The query string says how: ``?store=no`` returns ``no_store(response)``, ``?store=SECONDS``
returns ``store_for(response, SECONDS)``, no ``store`` the response unmarked. Each records its
executions, and answers with how many runs of its label there have been.
"""

from __future__ import annotations

from typing import Any, TypeVar

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.decorators import method_decorator
from django.views import View
from rest_framework import viewsets
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import idempotent, no_store, store_for
from django_idempotency.rest_framework import IdempotencyMixin
from tests.testapp.models import Execution

R = TypeVar("R")


def _storing(request: HttpRequest | Request, response: R) -> R:
    store = request.GET.get("store")
    if store == "no":
        return no_store(response)
    if store is not None:
        return store_for(response, float(store))
    return response


def _run(label: str) -> dict[str, Any]:
    Execution.objects.create(label=label)
    return {"runs": Execution.objects.filter(label=label).count()}


@idempotent
def function_view(request: HttpRequest) -> HttpResponse:
    status = int(request.GET.get("status", 201))
    return _storing(request, JsonResponse(_run("function"), status=status))


@idempotent
async def async_view(request: HttpRequest) -> HttpResponse:
    await Execution.objects.acreate(label="async")
    runs = await Execution.objects.filter(label="async").acount()
    return _storing(request, JsonResponse({"runs": runs}, status=201))


@idempotent(atomic=True)
def atomic_view(request: HttpRequest) -> HttpResponse:
    return _storing(request, JsonResponse(_run("atomic"), status=201))


@method_decorator(idempotent, name="dispatch")
class ClassView(View):
    def post(self, request: HttpRequest) -> HttpResponse:
        return _storing(request, JsonResponse(_run("class"), status=201))


class DrfView(IdempotencyMixin, APIView):
    def post(self, request: Request) -> Response:
        return _storing(request, Response(_run("drf"), status=201))


class DrfAtomicView(IdempotencyMixin, APIView):
    idempotency_atomic = True

    def post(self, request: Request) -> Response:
        return _storing(request, Response(_run("drf-atomic"), status=201))


class DrfViewSet(IdempotencyMixin, viewsets.ViewSet):
    def create(self, request: Request) -> Response:
        return _storing(request, Response(_run("viewset"), status=201))


@api_view(["POST"])
@idempotent
def api_view_inner(request: HttpRequest) -> Response:
    """``@idempotent`` below ``@api_view``: the response is stored once DRF renders it."""
    return _storing(request, Response(_run("api-view-inner"), status=201))
