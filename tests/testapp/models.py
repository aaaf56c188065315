from __future__ import annotations

from django.db import models


class Execution(models.Model):
    """One row per run of a test view's side effect: counting rows counts executions."""

    label = models.CharField(max_length=100)
    payload = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.label} #{self.pk}"


class Order(models.Model):
    """The example shop's orders (``tests/testapp/shop.py``, ``docs/testing.rst``)."""

    sku = models.CharField(max_length=20)
    quantity = models.PositiveIntegerField()

    def __str__(self) -> str:
        return f"{self.quantity} x {self.sku}"
