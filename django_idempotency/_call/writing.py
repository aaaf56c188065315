"""The writes at an attempt's end: its result stored or its claim released, each fenced by its
lock token (:mod:`.fencing`). Their outcomes are reported (:mod:`.reports`) here, whoever asks.
A recovery point is written by the claim itself (:meth:`.Claim.save_point`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from django.db import DatabaseError, transaction

from django_idempotency._base import signals
from django_idempotency._call import outbox, storing, telemetry
from django_idempotency._call.attempt import Attempt
from django_idempotency._call.claim import Claim
from django_idempotency._call.fencing import Written, fenced_write
from django_idempotency._call.reports import report
from django_idempotency._store import StoreContract, StoredResponse, using
from django_idempotency._store.outbox import Release


def conclude(
    attempt: Attempt,
    mark: storing.Storage | None,
    capture: Callable[[timedelta | None], StoredResponse],
) -> None:
    """The end of an attempt whose code returned, for every entry point: a result marked by
    ``no_store()`` releases the key; any other is stored, ``capture(ttl)`` making it what the
    record keeps with the TTL of ``store_for()`` (``None``: the claim's)."""
    if mark is not None and not mark.stored:
        release(attempt, reason=storing.NO_STORE_REASON, raised=False)
        return
    complete(attempt, capture(None if mark is None else mark.ttl))


def complete(attempt: Attempt, stored: StoredResponse) -> None:
    """Store an attempt's final result, fenced by its lock token.

    In two-phase mode a database error is logged, not raised: the record stays ``processing``
    and is taken over once ``unlock_at`` passes (docs: "The crash window"). In atomic mode it
    is raised as :class:`~.exceptions.LockWaitTimeout` (a deadlock: on a Galera cluster another
    node's claim of the key aborted this transaction) or :class:`~.exceptions.StoreUnavailable`.
    """
    claim, identity, policy = attempt.claim, attempt.identity, attempt.policy
    assert claim is not None, "a write of an attempt whose claim was not made"
    store = using(policy.alias)
    # The outbox's staged messages go with the result; None for most requests.
    messages = None if claim.outbox is None else outbox.release(claim)
    with telemetry.span(
        "idempotency.store", identity.method, identity.operation, policy.atomic
    ) as span:
        try:
            written = _store_result(store, claim, stored, messages, atomic=policy.atomic)
        except DatabaseError as exc:
            if policy.atomic:  # the transaction is lost with it: nothing of the attempt is kept
                with store.guard():
                    raise
            if not claim.lock_lost:
                _not_stored(attempt, claim, store, exc)
                span.finish("unavailable", claim.attempt)
                return
            # Renewal found the record another attempt's: the fence would refuse the result.
            written = Written.REFUSED
        if messages is not None and written is not Written.REFUSED:
            outbox.released(claim, store, messages)
        outcome = "late_result_refused" if written is Written.REFUSED else "executed"
        report(
            outcome,
            attempt,
            _STORED_LEVELS[written],
            _STORED_MESSAGES[written],
            claim.pk,
            claim.attempt,
            signal=signals.late_result_refused if written is Written.REFUSED else None,
            response=stored,
        )
        span.finish(outcome, claim.attempt)


def _store_result(
    store: StoreContract,
    claim: Claim,
    stored: StoredResponse,
    messages: Release | None,
    *,
    atomic: bool,
) -> Written:
    """The result's fenced write, the outbox's staged ``messages`` released with it; a write
    whose reply was lost is confirmed by the record, finished under the lock token."""
    return fenced_write(
        store,
        claim,
        lambda connection, bound: store.store_response(
            claim.pk,
            claim.token_text,
            stored,
            connection=connection,
            bound=bound,
            release=messages,
        ),
        atomic=atomic,
        applied=lambda connection: store.finished(claim.pk, claim.token_text, connection),
    )


def _not_stored(attempt: Attempt, claim: Claim, store: StoreContract, exc: DatabaseError) -> None:
    """A two-phase result that could not be stored, reported as what it was. A fault or
    contention was tried again until the lock could lapse; any other error (a DataError: a
    value the database refuses) was raised at once, and trying it again would not help: said
    as it is, not as an outage."""
    why = (
        "the database did not answer before its lock could lapse"
        if store.is_fault(exc) or store.is_contention(exc)
        else f"the database refused the write ({type(exc).__name__}: {exc})"
    )
    report(
        "unavailable",
        attempt,
        logging.ERROR,
        "Could not store the result of idempotency record %s: %s. A retry after its "
        "lock lapses runs the %s again.",
        claim.pk,
        why,
        attempt.code,
        exc_info=True,
    )


_STORED_LEVELS = {
    Written.WRITTEN: logging.DEBUG,
    Written.CONFIRMED: logging.INFO,
    Written.REFUSED: logging.ERROR,
}
_STORED_MESSAGES = {
    Written.WRITTEN: "Stored the result of idempotency record %s (attempt %s).",
    Written.CONFIRMED: "Stored the result of idempotency record %s (attempt %s); the reply to "
    "its write was lost, and the record, finished under the attempt's lock token, confirms it.",
    Written.REFUSED: "Idempotency record %s: attempt %s finished after its lock was taken over; "
    "its result was refused. Raise lock_timeout above the longest run.",
}


def release(attempt: Attempt, *, reason: str, raised: bool, undo: bool = False) -> None:
    """Release the claim so a retry runs again.

    A record that may hold a recovery point (:attr:`.Claim.progressed`) is kept, unlocked, so
    that the retry takes it over and resumes from the point instead of repeating every effect
    before it (docs/recovery.rst says why); any other is deleted. In atomic mode an
    exception (``raised``) rolls the claim back with the transaction, recovery points
    included, and so does a retryable status (``undo``: a ``5xx``, ``429``, ``408``), the
    view's own writes with it: committed, they would keep a charge whose retry runs the view
    again (a second charge) and whose staged messages (its receipt) are never released. Only
    ``no_store()`` (a response the client may use, not kept) writes the release, which
    commits with the view's work.
    """
    claim, identity, policy = attempt.claim, attempt.identity, attempt.policy
    assert claim is not None, "a write of an attempt whose claim was not made"
    keep = claim.progressed
    with telemetry.span(
        "idempotency.release", identity.method, identity.operation, policy.atomic
    ) as span:
        try:
            if policy.atomic and (raised or undo):
                if not raised:
                    transaction.set_rollback(True, using=policy.alias)
            else:
                _free(using(policy.alias), claim, keep=keep, atomic=policy.atomic)
        except DatabaseError:
            if policy.atomic:
                raise
            span.finish("unavailable", claim.attempt)
            _not_released(attempt, claim)
            return
        span.finish("released", claim.attempt)
        report(
            "released",
            attempt,
            logging.INFO,
            "Released idempotency record %s (%s); kept at its recovery point for the retry."
            if keep and not (policy.atomic and (raised or undo))
            else "Released idempotency record %s (%s).",
            claim.pk,
            reason,
            signal=signals.key_released,
            reason=reason,
        )


def _free(store: StoreContract, claim: Claim, *, keep: bool, atomic: bool) -> None:
    """The claim's lock given up by a fenced write: the record unlocked where it may hold a
    recovery point (``keep``) for the retry to resume from, deleted otherwise."""
    free = store.unlock if keep else store.release
    fenced_write(
        store,
        claim,
        lambda connection, bound: free(
            claim.pk, claim.token_text, connection=connection, bound=bound
        ),
        atomic=atomic,
    )


def _not_released(attempt: Attempt, claim: Claim) -> None:
    """A two-phase release that failed is logged, not raised: the record stays locked, and
    the retry takes it over once its lock lapses."""
    report(
        "unavailable",
        attempt,
        logging.ERROR,
        "Could not release idempotency record %s.",
        claim.pk,
        exc_info=True,
    )
