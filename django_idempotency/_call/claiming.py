"""The claim loop: claim a key, wait for it, take it over, or say why not; atomic mode's
transaction around it.

:func:`acquire` is a generator so that waiting is done by the caller: it yields the seconds to
sleep (``time.sleep`` or ``asyncio.sleep``, see :mod:`.lifecycle`) and returns its outcome
through ``StopIteration``. Its outcomes are reported (:mod:`.reports`) here, whoever asks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar, cast

from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from django_idempotency._base import rules, signals
from django_idempotency._base.errors import LockWaitTimeout, StoreUnavailable
from django_idempotency._call import telemetry
from django_idempotency._call.attempt import Attempt
from django_idempotency._call.claim import Claim
from django_idempotency._call.identity import Identity
from django_idempotency._call.reports import report
from django_idempotency._conf.options import Policy
from django_idempotency._conf.values import display_name
from django_idempotency._store import StoreContract, deadlines, using
from django_idempotency._store.bound import discard
from django_idempotency._store.claims import new_token
from django_idempotency._store.rows import Record
from django_idempotency.models import IdempotencyKey

logger = logging.getLogger("django_idempotency")

#: A waiting duplicate's first and longest pause between its reads (seconds).
_FIRST_WAIT = 0.02
_MAX_WAIT = 0.25
#: Claims in a row that may meet a concurrent claim or release before the key counts as busy.
_CLAIM_TRIES = 5
#: Of those, claims made again on a new connection after a fault: a pool may hand out a
#: second connection the fault killed before it is drained.
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


def acquire(attempt: Attempt) -> Steps[Claim | Found]:
    """Claim the key (the claim made is also :attr:`.Attempt.claim`), or say why not; waits
    (by yielding) when the policy is ``"wait"``.

    In atomic mode the claim may wait on a concurrent call's uncommitted row, for at most
    ``wait_timeout``; that limit is lifted again before any code of the caller's runs in the
    same transaction: the view or function that now owns the key, or, when the atomic block is
    a savepoint, the rest of the caller's transaction. (Otherwise the transaction ends at once,
    which lifts it for free.) Raises :class:`~.exceptions.StoreUnavailable` and
    :class:`~.exceptions.LockWaitTimeout`.
    """
    identity, policy = attempt.identity, attempt.policy
    with telemetry.span(
        "idempotency.claim", identity.method, identity.operation, policy.atomic, duration=True
    ) as span:
        try:
            if not policy.atomic:
                outcome = yield from _claim(attempt, using(policy.alias))
            else:
                outcome = yield from _bounded_claim(attempt)
        except (StoreUnavailable, LockWaitTimeout) as exc:
            span.finish(refused(attempt, exc))
            raise
        if isinstance(outcome, Claim):
            span.finish("takeover" if outcome.is_takeover else "claimed", outcome.attempt)
        else:
            span.finish(outcome.outcome)
        return outcome


def finished(attempt: Attempt) -> Found | None:
    """Atomic mode: the key's finished record, read before the transaction opens, as a replay
    (or a mismatch); ``None``: there is none, so the key is claimed in the transaction.

    A replay then sends one statement, with no ``BEGIN`` and no ``COMMIT`` (and on MySQL no
    bound on the lock wait to set and put back): the claim would find the same record and
    change nothing. The read is bounded as every statement of the app is. A fault here is
    left to the claim, which meets it again and answers it; a connection that died in a
    restart is closed first, so that the transaction opens on a new one.
    """
    identity, policy = attempt.identity, attempt.policy
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
        found = _found(kind, record, attempt)
        span.finish(found.outcome)
    return found


def _bounded_claim(attempt: Attempt) -> Steps[Claim | Found]:
    """Atomic mode's claim, its lock wait bounded by ``wait_timeout`` (see :func:`acquire`)."""
    policy = attempt.policy
    store = using(policy.alias)
    previous = _watched(store, policy, lambda: store.limit_lock_wait(policy.wait_timeout))
    # A session setting (MySQL) outlives the transaction: it is put back whatever happens.
    always = store.features.lock_wait_outlives_transaction
    try:
        outcome = yield from _claim(attempt, store)
    except BaseException:
        if always:
            _watched(store, policy, lambda: store.restore_lock_wait(previous))
        raise
    if always or isinstance(outcome, Claim) or store.in_nested_transaction():
        _watched(store, policy, lambda: store.restore_lock_wait(previous))
    return outcome


def _watched(store: StoreContract, policy: Policy, statement: Callable[[], T]) -> T:
    """A statement of atomic mode's claim besides the claim's own (the lock wait's bound, and
    the first claim's check that the claim function is there), within the claim's bound: on a
    silent connection it would wait for good."""
    try:
        return store.bounded_here(deadlines.bound(policy.lock_timeout), statement)
    except DatabaseError as exc:
        raise store.refusal(exc) from exc


