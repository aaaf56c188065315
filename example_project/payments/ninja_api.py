"""The example API in django-ninja, beside the DRF one, served under ``/ninja/``.

- ``POST /ninja/charges``: a charge, at most once per key; the key is required and a UUID, and
  a client's ``sent_at`` does not count in the fingerprint (as the DRF charge).
- ``GET /ninja/charges/{id}``: not protected (a safe method).
- ``POST /ninja/charges/{id}/receipts``: an ``async def`` operation; the key is optional.

Its OpenAPI schema is at ``/ninja/openapi.json`` and its docs at ``/ninja/docs``; the schema
fuzzing leg (``.ci/leg-schemathesis``) fuzzes it as it does the DRF API.
"""

from __future__ import annotations

# docs: imports
from typing import Annotated, Literal

from django.http import HttpRequest
from ninja import Field, NinjaAPI, Schema
from ninja.responses import Status

from django_idempotency import Claim, json_fingerprint
from django_idempotency.ninja import idempotent
from example_project.payments import provider
from example_project.payments.models import Charge, Receipt
from example_project.payments.serializers import MAX_AMOUNT

api = NinjaAPI(
    title="Example payments API (django-ninja)",
    version="1.0.0",
    description="Charges made safe to retry with the Idempotency-Key header, in django-ninja.",
    urls_namespace="ninja-payments",
)
# docs: end imports

# docs: schemas
Currency = Literal["usd", "eur", "gbp"]
# Strict: a JSON string is not an amount, as the schema says (schemathesis checks it).
Amount = Annotated[int, Field(strict=True, ge=1, le=MAX_AMOUNT)]


class ChargeIn(Schema):
    amount: Amount
    currency: Currency
    description: Annotated[str, Field(max_length=200)] = ""


class ChargeOut(Schema):
    id: int
    amount: int
    currency: str
    description: str
    provider_id: str


# docs: end schemas


class ReceiptIn(Schema):
    email: Annotated[str, Field(pattern=r"^[^@\s]+@[^@\s]+\.[a-z]{2,}$", max_length=254)]


class ReceiptOut(Schema):
    id: int
    charge: int
    email: str


class NotFound(Schema):
    detail: str


class Invalid(Schema):
    """Ninja's own answer to a request it cannot validate."""

    detail: list[dict[str, object]]


# docs: operation
@api.post("/charges", response={201: ChargeOut})
@idempotent(required=True, key_format="uuid", fingerprint=json_fingerprint(exclude=["/sent_at"]))
def create_charge(request: HttpRequest, payload: ChargeIn) -> Charge:
    """Charge a card, e.g. `{"amount": 4200, "currency": "usd"}`: at most once per key.

    The provider is called with a key derived from the `Idempotency-Key`, so a retry that
    takes over from a crashed attempt cannot charge the card twice.
    """
    claim: Claim = request.idempotency  # type: ignore[attr-defined]
    reference = provider.charge(
        payload.amount, payload.currency, idempotency_key=claim.derived_key("charge")
    )
    return Charge.objects.create(**payload.dict(), provider_id=reference)


# docs: end operation


@api.get("/charges/{charge_id}", response={200: ChargeOut, 404: NotFound, 422: Invalid})
def get_charge(request: HttpRequest, charge_id: int) -> Status[Charge | dict[str, str]]:
    charge = Charge.objects.filter(pk=charge_id).first()
    if charge is None:
        return Status(404, {"detail": "No such charge."})
    return Status(200, charge)


@api.post("/charges/{charge_id}/receipts", response={201: ReceiptOut, 404: NotFound})
@idempotent
async def send_receipt(
    request: HttpRequest, charge_id: int, payload: ReceiptIn
) -> Status[dict[str, object]]:
    """Send a receipt, e.g. `{"email": "ada@example.com"}`; an async operation."""
    charge = await Charge.objects.filter(pk=charge_id).afirst()
    if charge is None:
        return Status(404, {"detail": "No such charge."})
    receipt = await Receipt.objects.acreate(charge=charge, email=payload.email)
    return Status(201, {"id": receipt.pk, "charge": charge.pk, "email": receipt.email})
