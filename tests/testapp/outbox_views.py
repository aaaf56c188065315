"""Views of ``tests/test_outbox.py``: an order that sends its receipt through the outbox.

The request's JSON body says how the attempt ends: ``status`` (answered), ``raise`` (the view
raises), ``point`` (a recovery point between two messages), ``hang`` (an event to wait on
before answering: a takeover's test), ``no_store``."""

from __future__ import annotations

import json
import threading

from django.http import HttpRequest, HttpResponse, JsonResponse
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import idempotent, no_store
from django_idempotency.rest_framework import IdempotencyMixin
from tests.testapp.models import Execution
from tests.testapp.outbox_tasks import receipt

#: Events a test sets to let a parked view go on, by name.
GATES: dict[str, threading.Event] = {}


def _order(request: HttpRequest) -> HttpResponse:
    spec = json.loads(request.body or b"{}")
    claim = request.idempotency  # type: ignore[attr-defined]
    order = Execution.objects.create(label="order", payload=spec.get("order", ""))
    if claim.recovery_point == "":
        ids = [claim.enqueue(receipt, order.pk, name=spec.get("name"), kind="first")]
        if spec.get("point"):
            claim.set_recovery_point("charged")
    else:
        ids = []
    ids.append(claim.enqueue(receipt, order.pk, kind="second"))
    if "gate" in spec:
        GATES[spec["gate"]].wait(10)
    if spec.get("raise"):
        raise RuntimeError("the view failed")
    response = JsonResponse({"order": order.pk, "messages": ids}, status=spec.get("status", 201))
    return no_store(response) if spec.get("no_store") else response


order = idempotent(_order)
atomic_order = idempotent(atomic=True)(_order)
lock_lost_order = idempotent(lock_timeout=1, heartbeat=False)(_order)


class DrfOrder(IdempotencyMixin, APIView):
    def post(self, request: Request) -> Response:
        message = request.idempotency.enqueue(receipt, 7, kind="drf")  # type: ignore[attr-defined]
        return Response({"message": message}, status=201)
