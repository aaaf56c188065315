"""An owner's fenced write, tried again while its lock holds: on a connection of its own after a
fault, on the same one after contention, and read back by its lock token when a reply was lost.
The result, the release and a recovery point are written through it (:mod:`.writing`,
:meth:`.Claim.save_point`); it knows a claim only by the few fields it reads (:class:`Fenced`),
so that the claim can use it without an import cycle.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta
from enum import Enum
from typing import Protocol

from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_idempotency._conf.values import display_name
from django_idempotency._store import ClaimHandle, StoreContract, connecting, deadlines
from django_idempotency._store.bound import discard

logger = logging.getLogger("django_idempotency")

#: A write's first and longest pause before it is tried again (seconds).
_FIRST_RETRY = 0.02
_MAX_RETRY = 0.25


class Fenced(Protocol):
    """What a fenced write reads of the claim it writes for (:class:`.Claim`)."""

    pk: ClaimHandle
    lock_timeout: timedelta
    held_until: float
    uncommitted: bool


class Written(Enum):
    """What became of an owner's fenced write (:func:`fenced_write`)."""

    #: Applied, and its reply received.
    WRITTEN = "written"
    #: Applied by an earlier try whose reply was lost, as the record, read back by the
    #: attempt's lock token, shows; the log says so.
    CONFIRMED = "confirmed"
    #: Not applied: the record is no longer this attempt's (taken over, or released).
    REFUSED = "refused"


def fenced_write(
    store: StoreContract,
    claim: Fenced,
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
    blackhole). A store that rides faults out itself (``features.rides_out_faults``: Redis,
    whose every try is bounded by its socket timeout) is given all the time the lock has left.

    The write may then be the second of a pair whose first was applied and whose reply was lost
    ("commit outcome unknown"). ``applied(connection)`` reads the record back by the lock token
    and says whether it was: asked when such a second write matches nothing, and once more, on
    a new connection, when the last try failed on a fault (a reply lost for longer than the
    lock had left).

    Where the write is part of a transaction (``atomic``: atomic mode, or the thread's
    connection in an atomic block) or the claim is (not committed, so no other connection
    could see it), the error has spoiled the transaction: it is raised at once.
    """
    share = deadlines.bound(claim.lock_timeout)
    if atomic or claim.uncommitted:
        return Written.WRITTEN if write(None, share) else Written.REFUSED
    return _retried(store, claim, write, applied, share)


def _retried(
    store: StoreContract,
    claim: Fenced,
    write: Callable[[BaseDatabaseWrapper | None, float], bool],
    applied: Callable[[BaseDatabaseWrapper], bool] | None,
    share: float,
) -> Written:
    """:func:`fenced_write` outside a transaction, tried with backoff until the claim's lock
    could lapse (:attr:`.Claim.held_until`), after which a retry may own the key and the fence
    decides."""
    delay = _FIRST_RETRY
    own: BaseDatabaseWrapper | None = None
    # A store that rides faults out itself (Redis) raises only when the lock's time is spent.
    rides = store.features.rides_out_faults
    try:
        while True:
            left = claim.held_until - time.monotonic()
            try:
                bound = max(left if rides else min(share, left), deadlines.LEAST)
                if own is not None:
                    until = max(claim.held_until, time.monotonic() + bound)
                    own = connecting.connected(own, bound, until=until)
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
                if fault and own is None:
                    # The thread's connection is broken: closed (outside a transaction), so
                    # that the thread's next query (the view's own, after a recovery point)
                    # makes a new one; Django reconnects only between requests otherwise.
                    store.drop_thread_connection()
                if time.monotonic() + delay >= claim.held_until:
                    if fault and applied is not None and _applied_after_all(store, own, applied):
                        return Written.CONFIRMED
                    raise
                own = _before_retry(store, claim, own, exc, fault=fault, delay=delay)
            time.sleep(delay)
            delay = min(delay * 2, _MAX_RETRY)
    finally:
        if own is not None:
            discard(own)


def _before_retry(
    store: StoreContract,
    claim: Fenced,
    own: BaseDatabaseWrapper | None,
    exc: DatabaseError,
    *,
    fault: bool,
    delay: float,
) -> BaseDatabaseWrapper | None:
    """The connection the next try writes on. Contention (another writer holds a lock it
    needs: a SQLite writer, a cleanup batch, an operator's transaction) is waited out on the
    same connection. A fault (the connection lost, the server restarting, failing over or
    read-only) is tried again on a connection of its own, made for the alias and closed after:
    never the thread's, which the project's code may hold in a transaction, and which Django
    does not reopen until the request ends. A fault is logged as a warning."""
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
    return own


def _applied_after_all(
    store: StoreContract,
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
    store: StoreContract,
    connection: BaseDatabaseWrapper,
    bound: float,
    applied: Callable[[BaseDatabaseWrapper], bool],
) -> bool:
    """``applied(connection)`` within ``bound`` seconds: a read on a silent connection is cut
    as a write is."""
    return store.bounded(connection, bound, lambda: applied(connection))


def _reconnect(previous: BaseDatabaseWrapper | None, store: StoreContract) -> BaseDatabaseWrapper:
    """A new connection object for the store's alias (connected when first used), with a bound
    on connecting: a server that drops packets must not hold the owner past its lock."""
    if previous is not None:
        discard(previous)
    connection = connections[store.alias].copy()
    if store.features.has_server:
        options = connection.settings_dict.setdefault("OPTIONS", {})
        options.setdefault("connect_timeout", connecting.CONNECT_TIMEOUT)
        # Not one of Django's pool (PostgreSQL), which may hold more connections the fault
        # killed or silenced, and waits its own timeout for a new one.
        options.pop("pool", None)
    return connection
