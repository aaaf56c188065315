"""An attempt's outcomes, each logged, signalled and counted from one place, so that the three
cannot drift: the claim loop's (:mod:`.claiming`), the writes' (:mod:`.writing`) and the
adapters' refusals before a claim."""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

from django_idempotency._base.errors import StoreUnavailable
from django_idempotency._call import telemetry
from django_idempotency._call.attempt import Attempt
from django_idempotency._conf.options import Policy
from django_idempotency._conf.values import display_name
from django_idempotency._store.rows import instance_of
from django_idempotency.models import IdempotencyKey

logger = logging.getLogger("django_idempotency")


def identity_unavailable(
    attributes: dict[str, str], policy: Policy, exc: StoreUnavailable, what: str = "view"
) -> None:
    """Report a call refused because its scope, fingerprint or key met a database fault,
    before anything was claimed (``unavailable``)."""
    logger.error(
        "Idempotency store %r unavailable: %s; the %s was not run.",
        display_name(policy.alias),
        exc,
        what,
        exc_info=exc,
        extra=telemetry.log_facts("unavailable"),
    )
    telemetry.count("unavailable", attributes)


def key_refused(outcome: str, attributes: dict[str, str], reason: str) -> None:
    """Report a request refused for its key (``missing_key``, ``invalid_key``)."""
    logger.info("Idempotency key refused: %s", reason, extra=telemetry.log_facts(outcome))
    telemetry.count(outcome, attributes)


def report(
    outcome: str,
    attempt: Attempt,
    level: int,
    message: str,
    *args: Any,
    signal: Signal | None = None,
    exc_info: bool = False,
    **sent: Any,
) -> None:
    """Log, signal and count one outcome: from one place, so the three cannot drift.

    ``claimed`` is logged and signalled but not counted: the attempt's end is. What it says of
    the claim is the attempt's (:attr:`.Attempt.claim`: none until it is made).
    """
    claim = attempt.claim
    if logger.isEnabledFor(level):  # the facts hash the scope: not for a line not logged
        if claim is None:
            identity = attempt.identity
            facts = telemetry.log_facts(outcome, identity.key_hash, identity.scope)
        else:
            facts = claim.facts(outcome)
        logger.log(level, message, *args, exc_info=exc_info, extra=facts)
    if signal is not None and signal.receivers:  # nothing made for a signal nobody receives
        if claim is not None:
            sent["claim"] = claim
        if "record" in sent:
            sent["record"] = instance_of(sent["record"])
        signal.send(IdempotencyKey, **attempt.context(), **sent)
    if outcome in telemetry.OUTCOMES and telemetry.counting():  # attributes for a kept count
        telemetry.count(outcome, attempt.attributes())
