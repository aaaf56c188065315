"""The claim loop and every write of an attempt, independent of HTTP.

:func:`acquire` is a generator so that waiting is done by the caller: it yields the seconds to
sleep (``time.sleep`` or ``asyncio.sleep``, see :mod:`._lifecycle`) and returns its outcome
through ``StopIteration``. The writes (:func:`conclude`, :func:`complete`, :func:`release`) are
logged and signalled here, whoever asks for them; a recovery point is the claim's own
(:meth:`.Claim.set_recovery_point`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum
from typing import Any, TypeVar, cast

from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.dispatch import Signal
from django.utils import timezone

from django_idempotency._base import rules, signals
from django_idempotency._base.errors import LockLost, LockWaitTimeout, StoreUnavailable
from django_idempotency._call import storing, telemetry
from django_idempotency._call.claim import Claim
from django_idempotency._call.identity import Identity
from django_idempotency._conf.options import Policy
from django_idempotency._store import Store, StoredResponse, deadlines, using
from django_idempotency._store.bound import discard
from django_idempotency._store.claims import new_token
from django_idempotency._store.rows import Record, instance_of
from django_idempotency.models import IdempotencyKey

logger = logging.getLogger("django_idempotency")

_FIRST_WAIT = 0.02
_MAX_WAIT = 0.25
#: The bound on connecting again for an owner's write (seconds; libpq's least is 2).
_CONNECT_TIMEOUT = 5
#: Claims in a row that may meet a concurrent claim or release before the key counts as busy.
_CLAIM_TRIES = 5
#: Of those, claims made again on a new connection after a fault: a pool may hand out a
#: second connection the fault killed before it is drained (issue 39).
RECONNECTS = 3

T = TypeVar("T")
Steps = Generator[float, None, T]


class Kind(str, Enum):
    """Why a live key is not this call's."""

    REPLAY = "replay"
    MISMATCH = "mismatch"
    IN_PROGRESS = "in_progress"


@dataclass(frozen=True)
class Found:
    """The key is live under another call: its stored result, a mismatch, or in flight."""

    kind: Kind
    #: The record as the claim read it: a model instance, or (PostgreSQL) a :class:`Record`
    #: that converts a field when it is read (``instance_of(record)`` for the model's).
    record: IdempotencyKey | Record
    #: Its ``idempotency.outcome``: ``replayed``, ``waited`` (replayed after a wait),
    #: ``mismatch`` or ``conflict``.
    outcome: str


def acquire(identity: Identity, policy: Policy) -> Steps[Claim | Found]:
    """Claim the key, or say why not; waits (by yielding) when the policy is ``"wait"``.

    In atomic mode the claim may wait on a concurrent call's uncommitted row, for at most
    ``wait_timeout``; that limit is lifted again before any code of the caller's runs in the
    same transaction: the view or function that now owns the key, or, when the atomic block is
    a savepoint, the rest of the caller's transaction. (Otherwise the transaction ends at once,
    which lifts it for free.) Raises :class:`~.exceptions.StoreUnavailable` and
    :class:`~.exceptions.LockWaitTimeout`.
    """
    with telemetry.span(
        "idempotency.claim", identity.method, identity.operation, policy.atomic, duration=True
    ) as span:
        try:
            if not policy.atomic:
                outcome = yield from _claim(identity, policy, using(policy.alias))
            else:
                outcome = yield from _bounded_claim(identity, policy)
        except (StoreUnavailable, LockWaitTimeout) as exc:
            span.finish(refused(identity, policy, exc))
            raise
        if isinstance(outcome, Claim):
            span.finish("takeover" if outcome.is_takeover else "claimed", outcome.attempt)
        else:
            span.finish(outcome.outcome)
        return outcome


def finished(identity: Identity, policy: Policy) -> Found | None:
    """Atomic mode: the key's finished record, read before the transaction opens, as a replay
    (or a mismatch); ``None``: there is none, so the key is claimed in the transaction.

    A replay then sends one statement, with no ``BEGIN`` and no ``COMMIT`` (and on MySQL no
    bound on the lock wait to set and put back): the claim would find the same record and
    change nothing (issue 42). A fault here is left to the claim, which meets it again and
    answers it; a connection that died in a restart is closed first, so that the transaction
    opens on a new one.
    """
    store = using(policy.alias)
    try:
        record = store.read_finished(identity, deadlines.bound(policy.lock_timeout))
    except (StoreUnavailable, LockWaitTimeout) as exc:
        if isinstance(exc, StoreUnavailable):
            _reconnect_thread(store, exc)
        return None
    if record is None:
        return None
    with telemetry.span(
        "idempotency.claim", identity.method, identity.operation, policy.atomic, duration=True
    ) as span:
        kind = Kind.REPLAY if record.request_hash == identity.fingerprint else Kind.MISMATCH
        found = _found(kind, record, identity, policy)
        span.finish(found.outcome)
    return found


