"""The benchmark's view: the example project's charge, without DRF.

It parses the JSON body, inserts a ``Charge`` row, and renders it as JSON: the work of a
small real endpoint, so that the ratios mean something. The same function is served bare and
protected in each mode, and, when ``drf-idempotency`` is installed (the benchmarks' peer), by
its decorator: alone (its only mode) and inside one transaction (``transaction.atomic``, as
``ATOMIC_REQUESTS`` would run it), the peer's counterparts of our two modes.
"""

from __future__ import annotations

import json

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse

from django_idempotency import idempotent
from example_project.payments.models import Charge


def create_charge(request: HttpRequest) -> HttpResponse:
    if not request.user.is_authenticated:  # with --auth lazy, this reads the user
        return JsonResponse({"detail": "Authentication required."}, status=401)
    data = json.loads(request.body)
    charge = Charge.objects.create(
        amount=data["amount"], currency=data["currency"], description=data.get("description", "")
    )
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


def django_only(request: HttpRequest) -> HttpResponse:
    """A constant answer: Django's request handling and the auth query, a floor for a replay."""
    return JsonResponse({"id": 0}, status=201)


bare = create_charge
#: The bare view in one transaction: what Django's ``atomic()`` costs an atomic-mode view alone.
bare_atomic = transaction.atomic(create_charge)
two_phase = idempotent(required=True)(create_charge)
atomic = idempotent(required=True, atomic=True)(create_charge)
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