def refused(attempt: Attempt, exc: StoreUnavailable | LockWaitTimeout) -> str:
    """Report a claim the store refused; returns the outcome (``unavailable``, ``conflict``)."""
    if isinstance(exc, LockWaitTimeout):
        report(
            "conflict",
            attempt,
            logging.INFO,
            "Idempotency key %s: an uncommitted claim held it past wait_timeout.",
            attempt.identity.key_hash[:12],
        )
        return "conflict"
    if using(attempt.policy.alias).expected_fault(exc):  # an outage: one line per call
        report(
            "unavailable",
            attempt,
            logging.ERROR,
            "Idempotency store %r unavailable (%s); the %s was not run.",
            display_name(attempt.policy.alias),
            exc,
            attempt.code,
        )
        return "unavailable"
    report(
        "unavailable",
        attempt,
        logging.ERROR,
        "Idempotency store %r unavailable; the %s was not run.",
        display_name(attempt.policy.alias),
        attempt.code,
        exc_info=True,
    )
    return "unavailable"


def held_here(attempt: Attempt, exc: StoreUnavailable) -> StoreUnavailable | LockWaitTimeout:
    """What a wait for the database's write lock that ran out before the claim is: a ``409``
    (:class:`~.exceptions.LockWaitTimeout`) when an atomic attempt of this process holds the
    key, as a wait on a server's row lock is; otherwise the store unavailable, a ``503``:
    SQLite does not say who holds its lock."""
    store, identity = using(attempt.policy.alias), attempt.identity
    if store.is_contention(exc.__cause__ or exc) and store.holds(identity.scope, identity.key_hash):
        return LockWaitTimeout(str(exc))
    return exc


def let_go(attempt: Attempt) -> None:
    """An atomic attempt's transaction ended: its key is no longer held here (:func:`held_here`)."""
    identity = attempt.identity
    using(attempt.policy.alias).let_go(identity.scope, identity.key_hash)


def _claim(attempt: Attempt, store: StoreContract) -> Steps[Claim | Found]:
    identity, policy = attempt.identity, attempt.policy
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
    # When a claim whose reply was lost was sent: it may have set the lock then, and the claim
    # sent again with its token finds the record its own without moving the lock.
    unanswered: float | None = None
    for _ in range(_CLAIM_TRIES):
        sent = time.monotonic()
        try:
            outcome = store.claim(
                identity, ttl=policy.ttl, lock_timeout=policy.lock_timeout, token=token, bound=bound
            )
        except StoreUnavailable as exc:
            if reconnects == RECONNECTS or not _reconnect_thread(store, exc):
                raise
            reconnects += 1
            unanswered = sent if unanswered is None else unanswered
            continue
        if outcome is None:
            continue  # raced with another call's claim or release: claim again
        if isinstance(outcome, Claim):
            _claimed(attempt, store, outcome, unanswered)
            return outcome
        record = outcome
        if record.request_hash != identity.fingerprint:
            return _found(Kind.MISMATCH, record, attempt)
        if record.status != rules.PROCESSING:
            return _found(Kind.REPLAY, record, attempt, waited=waited)
        if policy.in_progress != "wait" or time.monotonic() >= deadline:
            break
        waited = True
        delay = yield from _wait(attempt, store, deadline, delay, bound)
    if record is None:
        record = IdempotencyKey(scope=identity.scope, key_hash=identity.key_hash)
    return _found(Kind.IN_PROGRESS, record, attempt)


def _reconnect_thread(store: StoreContract, exc: StoreUnavailable) -> bool:
    """Close the thread's connection to the store after a fault that left it unusable (not
    a server that answered with a refusal: read-only), outside any transaction, so that the
    claim is made once more on a new one; ``False``: not so.

    A persistent connection (``CONN_MAX_AGE``) that died in a restart fails at its first
    statement, which is the claim when nothing of the request used it before: Django reconnects
    only between requests, or with ``CONN_HEALTH_CHECKS``. So does a connection
    Django's pool hands out, which it checks only with ``CONN_HEALTH_CHECKS``, and one cut
    when the claim outlasted its bound (a blackhole). The view has not run, no
    transaction is lost, and the claim is made with the same lock token, so a first claim
    applied with its reply lost is found as this call's own. A pooled connection is closed
    before it goes back, so the pool drops it.
    """
    if not store.reconnect_thread(exc.__cause__ or exc):
        return False
    logger.warning(
        "Idempotency store %r failed (%s); claiming again on a new connection.",
        display_name(store.alias),
        exc,
    )
    store.faulted(exc.__cause__ or exc)
    return True


def claim_again(policy: Policy, connection: BaseDatabaseWrapper, exc: StoreUnavailable) -> bool:
    """Whether atomic mode's attempt may start again in a new transaction after its claim
    met a fault: nothing ran before the claim in the transaction (the caller's own,
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
        display_name(policy.alias),
        exc,
    )
    return True


def _settled(store: StoreContract, identity: Identity, bound: float) -> bool:
    """Whether a waiter's key stopped being live in flight (finished, released or stale)."""
    lock = store.peek_status(identity.scope, identity.key_hash, bound)
    return (
        lock is None or lock.status != rules.PROCESSING or rules.STALE.holds(lock, timezone.now())
    )


