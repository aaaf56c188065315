from __future__ import annotations

from django.db import models

CURRENCIES = [("usd", "US dollar"), ("eur", "Euro"), ("gbp", "Pound sterling")]


class Charge(models.Model):
    """A card charge; ``provider_id`` is the fake provider's reference."""

    amount = models.PositiveIntegerField(help_text="In the currency's minor unit (cents).")
    currency = models.CharField(max_length=3, choices=CURRENCIES)
    description = models.CharField(max_length=200, blank=True)
    provider_id = models.CharField(max_length=64, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.amount} {self.currency} ({self.provider_id or 'pending'})"


class Refund(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        SUCCEEDED = "succeeded"

    charge = models.ForeignKey(Charge, on_delete=models.CASCADE, related_name="refunds")
    amount = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    provider_id = models.CharField(max_length=64, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"refund of {self.amount} on charge {self.charge_id} ({self.status})"


class Payout(models.Model):
    """Made by the plain Django function view."""

    amount = models.PositiveIntegerField()
    currency = models.CharField(max_length=3, choices=CURRENCIES)
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"payout of {self.amount} {self.currency}"


class Receipt(models.Model):
    """Made by the async view."""

    charge = models.ForeignKey(Charge, on_delete=models.CASCADE, related_name="receipts")
    email = models.EmailField()
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"receipt for charge {self.charge_id} to {self.email}"


class ProviderCall(models.Model):
    """The fake payment provider's own ledger (see ``provider.py``).

    A real provider keeps this on its side; the fake keeps it here so that its answer to a
    repeated idempotency key survives a crash of the process that called it.
    """

    operation = models.CharField(max_length=16)
    amount = models.PositiveIntegerField()
    currency = models.CharField(max_length=3)
    idempotency_key = models.CharField(max_length=255, unique=True)
    reference = models.CharField(max_length=64, unique=True)
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.operation} {self.reference}"
