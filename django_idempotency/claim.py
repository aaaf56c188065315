"""``request.idempotency``: what a protected view knows of its own attempt."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django_idempotency.exceptions import LockLost

__all__ = ["Claim"]

_DERIVED_NAMESPACE = uuid.UUID("5b0c3c52-7e4b-4a43-9d0c-2a7c1c0f6d11")


@dataclass
class Claim:
    """The attempt that owns a record.

    ``attempt`` is 1 for the first attempt and grows with each takeover of a stale record;
    ``recovery_point`` and ``recovery_data`` are where the previous attempt got to.
    """

    key: str
    scope: str
    key_hash: str
    pk: int
    lock_token: uuid.UUID
    attempt: int
    recovery_point: str
    recovery_data: Any
    alias: str = field(repr=False)
    lock_timeout: timedelta = field(repr=False)
    #: The engine's write of a recovery point (logged, fenced), given by the engine that
    #: claimed the record: the claim sits below it.
    save_progress: Callable[[Claim, str, Any], None] = field(repr=False, compare=False)
    #: Set (from the renewer's thread) when a renewal found the record no longer this
    #: attempt's: taken over after its lock expired, or released by an operator.
    lock_lost: bool = field(default=False, repr=False, compare=False)

    @property
    def is_takeover(self) -> bool:
        return self.attempt > 1

    def check_held(self) -> None:
        """Raise :class:`~django_idempotency.LockLost` if the attempt is known to
        have lost its record (:attr:`lock_lost`)."""
        if self.lock_lost:
            raise LockLost(
                f"The lock on idempotency record {self.pk} was lost (taken over or released); "
                "stop: another attempt owns the key."
            )

    def set_recovery_point(self, name: str, data: Any = None) -> None:
        """Record that the view got as far as ``name`` (with JSON ``data``) and renew the lock.

        In two-phase mode this commits at once, so a retry that takes over after a crash
        resumes from here. Raises :class:`~django_idempotency.LockLost` when another
        attempt has taken the record over: stop, the new owner is doing the work.
        """
        self.check_held()
        self.save_progress(self, name, data)
        self.recovery_point = name
        self.recovery_data = data

    def derived_key(self, purpose: str = "") -> str:
        """A UUID for a downstream service's own idempotency key, stable across every attempt.

        It depends only on the scope, the key and ``purpose``, so a retried or taken-over attempt
        hands the payment provider the same key and cannot charge twice downstream. Raises
        :class:`~django_idempotency.LockLost` once lock renewal found the record
        taken: the new owner makes the downstream call.
        """
        self.check_held()
        return str(uuid.uuid5(_DERIVED_NAMESPACE, f"{self.scope}\0{self.key_hash}\0{purpose}"))
