"""What a protected call claims as: its key, whose it is, and what must match on a retry; and the
claim it takes (``claimed``: the store's ``Claimant``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django_idempotency._call.claim import Claim

if TYPE_CHECKING:
    from django_idempotency._store import ClaimHandle


@dataclass(slots=True)
class Identity:
    """One protected call as the store and the reports see it; computed once per call (the
    scope and fingerprint functions are the project's, and may be costly). Not changed once
    made; not ``frozen``, whose ``__init__`` costs every protected call three times as much."""

    #: The client's idempotency key (a header's value, or a function's argument).
    key: str
    #: Whose key it is (``SCOPE_FUNCTION``, a view's ``scope``, a function's name and scope).
    scope: str
    #: The key as the record keeps it (SHA-256).
    key_hash: str
    #: What a retry must repeat to be the same request (the record's ``request_hash``).
    fingerprint: str
    method: str
    path: str
    #: What metrics and spans name the call by: the URL route, or the function's name.
    operation: str = ""

    def claimed(
        self,
        *,
        pk: ClaimHandle,
        token_text: str,
        attempt: int,
        recovery_point: str,
        recovery_data: Any,
        alias: str,
        lock_timeout: timedelta,
        held_until: float,
        uncommitted: bool,
        life: Any = None,
    ) -> Claim:
        """This call's claim on record ``pk``, made by the store (a ``Claimant``'s part)."""
        return Claim(
            self,
            pk,
            token_text,
            attempt,
            recovery_point,
            recovery_data,
            alias,
            lock_timeout,
            held_until=held_until,
            uncommitted=uncommitted,
            known_life=life,
        )
