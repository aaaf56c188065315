"""What a protected call claims as: its key, whose it is, and what must match on a retry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest

from django_idempotency._call import telemetry


@dataclass(slots=True)
class Identity:
    """One protected call as the store and the reports see it; computed once per call (the
    scope and fingerprint functions are the project's, and may be costly). Not changed once
    made; not ``frozen``, whose ``__init__`` costs every protected call three times as much
    (issue 28)."""

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
    request: HttpRequest | None = None
    #: What metrics and spans name the call by: the URL route, or the function's name.
    operation: str = ""

    def context(self) -> dict[str, Any]:
        """The keyword arguments every signal gets."""
        return {"request": self.request, "scope": self.scope, "key_hash": self.key_hash}

    def attributes(self, atomic: bool) -> dict[str, str]:
        """The low-cardinality attributes of its metrics and spans (never key or scope)."""
        return telemetry.labels(self.method, self.operation, atomic)


def full_path(request: HttpRequest) -> str:
    """``request.get_full_path()``, made once per request: the identity and the default
    fingerprint both read it, and it quotes the whole path each time."""
    path: str | None = request.__dict__.get(_FULL_PATH)
    if path is None:
        path = request.__dict__[_FULL_PATH] = request.get_full_path()
    return path


_FULL_PATH = "_idempotency_full_path"
