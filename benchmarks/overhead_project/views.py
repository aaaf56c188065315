"""The benchmark's view: the example project's charge, without DRF.

It parses the JSON body, inserts a ``Charge`` row, and renders it as JSON: the work of a
small real endpoint, so that the ratios mean something. The same function is served bare and
protected in each mode.
"""

from __future__ import annotations

import json

from django.http import HttpRequest, HttpResponse, JsonResponse

from django_idempotency.decorators import idempotent
from example_project.payments.models import Charge


def create_charge(request: HttpRequest) -> HttpResponse:
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
two_phase = idempotent(required=True)(create_charge)
atomic = idempotent(required=True, atomic=True)(create_charge)
