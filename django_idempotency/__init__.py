"""Make state-changing Django endpoints safe to retry with the ``Idempotency-Key`` header."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from django_idempotency._storing import no_store, store_for

__all__ = ["__version__", "no_store", "store_for"]

try:
    __version__ = version("django-idempotency")
except PackageNotFoundError:  # run from a checkout, not installed
    __version__ = "0+unknown"
