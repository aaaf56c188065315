"""The fenced writes at an attempt's end: its result stored or its claim released, and its
recovery points, each tried again while its lock holds and read back by its lock token when a
reply was lost. Their outcomes are reported (:mod:`.reports`) here, whoever asks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta
from enum import Enum
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_idempotency._base import signals
from django_idempotency._base.errors import LockLost
from django_idempotency._call import outbox, storing, telemetry
from django_idempotency._call.attempt import Attempt
from django_idempotency._call.claim import Claim
from django_idempotency._call.reports import report
from django_idempotency._conf.values import display_name
from django_idempotency._store import Store, StoredResponse, deadlines, using
from django_idempotency._store.bound import discard

logger = logging.getLogger("django_idempotency")

#: A write's first and longest pause before it is tried again (seconds).
_FIRST_RETRY = 0.02
_MAX_RETRY = 0.25
#: The bound on connecting again for an owner's write (seconds; libpq's least is 2).
_CONNECT_TIMEOUT = 5


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
    # The outbox's staged messages go with the result (issue 41); None for most requests.
    messages = None if claim.outbox is None else outbox.release(claim)
    with telemetry.span(
        "idempotency.store", identity.method, identity.operation, policy.atomic
    ) as span:
        try:
            written = _fenced_write(
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
                atomic=policy.atomic,
                applied=lambda connection: store.finished(claim.pk, claim.token_text, connection),
            )
        except DatabaseError as exc:
            if policy.atomic:  # the transaction is lost with it: nothing of the attempt is kept
                with store.guard():
                    raise
            if not claim.lock_lost:
                # A fault or contention was tried again until the lock could lapse; any other
                # error (a DataError: a value the database refuses) was raised at once, and
                # trying it again would not help: said as it is, not as an outage.
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
                span.finish("unavailable", claim.attempt)
                return
            # Renewal found the record another attempt's: the fence would refuse the result.
            written = Written.REFUSED
        if messages is not None and written is not Written.REFUSED:
            outbox.released(claim, policy.alias, messages)
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


class Written(Enum):
    """What became of an owner's fenced write (:func:`_fenced_write`)."""

    #: Applied, and its reply received.
    WRITTEN = "written"
    #: Applied by an earlier try whose reply was lost, as the record, read back by the
    #: attempt's lock token, shows (issue 25; said so in the log, issue 39).
    CONFIRMED = "confirmed"
    #: Not applied: the record is no longer this attempt's (taken over, or released).
    REFUSED = "refused"


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


def _fenced_write(
    store: Store,
    claim: Claim,
    write: Callable[[BaseDatabaseWrapper | None, float], bool],
    *,
    atomic: bool,
    applied: Callable[[BaseDatabaseWrapper], bool] | None = None,
) -> Written:
    """Run an owner's fenced write, again while it fails for a reason that passes: giving the
    result (or a recovery point) up would leave the record to be taken over and the view run
    twice.

    ``write(connection, bound)`` runs the write on ``connection`` (``None``: the calling
    thread's own) within ``bound`` seconds, and says whether it matched the record. The bound
    is :func:`.deadlines.bound` of the lock, and no later than the lock could lapse (but a
    second, :data:`.deadlines.LEAST`); past it the connection is cut, a fault like any other (a
    blackhole, issue 39). A store that rides faults out itself (``rides_out_faults``: Redis,
    whose every try is bounded by its socket timeout) is given all the time the lock has left.
    Contention (another writer holds a lock it needs: a SQLite writer, a cleanup batch, an
    operator's transaction; issue 32) is waited out on the same connection. A
    fault (the connection lost, the server restarting, failing over or read-only; issue 25) is
    tried again on a connection of its own, made for the alias and closed after: never the
    thread's, which the project's code may hold in a transaction, and which Django does not
    reopen until the request ends.

    The write may then be the second of a pair whose first was applied and whose reply was lost
    ("commit outcome unknown"). ``applied(connection)`` reads the record back by the lock token
    and says whether it was: asked when such a second write matches nothing, and once more, on
    a new connection, when the last try failed on a fault (a reply lost for longer than the
    lock had left, issue 39).

    Tried with backoff until the claim's lock could lapse (:attr:`.Claim.held_until`), after
    which a retry may own the key and the fence decides. Where the write is part of a
    transaction (``atomic``: atomic mode, or the thread's connection in an atomic block) or the
    claim is (not committed, so no other connection could see it), the error has spoiled the
    transaction: it is raised at once.
    """
    share = deadlines.bound(claim.lock_timeout)
    if atomic or claim.uncommitted:
        return Written.WRITTEN if write(None, share) else Written.REFUSED
    delay = _FIRST_RETRY
    own: BaseDatabaseWrapper | None = None
    try:
        while True:
            left = claim.held_until - time.monotonic()
            try:
                # A store that rides faults out itself (Redis) is given the lock's time left:
                # it raises only when that is spent, never after one share of it (issue 44).
                bound = max(left if store.rides_out_faults else min(share, left), deadlines.LEAST)
                if write(own, bound):
                    return Written.WRITTEN
                if (
                    own is not None
                    and applied is not None
                    and _read_back(store, own, bound, applied)
                ):
                    return Written.CONFIRMED
                return Written.REFUSED
            except DatabaseError as exc:
                fault = store.is_fault(exc)
                if not (fault or store.is_contention(exc)):
                    raise
                if fault and own is None and not store.connection.in_atomic_block:
                    # The thread's connection is broken: closed, so that the thread's next
                    # query (the view's own, after a recovery point) makes a new one; Django
                    # reconnects only between requests otherwise (issue 39).
                    discard(store.connection)
                if time.monotonic() + delay >= claim.held_until:
                    if fault and applied is not None and _applied_after_all(store, own, applied):
                        return Written.CONFIRMED
                    raise
                if fault:
                    own = _reconnect(own, store)
                    logger.warning(
                        "Idempotency store %r failed (%s); writing record %s again on a new "
                        "connection in %.2gs.",
                        display_name(store.alias),
                        exc,
                        claim.pk,
                        delay,
                    )
                else:
                    logger.info(
                        "Idempotency store %r busy; writing again in %.2gs.",
                        display_name(store.alias),
                        delay,
                    )
            time.sleep(delay)
            delay = min(delay * 2, _MAX_RETRY)
    finally:
        if own is not None:
            discard(own)


