"""Exceptions the app raises into user code."""

from __future__ import annotations


class IdempotencyError(Exception):
    """Base class of the app's exceptions."""


class UnreplayableResponse(IdempotencyError, TypeError):
    """A protected view returned a response that cannot be stored and replayed (streaming)."""


class LockLost(IdempotencyError):
    """This attempt no longer owns its record: its lock expired and another attempt took over.

    Raised by ``request.idempotency.set_recovery_point()``; let it propagate so the stale
    attempt stops before it repeats work the new owner is doing.
    """


class StoreUnavailable(IdempotencyError):
    """The idempotency store (the database) could not be reached."""


class LockWaitTimeout(IdempotencyError):
    """Waiting for another attempt's database lock took longer than the wait limit."""
