"""The benchmark's view: the example project's charge, without DRF.

It parses the JSON body, inserts a ``Charge`` row, and renders it as JSON: the work of a
small real endpoint, so that the ratios mean something. The same function is served bare and
protected in each mode, and, when ``drf-idempotency`` is installed (the benchmarks' peer), by
its decorator: alone (its only mode) and inside one transaction (``transaction.atomic``, as
``ATOMIC_REQUESTS`` would run it), the peer's counterparts of our two modes.
"""

from __future__ import annotations

import json
import time

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse

from django_idempotency import idempotent
from example_project.payments.models import Charge


def charge_response(charge: Charge) -> HttpResponse:
    return JsonResponse(
        {
            "id": charge.pk,
            "amount": charge.amount,
            "currency": charge.currency,
            "description": charge.description,
            "created": charge.created.isoformat(),
        },
        status=201,
    )


def create_charge(request: HttpRequest) -> HttpResponse:
    if not request.user.is_authenticated:  # with --auth lazy, this reads the user
        return JsonResponse({"detail": "Authentication required."}, status=401)
    data = json.loads(request.body)
    charge = Charge.objects.create(
        amount=data["amount"], currency=data["currency"], description=data.get("description", "")
    )
    return charge_response(charge)


async def create_charge_async(request: HttpRequest) -> HttpResponse:
    """The same charge as an ``async def`` view (benchmarks/scale.py under uvicorn)."""
    data = json.loads(request.body)
    charge = await Charge.objects.acreate(
        amount=data["amount"], currency=data["currency"], description=data.get("description", "")
    )
    return charge_response(charge)


#: How long the hot key's view works: long enough that 100 duplicates arrive while it runs.
HOT_SECONDS = 0.5


def hot_charge(request: HttpRequest) -> HttpResponse:
    """A charge whose work takes ``HOT_SECONDS`` (benchmarks/scale.py's hot key)."""
    time.sleep(HOT_SECONDS)
    return create_charge(request)


def django_only(request: HttpRequest) -> HttpResponse:
    """A constant answer: Django's request handling and the auth query, a floor for a replay."""
    return JsonResponse({"id": 0}, status=201)


bare = create_charge
#: The bare view in one transaction: what Django's ``atomic()`` costs an atomic-mode view alone.
bare_atomic = transaction.atomic(create_charge)
two_phase = idempotent(required=True)(create_charge)
atomic = idempotent(required=True, atomic=True)(create_charge)
#: benchmarks/scale.py: the async view under uvicorn, and one hot key's duplicates answered 409
#: (the default) or held until the first attempt's result (``in_progress="wait"``).
async_bare = create_charge_async
async_two_phase = idempotent(required=True)(create_charge_async)
hot = idempotent(required=True)(hot_charge)
hot_wait = idempotent(required=True, in_progress="wait")(hot_charge)
#: benchmarks/stores.py: the same view with its records in Redis (issue 44).
REDIS = "redis" in getattr(settings, "CACHES", {})
if REDIS:
    two_phase_redis = idempotent(required=True, store="redis")(create_charge)

try:
    from drf_idempotency import idempotent as peer_idempotent
except ImportError:  # the peer is installed in the benchmarks' own environment only
    PEER = False
else:
    PEER = True
    peer_two_phase = peer_idempotent()(create_charge)
    peer_atomic = transaction.atomic(peer_idempotent()(create_charge))
