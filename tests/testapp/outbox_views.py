"""Views of ``tests/test_outbox.py``: an order that sends its receipt through the outbox.

The request's ``X-Spec`` header (JSON, not part of the fingerprint: a retry may end otherwise)
says how the attempt ends: ``status`` (answered), ``raise`` (the view
raises), ``point`` (a recovery point between two messages), ``gate`` (an event to wait on
before answering), ``no_store``, ``steal`` (the record taken over meanwhile), ``bare`` (nothing
staged), ``always`` (the first message staged by a takeover too)."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import Claim, IdempotencyKey, idempotent, no_store
from django_idempotency.rest_framework import IdempotencyMixin
from tests.testapp.models import Execution
from tests.testapp.outbox_tasks import probe, receipt

#: Events a test sets to let a parked view go on, by name.
GATES: dict[str, threading.Event] = {}


def _order(request: HttpRequest) -> HttpResponse:
    spec = json.loads(request.headers.get("X-Spec", "{}"))
    claim = request.idempotency  # type: ignore[attr-defined]
    order = Execution.objects.create(label="order", payload=spec.get("order", ""))
    if spec.get("bare"):
        return JsonResponse({"order": order.pk}, status=201)
    ids = []
    if claim.recovery_point == "" or spec.get("always"):
        ids.append(claim.enqueue(receipt, order.pk, name=spec.get("name"), kind="first"))
    if claim.recovery_point == "" and spec.get("point"):
        claim.set_recovery_point("charged")
    ids.append(claim.enqueue(receipt, order.pk, kind="second"))
    if spec.get("steal"):  # another attempt took the record over meanwhile
        _steal(claim)
    if "gate" in spec:
        GATES[spec["gate"]].wait(10)
    if spec.get("raise"):
        raise RuntimeError("the view failed")
    response = JsonResponse({"order": order.pk, "messages": ids}, status=spec.get("status", 201))
    return no_store(response) if spec.get("no_store") else response


def _steal(claim: Claim) -> None:
    """Give the claim's record another lock token, as a takeover would: its owner is fenced."""
    from django_idempotency._conf import stores

    if stores.form(claim.alias) == stores.DATABASE:
        IdempotencyKey.objects.filter(pk=claim.pk).update(lock_token=uuid.uuid4())
        return
    from django_idempotency._store import using
    from django_idempotency._store.redis.keyspace import record_key

    store: Any = using(claim.alias)
    record = record_key(claim.scope, claim.key_hash, store.prefix)
    store.client.hset(record, "tok", str(uuid.uuid4()))


order = idempotent(_order)


@idempotent
async def async_order(request: HttpRequest) -> HttpResponse:
    from asgiref.sync import sync_to_async

    return await sync_to_async(_order)(request)


atomic_order = idempotent(atomic=True)(_order)
lock_lost_order = idempotent(lock_timeout=1, heartbeat=False)(_order)


class DrfOrder(IdempotencyMixin, APIView):
    def post(self, request: Request) -> Response:
        message = request.idempotency.enqueue(receipt, 7, kind="drf")  # type: ignore[attr-defined]
        return Response({"message": message}, status=201)


@idempotent
def notify_order(request: HttpRequest) -> HttpResponse:
    """Stages a message for a real Celery task (:mod:`tests.testapp.broker_tasks`)."""
    from tests.testapp.broker_tasks import notify

    order = Execution.objects.create(label="order", payload="notify")
    message = request.idempotency.enqueue(notify, order.pk)  # type: ignore[attr-defined]
    return JsonResponse({"message": message}, status=201)


@idempotent
def _probed_order(request: HttpRequest) -> HttpResponse:
    order = Execution.objects.create(label="order", payload="probed")
    request.idempotency.enqueue(probe, order.pk)  # type: ignore[attr-defined]
    return JsonResponse({"order": order.pk}, status=201)


def probed_order(request: HttpRequest) -> HttpResponse:
    """Between ``ATOMIC_REQUESTS``' transaction and the protected view: the transaction stays
    open until the view's message is handed to the broker (2 s at most), as a slow commit, or
    a busy process, would keep it."""
    response = _probed_order(request)
    probe.handed.wait(2)
    return response
