"""``IdempotencyMixin`` for Django REST framework views; importing this module imports DRF."""

from __future__ import annotations

from django_idempotency._http.drf import IdempotencyMixin

__all__ = ["IdempotencyMixin"]