def _applied_after_all(
    store: Store,
    previous: BaseDatabaseWrapper | None,
    applied: Callable[[BaseDatabaseWrapper], bool],
) -> bool:
    """Whether a write whose every try failed was applied by one whose reply was lost: read
    once, on a new connection (reading changes nothing, so the lapsed lock does not matter)."""
    connection = _reconnect(previous, store)
    try:
        return _read_back(store, connection, deadlines.LEAST, applied)
    except DatabaseError:
        return False
    finally:
        discard(connection)


def _read_back(
    store: Store,
    connection: BaseDatabaseWrapper,
    bound: float,
    applied: Callable[[BaseDatabaseWrapper], bool],
) -> bool:
    """``applied(connection)`` within ``bound`` seconds: a read on a silent connection is cut
    as a write is (issue 39)."""
    return store.bounded(connection, bound, lambda: applied(connection))


def _reconnect(previous: BaseDatabaseWrapper | None, store: Store) -> BaseDatabaseWrapper:
    """A new connection object for the store's alias (connected when first used), with a bound
    on connecting: a server that drops packets must not hold the owner past its lock."""
    if previous is not None:
        discard(previous)
    connection = connections[store.alias].copy()
    if store.has_server:
        options = connection.settings_dict.setdefault("OPTIONS", {})
        options.setdefault("connect_timeout", _CONNECT_TIMEOUT)
        # Not one of Django's pool (PostgreSQL), which may hold more connections the fault
        # killed or silenced, and waits its own timeout for a new one (issue 39).
        options.pop("pool", None)
    return connection


def release(attempt: Attempt, *, reason: str, raised: bool, undo: bool = False) -> None:
    """Release the claim so a retry runs again.

    A record that may hold a recovery point (:attr:`.Claim.progressed`) is kept, unlocked, so
    that the retry takes it over and resumes from the point instead of repeating every effect
    before it (issue 39; docs/recovery.rst says why); any other is deleted. In atomic mode an
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
                store = using(policy.alias)
                free = store.unlock if keep else store.release
                _fenced_write(
                    store,
                    claim,
                    lambda connection, bound: free(
                        claim.pk, claim.token_text, connection=connection, bound=bound
                    ),
                    atomic=policy.atomic,
                )
        except DatabaseError:
            if policy.atomic:
                raise
            span.finish("unavailable", claim.attempt)
            report(
                "unavailable",
                attempt,
                logging.ERROR,
                "Could not release idempotency record %s.",
                claim.pk,
                exc_info=True,
            )
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


def save_recovery_point(claim: Claim, name: str, data: Any) -> None:
    """Write a recovery point as durably as the result (:func:`_fenced_write`): tried again on
    a new connection while the lock holds, and confirmed by the lock token when the reply to
    the write that applied it was lost (issue 39). Raises
    :class:`~.exceptions.LockLost` when the record is no longer the attempt's, and
    :class:`~.exceptions.StoreUnavailable` when the database did not answer in time, never a
    driver's error: a view's answer is then a ``409`` or a ``503``, and the record is kept at
    its last recovery point for the retry.

    On the thread's connection inside a transaction (the point written with the view's own
    writes, docs/consumers.rst) a fault is raised at once: the transaction is lost with it,
    and a point written on another connection would claim work that was rolled back.
    """
    store = using(claim.alias)
    connection = store.connection
    claim.progressed = True  # applied or not, from now on the record may hold it
    since = time.monotonic()
    messages = None if claim.outbox is None else outbox.release(claim)
    try:
        written = _fenced_write(
            store,
            claim,
            lambda own, bound: store.save_recovery_point(
                claim.pk,
                claim.token_text,
                name,
                data,
                claim.lock_timeout,
                connection=own,
                bound=bound,
                release=messages,
            ),
            atomic=connection.in_atomic_block,
            applied=lambda own: store.has_recovery_point(claim.pk, claim.token_text, name, own),
        )
    except DatabaseError as exc:
        logger.warning(
            "Idempotency record %s: could not save recovery point %r (%s).", claim.pk, name, exc
        )
        raise store.refusal(exc) from exc
    if written is Written.REFUSED:
        raise LockLost(f"The lock on idempotency record {claim.pk} was taken over.")
    outbox.released(claim, store.alias, messages)
    claim.held_for(since)


Claim.save_point = save_recovery_point