def _bounded_claim(identity: Identity, policy: Policy) -> Steps[Claim | Found]:
    """Atomic mode's claim, its lock wait bounded by ``wait_timeout`` (see :func:`acquire`)."""
    store = using(policy.alias)
    previous = _watched(store, policy, lambda: store.limit_lock_wait(policy.wait_timeout))
    # A session setting (MySQL) outlives the transaction: it is put back whatever happens.
    always = store.lock_wait_outlives_transaction
    try:
        outcome = yield from _claim(identity, policy, store)
    except BaseException:
        if always:
            _watched(store, policy, lambda: store.restore_lock_wait(previous))
        raise
    if always or isinstance(outcome, Claim) or store.in_nested_transaction():
        _watched(store, policy, lambda: store.restore_lock_wait(previous))
    if isinstance(outcome, Claim):
        # Until the transaction ends: lifecycle.run() lets go (issue 38).
        store.hold(outcome.scope, outcome.key_hash)
    return outcome


def _watched(store: Store, policy: Policy, statement: Callable[[], T]) -> T:
    """A statement of atomic mode's claim besides the claim's own (the lock wait's bound, and
    the first claim's check that the claim function is there), within the claim's bound: on a
    silent connection it would wait for good (issue 39)."""
    try:
        return store.bounded(store.connection, deadlines.bound(policy.lock_timeout), statement)
    except DatabaseError as exc:
        raise store.refusal(exc) from exc


def refused(identity: Identity, policy: Policy, exc: StoreUnavailable | LockWaitTimeout) -> str:
    """Report a claim the store refused; returns the outcome (``unavailable``, ``conflict``)."""
    if isinstance(exc, LockWaitTimeout):
        _outcome(
            "conflict",
            identity,
            policy,
            logging.INFO,
            "Idempotency key %s: an uncommitted claim held it past wait_timeout.",
            identity.key_hash[:12],
        )
        return "conflict"
    _outcome(
        "unavailable",
        identity,
        policy,
        logging.ERROR,
        "Idempotency store %r unavailable; the %s was not run.",
        policy.alias,
        "function" if identity.request is None else "view",
        exc_info=True,
    )
    return "unavailable"


def held_here(
    identity: Identity, policy: Policy, exc: StoreUnavailable
) -> StoreUnavailable | LockWaitTimeout:
    """What a wait for the database's write lock that ran out before the claim is: a ``409``
    (:class:`~.exceptions.LockWaitTimeout`) when an atomic attempt of this process holds the
    key, as a wait on a server's row lock is; otherwise the store unavailable, a ``503``:
    SQLite does not say who holds its lock (issue 38)."""
    store = using(policy.alias)
    if store.is_contention(exc.__cause__ or exc) and store.holds(identity.scope, identity.key_hash):
        return LockWaitTimeout(str(exc))
    return exc


def let_go(claim: Claim, policy: Policy) -> None:
    """An atomic attempt's transaction ended: its key is no longer held here (:func:`held_here`)."""
    using(policy.alias).let_go(claim.scope, claim.key_hash)


