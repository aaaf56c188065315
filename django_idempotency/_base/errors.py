"""Exceptions the app raises into user code."""

from __future__ import annotations

from datetime import datetime

__all__ = [
    "IdempotencyError",
    "IdempotencyFailed",
    "IdempotencyInProgress",
    "IdempotencyKeyMismatch",
    "InvalidKey",
    "LockLost",
    "LockWaitTimeout",
    "OperationError",
    "StoreUnavailable",
    "UnreplayableResponse",
]


class IdempotencyError(Exception):
    """Base class of the app's exceptions."""


class InvalidKey(IdempotencyError, ValueError):
    """The key is not a usable key (the header's value, or a function's ``key``); the message
    is safe to show to the client. A ``ValueError`` too, as before 1.0."""


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


class IdempotencyInProgress(IdempotencyError):
    """Another call holds the key and has not finished (:mod:`django_idempotency._function`).

    The function did not run. A consumer leaves the message for redelivery (or retries the task
    later): by then the first call has stored its result, which the retry returns, or it died
    and the retry takes the key over once ``unlock_at`` has passed.
    """

    def __init__(self, message: str, *, unlock_at: datetime | None = None) -> None:
        super().__init__(message)
        #: When the holder's lock expires (``None`` when unknown): a sensible redelivery delay.
        self.unlock_at = unlock_at


class IdempotencyKeyMismatch(IdempotencyError):
    """The key was used before by a call with other arguments (another payload).

    The function did not run and the stored record is untouched: the key is being reused for a
    different message, which is a bug on the sending side. The counterpart of the HTTP
    ``idempotency-key-reuse`` problem.
    """


class IdempotencyFailed(IdempotencyError):
    """The key's record holds a definite failure, not a result: the function will not run.

    Only an operator makes one for a function call (``idempotency_recover --fail`` on a stale
    record). The outcome is final, so a consumer acknowledges the message.
    """


class OperationError(IdempotencyError):
    """``complete_operation()`` refused: the operation is unknown (or its record was erased),
    expired, already completed, or its request has not stored its own response yet.
    :attr:`reason` says which: ``"unknown"``, ``"expired"``, ``"completed"`` or ``"running"``.
    A redelivered task that finds ``"completed"`` has nothing left to do."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason
