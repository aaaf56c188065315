"""A fake payment provider, standing in for Stripe or Adyen.

Like theirs, its API takes an idempotency key: a second call with the same key returns the first
call's result instead of moving money again. The views pass ``request.idempotency.derived_key()``,
which is the same for every attempt of one request, so a retry that takes over from a crashed
attempt cannot charge or refund twice downstream either.

Its ledger is the ``ProviderCall`` table, written outside the view's own work (in two-phase mode
each statement commits at once), as a remote provider's would be.
"""

from __future__ import annotations

import uuid

from django.db import IntegrityError, transaction

from example_project.payments.models import ProviderCall


def _call(operation: str, amount: int, currency: str, idempotency_key: str) -> str:
    if (done := ProviderCall.objects.filter(idempotency_key=idempotency_key).first()) is not None:
        return done.reference
    prefix = "ch" if operation == "charge" else "re"
    try:
        with transaction.atomic():
            call = ProviderCall.objects.create(
                operation=operation,
                amount=amount,
                currency=currency,
                idempotency_key=idempotency_key,
                reference=f"{prefix}_{uuid.uuid4().hex[:24]}",
            )
    except IntegrityError:  # the same key, concurrently
        call = ProviderCall.objects.get(idempotency_key=idempotency_key)
    return call.reference


def charge(amount: int, currency: str, *, idempotency_key: str) -> str:
    """Charge the card; returns the provider's charge reference."""
    return _call("charge", amount, currency, idempotency_key)


def refund(charge_reference: str, amount: int, currency: str, *, idempotency_key: str) -> str:
    """Refund part of ``charge_reference``; returns the provider's refund reference."""
    return _call("refund", amount, currency, idempotency_key)