def identity_unavailable(
    attributes: dict[str, str], policy: Policy, exc: StoreUnavailable, what: str = "view"
) -> None:
    """Report a call refused because its scope, fingerprint or key met a database fault,
    before anything was claimed (``unavailable``)."""
    logger.error(
        "Idempotency store %r unavailable: %s; the %s was not run.",
        policy.alias,
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


def _outcome(
    outcome: str,
    identity: Identity,
    policy: Policy,
    level: int,
    message: str,
    *args: Any,
    claim: Claim | None = None,
    signal: Signal | None = None,
    exc_info: bool = False,
    **sent: Any,
) -> None:
    """Log, signal and count one outcome: from one place, so the three cannot drift.

    ``claimed`` is logged and signalled but not counted: the attempt's end is.
    """
    if logger.isEnabledFor(level):  # the facts hash the scope: not for a line not logged
        if claim is None:
            facts = telemetry.log_facts(outcome, identity.key_hash, identity.scope)
        else:
            facts = claim.facts(outcome)
        logger.log(level, message, *args, exc_info=exc_info, extra=facts)
    if signal is not None and signal.receivers:  # nothing made for a signal nobody receives
        if claim is not None:
            sent["claim"] = claim
        if "record" in sent:
            sent["record"] = instance_of(sent["record"])
        signal.send(IdempotencyKey, **identity.context(), **sent)
    if outcome in telemetry.OUTCOMES and telemetry.counting():  # attributes for a kept count
        telemetry.count(outcome, identity.attributes(policy.atomic))


def _claim(identity: Identity, policy: Policy, store: Store) -> Steps[Claim | Found]:
    deadline = time.monotonic() + policy.wait_timeout.total_seconds()
    delay = _FIRST_WAIT
    record: IdempotencyKey | Record | None = None
    waited = False
    token = new_token()
    reconnects = 0
    # Atomic mode's claim may wait for another transaction's row, up to wait_timeout.
    bound = deadlines.bound(policy.lock_timeout)
    if policy.atomic:
        bound += policy.wait_timeout.total_seconds()
    for _ in range(_CLAIM_TRIES):
        try:
            outcome = store.claim(
                identity, ttl=policy.ttl, lock_timeout=policy.lock_timeout, token=token, bound=bound
            )
        except StoreUnavailable as exc:
            if reconnects == RECONNECTS or not _reconnect_thread(store, exc):
                raise
            reconnects += 1
            continue
        if outcome is None:
            continue  # raced with another call's claim or release: claim again
        if isinstance(outcome, Claim):
            _announce_claim(outcome, identity, policy)
            return outcome
        record = outcome
        if record.request_hash != identity.fingerprint:
            return _found(Kind.MISMATCH, record, identity, policy)
        if record.status != rules.PROCESSING:
            return _found(Kind.REPLAY, record, identity, policy, waited=waited)
        if policy.in_progress != "wait" or time.monotonic() >= deadline:
            break
        waited = True
        started = time.monotonic()
        while True:
            yield min(delay, max(0.0, deadline - time.monotonic()))
            delay = min(delay * 2, _MAX_WAIT)
            if time.monotonic() >= deadline or _settled(store, identity, bound):
                break
        telemetry.record_wait(time.monotonic() - started, identity.attributes(policy.atomic))
    if record is None:
        record = IdempotencyKey(scope=identity.scope, key_hash=identity.key_hash)
    return _found(Kind.IN_PROGRESS, record, identity, policy)


def _reconnect_thread(store: Store, exc: StoreUnavailable) -> bool:
    """Close the thread's connection to the store after a fault that left it unusable (not
    a server that answered with a refusal: read-only), outside any transaction, so that the
    claim is made once more on a new one; ``False``: not so.

    A persistent connection (``CONN_MAX_AGE``) that died in a restart fails at its first
    statement, which is the claim when nothing of the request used it before: Django reconnects
    only between requests, or with ``CONN_HEALTH_CHECKS`` (issue 25). So does a connection
    Django's pool hands out, which it checks only with ``CONN_HEALTH_CHECKS``, and one cut
    when the claim outlasted its bound (a blackhole; issue 39). The view has not run, no
    transaction is lost, and the claim is made with the same lock token, so a first claim
    applied with its reply lost is found as this call's own. A pooled connection is closed
    before it goes back, so the pool drops it.
    """
    connection = store.connection
    if (
        connection.in_atomic_block
        or connection.connection is None  # connecting failed: so would connecting again
        or not store.is_fault(exc.__cause__ or exc)
        or connection.is_usable()
    ):
        return False
    logger.warning(
        "Idempotency store %r failed (%s); claiming again on a new connection.", store.alias, exc
    )
    discard(connection)
    store.faulted(exc.__cause__ or exc)
    return True


def claim_again(policy: Policy, connection: BaseDatabaseWrapper, exc: StoreUnavailable) -> bool:
    """Whether atomic mode's attempt may start again in a new transaction after its claim
    met a fault (issue 39): nothing ran before the claim in the transaction (the caller's own,
    ``ATOMIC_REQUESTS``, is not ours to start again), and the view has not run. The
    transaction's end dropped the connection whose rollback failed (or, when entering the
    transaction failed, it is dropped here); the next is a new one. A server that refuses
    writes for now (read-only) refuses them again, at the cost of a round trip:
    :data:`RECONNECTS` bounds the tries."""
    store = using(policy.alias)
    if connection.in_atomic_block or not store.is_fault(exc.__cause__ or exc):
        return False
    if connection.connection is not None and not connection.is_usable():
        discard(connection)  # entering the block failed (MySQL): nothing closed it
    store.faulted(exc.__cause__ or exc)
    logger.warning(
        "Idempotency store %r failed (%s); claiming again in a new transaction.",
        policy.alias,
        exc,
    )
    return True


def _settled(store: Store, identity: Identity, bound: float) -> bool:
    """Whether a waiter's key stopped being live in flight (finished, released or stale)."""
    lock = store.peek_status(identity.scope, identity.key_hash, bound)
    return (
        lock is None or lock.status != rules.PROCESSING or rules.STALE.holds(lock, timezone.now())
    )


def _announce_claim(claim: Claim, identity: Identity, policy: Policy) -> None:
    if claim.is_takeover:
        _outcome(
            "takeover",
            identity,
            policy,
            logging.WARNING,
            "Took over stale idempotency record %s (attempt %s, recovery point %r).",
            claim.pk,
            claim.attempt,
            claim.recovery_point,
            claim=claim,
            signal=signals.key_taken_over,
        )
    else:
        _outcome(
            "claimed",
            identity,
            policy,
            logging.DEBUG,
            "Claimed idempotency record %s.",
            claim.pk,
            claim=claim,
            signal=signals.key_claimed,
        )


_FOUND_SIGNALS = {
    Kind.REPLAY: signals.response_replayed,
    Kind.MISMATCH: signals.fingerprint_mismatch,
    Kind.IN_PROGRESS: signals.request_in_progress,
}
_FOUND_OUTCOMES = {Kind.REPLAY: "replayed", Kind.MISMATCH: "mismatch", Kind.IN_PROGRESS: "conflict"}


def _found(
    kind: Kind,
    record: IdempotencyKey | Record,
    identity: Identity,
    policy: Policy,
    *,
    waited: bool = False,
) -> Found:
    outcome = "waited" if waited and kind is Kind.REPLAY else _FOUND_OUTCOMES[kind]
    _outcome(
        outcome,
        identity,
        policy,
        logging.DEBUG if kind is Kind.REPLAY else logging.INFO,
        "Idempotency key %s: %s.",
        identity.key_hash[:12],
        kind.replace("_", " "),
        signal=_FOUND_SIGNALS[kind],
        record=record,
    )
    return Found(kind, record, outcome)


def conclude(
    claim: Claim,
    identity: Identity,
    policy: Policy,
    mark: storing.Storage | None,
    capture: Callable[[timedelta | None], StoredResponse],
) -> None:
    """The end of an attempt whose code returned, for every entry point: a result marked by
    ``no_store()`` releases the key; any other is stored, ``capture(ttl)`` making it what the
    record keeps with the TTL of ``store_for()`` (``None``: the claim's)."""
    if mark is not None and not mark.stored:
        release(claim, identity, policy, reason=storing.NO_STORE_REASON, raised=False)
        return
    complete(claim, identity, policy, capture(None if mark is None else mark.ttl))


def complete(claim: Claim, identity: Identity, policy: Policy, stored: StoredResponse) -> None:
    """Store an attempt's final result, fenced by its lock token.

    In two-phase mode a database error is logged, not raised: the record stays ``processing``
    and is taken over once ``unlock_at`` passes (docs: "The crash window"). In atomic mode it
    is raised as :class:`~.exceptions.LockWaitTimeout` (a deadlock: on a Galera cluster another
    node's claim of the key aborted this transaction) or :class:`~.exceptions.StoreUnavailable`.
    """
    store = using(policy.alias)
    with telemetry.span(
        "idempotency.store", identity.method, identity.operation, policy.atomic
    ) as span:
        try:
            written = _fenced_write(
                store,
                claim,
                lambda connection, bound: store.store_response(
                    claim.pk, claim.token_text, stored, connection=connection, bound=bound
                ),
                atomic=policy.atomic,
                applied=lambda connection: store.finished(claim.pk, claim.token_text, connection),
            )
        except DatabaseError:
            if policy.atomic:  # the transaction is lost with it: nothing of the attempt is kept
                with store.guard():
                    raise
            if not claim.lock_lost:
                _outcome(
                    "unavailable",
                    identity,
                    policy,
                    logging.ERROR,
                    "Could not store the result of idempotency record %s: the database did not "
                    "answer before its lock could lapse. A retry after that runs the %s again.",
                    claim.pk,
                    "function" if identity.request is None else "view",
                    claim=claim,
                    exc_info=True,
                )
                span.finish("unavailable", claim.attempt)
                return
            # Renewal found the record another attempt's: the fence would refuse the result.
            written = Written.REFUSED
        outcome = "late_result_refused" if written is Written.REFUSED else "executed"
        _outcome(
            outcome,
            identity,
            policy,
            _STORED_LEVELS[written],
            _STORED_MESSAGES[written],
            claim.pk,
            claim.attempt,
            claim=claim,
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
    blackhole, issue 39). Contention (another writer holds a lock it needs: a SQLite writer, a
    cleanup batch, an operator's transaction; issue 32) is waited out on the same connection. A
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
    delay = _FIRST_WAIT
    own: BaseDatabaseWrapper | None = None
    try:
        while True:
            left = claim.held_until - time.monotonic()
            try:
                bound = max(min(share, left), deadlines.LEAST)
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
                        store.alias,
                        exc,
                        claim.pk,
                        delay,
                    )
                else:
                    logger.info(
                        "Idempotency store %r busy; writing again in %.2gs.", store.alias, delay
                    )
            time.sleep(delay)
            delay = min(delay * 2, _MAX_WAIT)
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
    if connection.vendor != "sqlite":
        options = connection.settings_dict.setdefault("OPTIONS", {})
        options.setdefault("connect_timeout", _CONNECT_TIMEOUT)
        # Not one of Django's pool (PostgreSQL), which may hold more connections the fault
        # killed or silenced, and waits its own timeout for a new one (issue 39).
        options.pop("pool", None)
    return connection


def release(claim: Claim, identity: Identity, policy: Policy, *, reason: str, raised: bool) -> None:
    """Release the claim so a retry runs again.

    A record that may hold a recovery point (:attr:`.Claim.progressed`) is kept, unlocked, so
    that the retry takes it over and resumes from the point instead of repeating every effect
    before it (issue 39; docs/recovery.rst says why); any other is deleted. In atomic mode an
    exception (``raised``) rolls the claim back with the transaction, recovery points
    included; only a retryable status needs the row written, and that commits with the view's
    work.
    """
    keep = claim.progressed
    with telemetry.span(
        "idempotency.release", identity.method, identity.operation, policy.atomic
    ) as span:
        try:
            if not (policy.atomic and raised):
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
            _outcome(
                "unavailable",
                identity,
                policy,
                logging.ERROR,
                "Could not release idempotency record %s.",
                claim.pk,
                claim=claim,
                exc_info=True,
            )
            return
        span.finish("released", claim.attempt)
        _outcome(
            "released",
            identity,
            policy,
            logging.INFO,
            "Released idempotency record %s (%s); kept at its recovery point for the retry."
            if keep and not (policy.atomic and raised)
            else "Released idempotency record %s (%s).",
            claim.pk,
            reason,
            claim=claim,
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
    claim.held_for(since)


Claim.save_point = save_recovery_point


class Unreachable(StoreUnavailable):
    """Atomic mode could not connect to the store's database: connecting again at once would
    fail as well (:func:`claim_again`)."""


class _Entered:
    """An atomic block entered within the claim's bound: on MySQL, entering it is a statement
    (``SET autocommit``), which a silent connection would hold for good (issue 39)."""

    def __init__(
        self, store: Store, connection: BaseDatabaseWrapper, policy: Policy, block: Any
    ) -> None:
        self.store, self.connection, self.policy, self.block = store, connection, policy, block

    def __enter__(self) -> None:
        seconds = deadlines.bound(self.policy.lock_timeout)
        self.store.bounded(self.connection, seconds, self.block.__enter__)

    def __exit__(self, *exc_info: Any) -> bool | None:
        return cast(bool | None, self.block.__exit__(*exc_info))


@contextmanager
def atomic_attempt(policy: Policy) -> Iterator[BaseDatabaseWrapper]:
    """Atomic mode's transaction (a savepoint inside the caller's) on the store's database;
    it gives the connection it is on.

    It connects first, so that an unreachable store raises
    :class:`~.exceptions.StoreUnavailable` (a ``503``, or a consumer's redelivery) rather than a
    raw database error from inside the block. So does the block's end when it fails: a commit
    that fails (or :class:`~.exceptions.LockWaitTimeout` for a deadlock), and a rollback that
    fails and the reconnect Django then tries, whose error would otherwise replace the one the
    block ended with (issue 25); so does a fault the protected code met on the store's
    database, since nothing of the attempt was kept. Any other error of the protected code is
    its own, raised as it is.
    """
    store = using(policy.alias)
    connection = connections[policy.alias]
    try:
        connection.ensure_connection()
    except DatabaseError as exc:
        raise Unreachable(str(exc)) from exc
    raised: BaseException | None = None
    try:
        with _Entered(store, connection, policy, store.atomic(policy.wait_timeout)):
            try:
                yield connection
            except BaseException as exc:
                raised = exc
                raise
    except DatabaseError as exc:
        if exc is raised and not store.is_fault(exc):
            raise
        # Nothing of the attempt was kept. A commit that failed on a Galera cluster (another
        # node's claim of the key passed its certification first, a deadlock error): a 409 the
        # client may retry; otherwise a 503, not a raw database error.
        with store.guard():
            raise
