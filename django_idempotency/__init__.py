"""Make state-changing Django endpoints safe to retry with the ``Idempotency-Key`` header."""

from __future__ import annotations

__version__ = "0.1.0.dev0"
