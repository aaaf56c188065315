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
from typing import Any, TypeVar

from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.dispatch import Signal
from django.utils import timezone

from django_idempotency._base import rules, signals
from django_idempotency._base.errors import LockWaitTimeout, StoreUnavailable
from django_idempotency._call import storing, telemetry
from django_idempotency._call.claim import Claim
from django_idempotency._call.identity import Identity
from django_idempotency._conf.options import Policy
from django_idempotency._store import Store, StoredResponse, using
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
        record = store.read_finished(identity)
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
    previous = store.limit_lock_wait(policy.wait_timeout)
    # A session setting (MySQL) outlives the transaction: it is put back whatever happens.
    always = store.lock_wait_outlives_transaction
    try:
        outcome = yield from _claim(identity, policy, store)
    except BaseException:
        if always:
            store.restore_lock_wait(previous)
        raise
    if always or isinstance(outcome, Claim) or store.in_nested_transaction():
        store.restore_lock_wait(previous)
    if isinstance(outcome, Claim):
        # Until the transaction ends: lifecycle.run() lets go (issue 38).
        store.hold(outcome.scope, outcome.key_hash)
    return outcome


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
    reconnected = False
    for _ in range(_CLAIM_TRIES):
        try:
            outcome = store.claim(
                identity, ttl=policy.ttl, lock_timeout=policy.lock_timeout, token=token
            )
        except StoreUnavailable as exc:
            if reconnected or not _reconnect_thread(store, exc):
                raise
            reconnected = True
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
            if time.monotonic() >= deadline or _settled(store, identity):
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
    only between requests, or with ``CONN_HEALTH_CHECKS`` (issue 25). The view has not run, no
    transaction is lost, and the claim is made with the same lock token, so a first claim
    applied with its reply lost is found as this call's own.
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
    _close(connection)
    return True


def _settled(store: Store, identity: Identity) -> bool:
    """Whether a waiter's key stopped being live in flight (finished, released or stale)."""
    lock = store.peek_status(identity.scope, identity.key_hash)
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
            stored_ok = _fenced_write(
                policy,
                store,
                claim,
                lambda connection: store.store_response(
                    claim.pk, claim.token_text, stored, connection=connection
                ),
            )
        except DatabaseError:
            if policy.atomic:  # the transaction is lost with it: nothing of the attempt is kept
                with store.guard():
                    raise
            outcome = "unavailable"
            _outcome(
                outcome,
                identity,
                policy,
                logging.ERROR,
                "Could not store the result of idempotency record %s.",
                claim.pk,
                claim=claim,
                exc_info=True,
            )
        else:
            outcome = "executed" if stored_ok else "late_result_refused"
            _outcome(
                outcome,
                identity,
                policy,
                logging.DEBUG if stored_ok else logging.ERROR,
                "Stored the result of idempotency record %s (attempt %s)."
                if stored_ok
                else "Idempotency record %s: attempt %s finished after its lock was taken over; "
                "its result was refused. Raise lock_timeout above the longest run.",
                claim.pk,
                claim.attempt,
                claim=claim,
                signal=None if stored_ok else signals.late_result_refused,
                response=stored,
            )
        span.finish(outcome, claim.attempt)


def _fenced_write(
    policy: Policy,
    store: Store,
    claim: Claim,
    write: Callable[[BaseDatabaseWrapper | None], T],
) -> T:
    """Run an owner's fenced write, again while it fails for a reason that passes: giving the
    result up would leave the record to be taken over and the view run twice.

    ``write(connection)`` runs the write on ``connection`` (``None``: the calling thread's own).
    Contention (another writer holds a lock it needs: a SQLite writer, a cleanup batch, an
    operator's transaction; issue 32) is waited out on the same connection. A fault (the
    connection lost, the server restarting, failing over or read-only; issue 25) is tried again
    on a connection of its own, made for the alias and closed after: never the thread's, which
    the project's code may hold in a transaction, and which Django does not reopen until the
    request ends. The write may then be the second of a pair whose first was applied and whose
    reply was lost (``commit outcome unknown``): ``write`` is told so by being given that
    connection, and the fence makes the second a no-op.

    Tried with backoff until the claim's lock could lapse (:attr:`.Claim.held_until`; renewal
    has stopped by now), after which a retry may own the key and the fence decides. In atomic
    mode, or inside a caller's transaction, the error has spoiled the transaction (and the
    claim is not committed, so no other connection could see it): it is raised at once.
    """
    if policy.atomic or claim.uncommitted:
        return write(None)
    delay = _FIRST_WAIT
    own: BaseDatabaseWrapper | None = None
    try:
        while True:
            try:
                return write(own)
            except DatabaseError as exc:
                fault = store.is_fault(exc)
                if not (fault or store.is_contention(exc)):
                    raise
                if time.monotonic() + delay >= claim.held_until:
                    raise
                if fault:
                    own = _reconnect(own, store)
                    logger.warning(
                        "Idempotency store %r failed (%s); writing record %s again on a new "
                        "connection in %.2gs.",
                        policy.alias,
                        exc,
                        claim.pk,
                        delay,
                    )
                else:
                    logger.info(
                        "Idempotency store %r busy; writing again in %.2gs.", policy.alias, delay
                    )
            time.sleep(delay)
            delay = min(delay * 2, _MAX_WAIT)
    finally:
        if own is not None:
            _close(own)


def _reconnect(previous: BaseDatabaseWrapper | None, store: Store) -> BaseDatabaseWrapper:
    """A new connection object for the store's alias (connected when first used), with a bound
    on connecting: a server that drops packets must not hold the owner past its lock."""
    if previous is not None:
        _close(previous)
    connection = connections[store.alias].copy()
    if connection.vendor != "sqlite":
        options = connection.settings_dict.setdefault("OPTIONS", {})
        options.setdefault("connect_timeout", _CONNECT_TIMEOUT)
    return connection


def _close(connection: BaseDatabaseWrapper) -> None:
    try:
        connection.close()
    except DatabaseError:  # already broken: nothing left to close
        logger.debug("Closing a connection of the idempotency store failed.", exc_info=True)


def release(claim: Claim, identity: Identity, policy: Policy, *, reason: str, raised: bool) -> None:
    """Release the claim so a retry runs again.

    In atomic mode an exception (``raised``) rolls the claim back with the transaction; only a
    retryable status needs the row deleted, and that deletion commits with the view's work.
    """
    with telemetry.span(
        "idempotency.release", identity.method, identity.operation, policy.atomic
    ) as span:
        try:
            if not (policy.atomic and raised):
                store = using(policy.alias)
                _fenced_write(
                    policy,
                    store,
                    claim,
                    lambda connection: store.release(
                        claim.pk, claim.token_text, connection=connection
                    ),
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
            "Released idempotency record %s (%s).",
            claim.pk,
            reason,
            claim=claim,
            signal=signals.key_released,
            reason=reason,
        )


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
        raise StoreUnavailable(str(exc)) from exc
    raised: BaseException | None = None
    try:
        with store.atomic(policy.wait_timeout):
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