def _wait(
    attempt: Attempt, store: StoreContract, deadline: float, delay: float, bound: float
) -> Steps[float]:
    """Wait, backing off, until the record in progress settles (finished, released, its lock
    lapsed) or ``deadline`` passes; the wait is recorded. Returns the next pause, which grows
    from one wait to the next of the same claim."""
    started = time.monotonic()
    while True:
        yield min(delay, max(0.0, deadline - time.monotonic()))
        delay = min(delay * 2, _MAX_WAIT)
        if time.monotonic() >= deadline or _settled(store, attempt.identity, bound):
            break
    telemetry.record_wait(time.monotonic() - started, attempt.attributes())
    return delay


def _claimed(
    attempt: Attempt, store: StoreContract, claim: Claim, unanswered: float | None
) -> None:
    """The claim made is the attempt's, and announced (a takeover as a warning). Where a
    claim's reply was lost (``unanswered``: when it was sent), the lock may have been set then,
    and is taken to lapse from that moment."""
    policy = attempt.policy
    if unanswered is not None:
        lock = policy.lock_timeout.total_seconds()
        claim.held_until = min(claim.held_until, unanswered + lock)
    attempt.claim = claim
    if policy.atomic:
        # Held here (:func:`held_here`) from the claim until the transaction ends
        # (lifecycle.run() lets go), its receivers included: a duplicate whose wait for
        # the lock runs out while they run is a ``409``, not a ``503``.
        store.hold(claim.scope, claim.key_hash)
    if claim.is_takeover:
        report(
            "takeover",
            attempt,
            logging.WARNING,
            "Took over stale idempotency record %s (attempt %s, recovery point %r).",
            claim.pk,
            claim.attempt,
            claim.recovery_point,
            signal=signals.key_taken_over,
        )
    else:
        report(
            "claimed",
            attempt,
            logging.DEBUG,
            "Claimed idempotency record %s.",
            claim.pk,
            signal=signals.key_claimed,
        )


_FOUND_SIGNALS = {
    Kind.REPLAY: signals.response_replayed,
    Kind.MISMATCH: signals.fingerprint_mismatch,
    Kind.IN_PROGRESS: signals.request_in_progress,
}
_FOUND_OUTCOMES = {Kind.REPLAY: "replayed", Kind.MISMATCH: "mismatch", Kind.IN_PROGRESS: "conflict"}


def _found(
    kind: Kind, record: IdempotencyKey | Record, attempt: Attempt, *, waited: bool = False
) -> Found:
    outcome = "waited" if waited and kind is Kind.REPLAY else _FOUND_OUTCOMES[kind]
    report(
        outcome,
        attempt,
        logging.DEBUG if kind is Kind.REPLAY else logging.INFO,
        "Idempotency key %s: %s.",
        attempt.identity.key_hash[:12],
        kind.replace("_", " "),
        signal=_FOUND_SIGNALS[kind],
        record=record,
    )
    return Found(kind, record, outcome)


class Unreachable(StoreUnavailable):
    """Atomic mode could not connect to the store's database: connecting again at once would
    fail as well (:func:`claim_again`)."""


class _Entered:
    """An atomic block entered and left within the claim's bound: on MySQL, entering it is a
    statement (``SET autocommit``), and leaving it is the ``COMMIT`` (or ``ROLLBACK``), each of
    which a silent connection would hold for good. A commit cut off so is a fault
    (``503``); the server, its connection closed, drops the uncommitted claim, which would
    otherwise hold the key until its own keepalives noticed (a pooled connection, blackholed
    mid-commit, held two keys past the fault suite's wait in CI)."""

    def __init__(
        self, store: StoreContract, connection: BaseDatabaseWrapper, policy: Policy, block: Any
    ) -> None:
        self.store, self.connection, self.policy, self.block = store, connection, policy, block

    def __enter__(self) -> None:
        seconds = deadlines.bound(self.policy.lock_timeout)
        entered: list[bool] = []

        def enter() -> None:
            self.block.__enter__()
            entered.append(True)

        try:
            self.store.bounded(self.connection, seconds, enter)
        except BaseException as exc:
            # Entered, then cut as it returned: the block is left here, or the thread's
            # connection stays in it, and every later request on the thread fails.
            if entered:
                with suppress(DatabaseError):  # its rollback meets the cut connection
                    self.block.__exit__(type(exc), exc, exc.__traceback__)
            raise

    def __exit__(self, *exc_info: Any) -> bool | None:
        seconds = deadlines.bound(self.policy.lock_timeout)
        return cast(
            bool | None,
            self.store.bounded(self.connection, seconds, lambda: self.block.__exit__(*exc_info)),
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
    block ended with; so does a fault the protected code met on the store's
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
