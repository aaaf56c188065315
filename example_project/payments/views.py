"""The example API: one view of each kind the app protects.

- ``ChargeViewSet``: a DRF viewset with ``IdempotencyMixin``; the key is required, a UUID, and a
  client's ``sent_at`` timestamp does not count in the fingerprint; the charge's receipt is
  sent through the outbox.
- ``RefundView``: a DRF view that records recovery points, so a retry that takes over from a
  crashed attempt resumes where it stopped, and that hands the payment provider a derived key.
- ``create_payout``: a plain Django function view with ``@idempotent`` (key optional).
- ``send_receipt``: an ``async def`` view with ``@idempotent``.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import transaction
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import Claim, idempotent, json_fingerprint
from django_idempotency.rest_framework import IdempotencyMixin
from example_project.payments import provider
from example_project.payments.models import CURRENCIES, Charge, Payout, Receipt, Refund
from example_project.payments.serializers import (
    MAX_AMOUNT,
    ChargeSerializer,
    ReceiptSerializer,
    RefundSerializer,
)
from example_project.payments.tasks import email_receipt


def claim_of(request: Request | HttpRequest) -> Claim:
    """The attempt's claim; views requiring a key always have one on POST."""
    claim: Claim | None = request.idempotency  # type: ignore[union-attr]
    assert claim is not None, "the view requires an Idempotency-Key"
    return claim


# Django answers 404 for an id its URL pattern does not match (a negative one), DRF for a
# missing charge.
NOT_FOUND = OpenApiResponse(description="No such charge.")


@extend_schema_view(retrieve=extend_schema(responses={200: ChargeSerializer, 404: NOT_FOUND}))
class ChargeViewSet(
    IdempotencyMixin,
    mixins.CreateModelMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Charge a card, e.g. `{"amount": 4200, "currency": "usd"}`: at most once per key.

    The provider is called with a key derived from the `Idempotency-Key`, so even a retry
    that takes over from a crashed attempt cannot charge the card twice. The key is a UUID;
    a `sent_at` the client adds to the body (when it sent this attempt) is ignored, so a
    retry stamped later is still the same request.
    """

    queryset = Charge.objects.order_by("-id")
    serializer_class = ChargeSerializer
    idempotency_required = True
    idempotency_key_format = "uuid"
    idempotency_fingerprint = json_fingerprint(exclude=["/sent_at"])

    def perform_create(self, serializer: ChargeSerializer) -> None:
        data = serializer.validated_data
        reference = provider.charge(
            data["amount"],
            data["currency"],
            idempotency_key=claim_of(self.request).derived_key("charge"),
        )
        charge = serializer.save(provider_id=reference)
        # The receipt leaves through the outbox: only once this charge's response is stored,
        # and once per key however often the client retries (docs/outbox.rst).
        claim_of(self.request).enqueue(email_receipt, charge.pk)


class RefundView(IdempotencyMixin, APIView):
    """Refund part of a charge, e.g. `{"amount": 1000}`: at most once per key.

    Two phases, each committed with its recovery point in one transaction: create the refund
    row (the charge locked while what is left is checked), then ask the provider. An attempt
    that takes over after a crash reads the recovery point and skips what the dead attempt
    finished; the provider call carries a derived key, so even a crash between the call and its
    recovery point cannot refund twice.
    """

    idempotency_required = True
    serializer_class = RefundSerializer

    @extend_schema(request=RefundSerializer, responses={201: RefundSerializer, 404: NOT_FOUND})
    def post(self, request: Request, charge_id: int) -> Response:
        charge = get_object_or_404(Charge, pk=charge_id)
        claim = claim_of(request)
        if claim.recovery_point == "":
            with transaction.atomic():
                # The charge's row lock makes concurrent refunds of one charge (each with its own
                # key) check what is left one after the other: without it two could both see
                # the whole amount left, and refund it twice.
                charge = Charge.objects.select_for_update().get(pk=charge.pk)
                serializer = RefundSerializer(data=request.data, context={"charge": charge})
                serializer.is_valid(raise_exception=True)
                refund = serializer.save(charge=charge)
                claim.set_recovery_point("refund_created", {"refund": refund.pk})
        refund = Refund.objects.get(pk=claim.recovery_data["refund"])
        if claim.recovery_point == "refund_created":
            reference = provider.refund(
                charge.provider_id,
                refund.amount,
                charge.currency,
                idempotency_key=claim.derived_key("refund"),
            )
            with transaction.atomic():
                refund.provider_id = reference
                refund.status = Refund.Status.SUCCEEDED
                refund.save(update_fields=["provider_id", "status"])
                claim.set_recovery_point("provider_refunded", {"refund": refund.pk})
        return Response(RefundSerializer(refund).data, status=status.HTTP_201_CREATED)


def _bad_request(detail: str) -> JsonResponse:
    return JsonResponse({"detail": detail}, status=400)


@csrf_exempt
@require_POST
@idempotent
def create_payout(request: HttpRequest) -> HttpResponse:
    """A plain Django view: ``POST /payouts/`` with ``{"amount": 500, "currency": "eur"}``.

    The key is optional here (the default): without one the view runs unprotected.
    """
    try:
        data: Any = json.loads(request.body)
    except ValueError:
        return _bad_request("The body must be JSON.")
    if not isinstance(data, dict):
        return _bad_request("The body must be a JSON object.")
    amount, currency = data.get("amount"), data.get("currency")
    if not isinstance(amount, int) or isinstance(amount, bool) or not 0 < amount <= MAX_AMOUNT:
        return _bad_request(f"amount must be an integer from 1 to {MAX_AMOUNT}.")
    if currency not in dict(CURRENCIES):
        return _bad_request(f"currency must be one of {sorted(dict(CURRENCIES))}.")
    payout = Payout.objects.create(amount=amount, currency=currency)
    return JsonResponse(
        {"id": payout.pk, "amount": payout.amount, "currency": payout.currency}, status=201
    )


@idempotent(required=True)
async def send_receipt(request: HttpRequest, charge_id: int) -> HttpResponse:
    """An async view: ``POST /charges/<id>/receipt/`` with ``{"email": "..."}``."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    charge = await Charge.objects.filter(pk=charge_id).afirst()
    if charge is None:
        return JsonResponse({"detail": "No such charge."}, status=404)
    try:
        body = json.loads(request.body)
    except ValueError:
        return _bad_request("The body must be JSON.")
    serializer = ReceiptSerializer(data=body)
    if not serializer.is_valid():
        return JsonResponse(serializer.errors, status=400)
    receipt = await Receipt.objects.acreate(charge=charge, email=serializer.validated_data["email"])
    return JsonResponse({"id": receipt.pk, "charge": charge.pk, "email": receipt.email}, status=201)


# Not @csrf_exempt and @require_POST: on Django 4.2 they would hide that the view is async.
send_receipt.csrf_exempt = True  # type: ignore[attr-defined]
