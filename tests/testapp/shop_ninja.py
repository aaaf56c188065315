"""The example shop's django-ninja API of docs/testing.rst (issue 38), served under
``/shop/ninja/``; tests/test_testing_docs.py holds the documented tests of it."""

from __future__ import annotations

from django.http import HttpRequest

# docs: ninja
from ninja import Field, NinjaAPI, Schema
from ninja.security import APIKeyHeader

from django_idempotency.ninja import idempotent
from tests.testapp.models import Order


class ApiKey(APIKeyHeader):
    param_name = "X-API-Key"

    def authenticate(self, request: HttpRequest, key: str | None) -> str | None:
        return key if key in ("alice-key", "bob-key") else None  # your key lookup


api = NinjaAPI(auth=ApiKey(), urls_namespace="shop-ninja")


class OrderIn(Schema):
    sku: str = Field(max_length=20)
    quantity: int = Field(ge=1, le=1000)


class OrderOut(Schema):
    id: int


@api.post("/orders", response={201: OrderOut})
@idempotent(required=True)
def place_order(request: HttpRequest, order: OrderIn) -> dict[str, int]:
    return {"id": Order.objects.create(sku=order.sku, quantity=order.quantity).pk}


# docs: end ninja
