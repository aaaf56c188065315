"""The example shop of docs/testing.rst: a DRF viewset, a function view and a consumer, each
protected; tests/test_testing_docs.py holds the documented tests of them."""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, JsonResponse
from rest_framework import permissions, serializers, viewsets

from django_idempotency import idempotent, idempotent_function
from django_idempotency.rest_framework import IdempotencyMixin
from tests.testapp.models import Order


# docs: viewset
class OrderSerializer(serializers.ModelSerializer[Order]):
    class Meta:
        model = Order
        fields = ["id", "sku", "quantity"]


class OrderViewSet(IdempotencyMixin, viewsets.ModelViewSet):  # type: ignore[type-arg]
    queryset = Order.objects.all()
    serializer_class = OrderSerializer
    permission_classes = [permissions.IsAuthenticated]
    idempotency_required = True


# docs: end viewset


# docs: view
@idempotent
def checkout(request: HttpRequest) -> JsonResponse:
    body = json.loads(request.body)
    claim = request.idempotency  # type: ignore[attr-defined]  # also without a key (falsy)
    if claim.recovery_point != "reserved":
        Order.objects.create(sku=body["sku"], quantity=body["quantity"])  # reserve the stock
        claim.set_recovery_point("reserved")
    # ... charge the customer, with claim.derived_key("charge") as the provider's key ...
    return JsonResponse({"sku": body["sku"], "resumed": claim.is_takeover}, status=201)


# docs: end view


# docs: consumer
@idempotent_function(key="event_id")
def on_order_placed(event_id: str, sku: str, quantity: int) -> dict[str, Any]:
    order = Order.objects.create(sku=sku, quantity=quantity)
    return {"order": order.pk}


# docs: end consumer
