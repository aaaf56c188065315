"""One protected call as the core carries it: what it claims as, the policy it runs under, the
claim once made, and what signal receivers get as its ``request``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django_idempotency._call import telemetry
from django_idempotency._call.claim import Claim
from django_idempotency._call.identity import Identity
from django_idempotency._conf.options import Policy


@dataclass(slots=True)
class Attempt:
    """The one value the claim loop, the writes, their reports and the renewer take, instead
    of an identity, a policy and a claim side by side. Made by the lifecycle once
    its adapter has identified the call; slotted and not ``frozen`` (for
    :class:`.Identity`'s reasons), since :attr:`claim` is set once the claim is made."""

    identity: Identity
    policy: Policy
    #: What every signal gets as ``request``, supplied by the adapter (the view's
    #: ``HttpRequest``; ``None`` for a function). Handed on as it is: the core never reads it,
    #: and knows no HTTP type.
    request: object = None
    #: The claim, once made (``None``: not yet, or the key was found another call's).
    claim: Claim | None = None

    @property
    def code(self) -> str:
        """What the protected code is, as the log names it."""
        return "function" if self.request is None else "view"

    def context(self) -> dict[str, Any]:
        """The keyword arguments every signal gets."""
        identity = self.identity
        return {"request": self.request, "scope": identity.scope, "key_hash": identity.key_hash}

    def attributes(self) -> dict[str, str]:
        """The low-cardinality attributes of its metrics and spans (never key or scope)."""
        identity = self.identity
        return telemetry.labels(identity.method, identity.operation, self.policy.atomic)
