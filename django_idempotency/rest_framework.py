"""``IdempotencyMixin`` for Django REST framework views, and ``exception_handler`` (DRF's
``EXCEPTION_HANDLER``: a database fault in DRF's own authentication is a ``503``, not a
``500``); importing this module imports DRF."""

from __future__ import annotations

from django_idempotency._http.drf import IdempotencyMixin, exception_handler

__all__ = ["IdempotencyMixin", "exception_handler"]
