"""Lock renewal (the heartbeat): a live attempt keeps its record's lock, a dead one loses it.

With renewal, ``lock_timeout`` means "time since the owner last showed it was alive" rather
than "the longest a run may take". Every process has one renewer thread per store (a store's
fault holds its own thread alone), started with the first attempt it renews and ended after
the last one finishes: at once if it had opened a connection, else at its next scheduled
renewal (waking it as each request starts and ends would cost every request a thread switch),
then ``LINGER`` later. Every ``lock_timeout / 3`` it renews all live attempts of the process
that share a database alias and a ``lock_timeout`` in one fenced ``UPDATE``
(:meth:`._store.writes.FencedWrites.renew`); a per-attempt thread would send one statement per
attempt instead. The thread has its own connection (Django's connections are per thread), so
renewal commits at once whatever transaction the attempt's own code is in; the connection is
closed as soon as nothing is left to renew.

Async attempts are renewed by the same thread rather than by a task on their event loop: one
statement covers them all, and a loop kept busy by other coroutines (or by sync code run on it)
cannot delay a renewal past ``lock_timeout`` and get a live attempt taken over.

Only a committed claim is renewed: one made inside a transaction on the store's database
(atomic mode, or a caller's transaction) is invisible to every other connection until it
commits, so there is nothing to renew, and no thread is started.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from contextlib import suppress
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connections

from django_idempotency import _store as store
from django_idempotency._base import signals
from django_idempotency._call.attempt import Attempt
from django_idempotency._call.claim import Claim
from django_idempotency._conf.values import display_name
from django_idempotency._store import deadlines
from django_idempotency._store.writes import RenewalShortfall
from django_idempotency.models import IdempotencyKey

logger = logging.getLogger("django_idempotency")

#: Renewals per ``lock_timeout``: two may fail (a database hiccup) before the lock is lost.
RENEWALS_PER_LOCK_TIMEOUT = 3
#: Attempts renewed by one statement: two parameters each, within SQLite's 999.
BATCH = 400
#: How long the idle thread waits for another attempt before it exits (its connection is
#: closed at once): a busy server keeps one thread rather than starting one per request.
LINGER = 2.0
#: The first wait before a failed renewal is retried; it doubles up to the interval or
#: :data:`LAST_RETRY`, whichever is shorter: renewals resume within a second of the database
#: answering again, however long it was away.
FIRST_RETRY = 0.25
LAST_RETRY = 1.0
#: But no try waits longer than this share of the time left before the lock can lapse (or,
#: past that, of the time since), nor less than :data:`PROBE` seconds: tries come faster as
#: the lock's end nears, so a database that answers again before then is met by a try that
#: still leaves most of what was left, and around the end by a try every ``PROBE``. A backoff
#: step alone could outlast the lock: on MariaDB, whose restart is an outage of about 2 s, the
#: next try after the server answered was due 0.6 s later, after a 2 s lock had lapsed and
#: duplicates had taken two keys over. Just past the end the lock may still be
#: held (nobody took it over yet): the renewal, fenced by the token alone, keeps it. A try is
#: itself the cheapest probe: a connection the server refuses, or one ``UPDATE`` by primary key.
LOCK_SHARE = 0.25
PROBE = 0.05
THREAD_NAME = "django-idempotency-renewer"

Group = tuple[str, timedelta]  # the database alias and the lock_timeout of the attempts


def interval(lock_timeout: timedelta) -> float:
    """Seconds between two renewals of an attempt's lock."""
    return lock_timeout.total_seconds() / RENEWALS_PER_LOCK_TIMEOUT


def first_renewal(claim: Claim) -> float:
    """When (monotonic) a claim's lock is first renewed: an interval after the claim was sent,
    which :attr:`.Claim.held_until` counts from, not after its reply arrived. The time between
    the two (a slow network, an fsync before the reply, a stalled process, a claim sent again
    after a lost reply, the ``key_claimed`` receivers) would otherwise be taken from the lock:
    a reply held 2.5 s under a 3 s lock let a duplicate take a live owner's key over."""
    return claim.held_until - claim.lock_timeout.total_seconds() + interval(claim.lock_timeout)


def retry_wait(failures: int, lock_timeout: timedelta, left: float) -> float:
    """Seconds before a failed renewal is tried again: after ``failures`` failures in a row,
    with ``left`` seconds before the earliest of its locks can lapse (negative: since it could).

    Backoff (:data:`FIRST_RETRY` doubling up to the interval or :data:`LAST_RETRY`) while the
    lock's end is far; near it, at most :data:`LOCK_SHARE` of the time to it (or since it), and
    no less than :data:`PROBE`.
    """
    backoff: float = min(FIRST_RETRY * 2 ** (failures - 1), interval(lock_timeout), LAST_RETRY)
    return max(PROBE, min(backoff, abs(left) * LOCK_SHARE))


def renewal_bound(
    lock_timeout: timedelta,
    held_until: list[float],
    now: float,
    one_writer: bool = False,
    others_until: list[float] | None = None,
) -> float:
    """Seconds one renewal try of a ``lock_timeout`` group may take: a statement's share of
    its own lock (:func:`.deadlines.bound`), and no more than :data:`LOCK_SHARE` of the time
    left before the earliest end of any live lock the renewer holds, the group's own
    (``held_until``) and every other group's (``others_until``), never less than
    :data:`PROBE`. One thread renews a store's groups in turn: a 60 s lock's renewal on a
    silent connection held it for its own bound, 10 s, and a 3 s lock's owner on the same
    healthy server was taken over. Locks already past their end are not counted: a try cannot
    save them, and they would starve the others'.

    Where writers take one lock in turn (``one_writer``: SQLite), a try waits for that lock
    until the earliest end of its own group's locks: it waits for other writers, not for a
    server that may answer a new try sooner. Cut to a share, tries filled little more than
    half of the time left (the rest was their pauses), and under a crowd of writers that each
    hold the lock 0.2 s the shortest missed every hand-over until a live owner's lock lapsed.
    The other groups' locks still cut it to the share, so that their own renewals, next on
    the thread, have time left.
    """
    ahead = [end - now for end in held_until if end > now]
    others = [end - now for end in others_until or () if end > now]
    if one_writer and ahead:
        wait = min(ahead)
        if others:
            wait = min(wait, LOCK_SHARE * min(others))
        return max(PROBE, wait)
    ahead += others
    own = deadlines.bound(lock_timeout)
    if not ahead:
        return own
    return min(own, max(PROBE, LOCK_SHARE * min(ahead)))


@dataclass(eq=False)
class _Lease:
    claim: Claim
    request: object

    @property
    def group(self) -> Group:
        return (self.claim.alias, self.claim.lock_timeout)


class Renewer:
    """The process's renewer: the live attempts, and the thread renewing them."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget everything; a forked child has no renewer thread and renews none of its
        parent's attempts."""
        self._cond = threading.Condition()
        self._leases: dict[int, _Lease] = {}
        self._due: dict[Group, float] = {}
        self._failures: dict[Group, int] = {}
        self._thread: threading.Thread | None = None
        #: Whether the thread holds a connection it opened to renew (closed once idle).
        self._connected = False

    def start(self, attempt: Attempt) -> None:
        """Renew the lock of the attempt's claim until :meth:`stop`, if its policy asks and the
        claim is committed."""
        claim = attempt.claim
        assert claim is not None, "an attempt whose claim was not made"
        if not attempt.policy.heartbeat or claim.uncommitted:
            return
        lease = _Lease(claim, attempt.request)
        group = lease.group
        first = first_renewal(claim)
        with self._cond:
            self._leases[id(claim)] = lease
            if self._thread is None:
                self._due[group] = first
                self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
                self._thread.start()
            elif first < self._due.get(group, math.inf):
                self._due[group] = first
                self._cond.notify()
            # Otherwise the thread already wakes at the group's next renewal, no later than
            # this attempt's first is due: waking it now would cost every request a thread
            # switch (renewing early is harmless; late is what loses a lock).

    def stop(self, claim: Claim | None) -> None:
        """Stop renewing ``claim``'s lock (at once; nothing if it was not renewed)."""
        if claim is None or id(claim) not in self._leases:
            # Not renewed (atomic mode, heartbeat off), or no longer: its lease was added in
            # this thread before, so its absence needs no lock to be seen.
            return
        with self._cond:
            if (
                self._leases.pop(id(claim), None) is not None
                and not self._leases
                and self._connected
            ):
                self._cond.notify()  # close the connection now
            # A thread that never connected (every attempt was shorter than an interval)
            # finds out at its next wake-up: no thread switch per request.

    def live(self) -> int:
        """How many attempts are being renewed."""
        with self._cond:
            return len(self._leases)

    def running(self) -> bool:
        with self._cond:
            return self._thread is not None

    def _run(self) -> None:
        try:
            while (work := self._next()) is not None:
                if not work:
                    self._disconnect()
                for group, leases in work:
                    self._renew(group, leases)
        finally:
            self._disconnect()

    def _disconnect(self) -> None:
        with self._cond:
            self._connected = False
        _close_connections()

    def _next(self) -> list[tuple[Group, list[_Lease]]] | None:
        """The groups due for renewal; ``[]``: close the connection; ``None``: exit."""
        idle_until: float | None = None
        with self._cond:
            while True:
                now = time.monotonic()
                if not self._leases:
                    if self._due:  # just became idle
                        self._due.clear()
                        self._failures.clear()
                        return []
                    idle_until = idle_until or now + LINGER
                    if now >= idle_until:
                        self._thread = None
                        return None
                    self._cond.wait(idle_until - now)
                    continue
                idle_until = None
                due = [group for group, at in self._due.items() if at <= now]
                if due:
                    return self._take(due, now)
                self._cond.wait(min(self._due.values()) - now)

    def _take(self, due: list[Group], now: float) -> list[tuple[Group, list[_Lease]]]:
        work = []
        for group in due:
            leases = [lease for lease in self._leases.values() if lease.group == group]
            if leases:
                self._due[group] = now + interval(group[1])
                work.append((group, leases))
            else:
                del self._due[group]
                self._failures.pop(group, None)
        return work

    def _renew(self, group: Group, leases: list[_Lease]) -> None:
        alias, lock_timeout = group
        held: set[tuple[int, Any]] = set()
        answered: set[int] = set()
        fault: Exception | None = None
        since = time.monotonic()
        with self._cond:
            self._connected = True
            held_until = [lease.claim.held_until for lease in leases]
            others = [
                lease.claim.held_until for lease in self._leases.values() if lease.group != group
            ]
        try:
            one_writer = store.using(alias).features.one_writer
            seconds = renewal_bound(lock_timeout, held_until, since, one_writer, others)
            for start in range(0, len(leases), BATCH):
                batch = leases[start : start + BATCH]
                pairs = [(lease.claim.pk, lease.claim.token_text) for lease in batch]
                try:
                    held |= store.using(alias).renew(pairs, lock_timeout, seconds)
                except RenewalShortfall as exc:  # some locks settled (a cluster's node failed)
                    held |= exc.held
                    answered |= exc.answered
                    fault = exc
                else:
                    answered |= {pk for pk, _ in pairs}
        except Exception as exc:  # never let a database error end the thread
            fault = exc
        with self._cond:
            if fault is None:
                self._failures.pop(group, None)
            # A lease stopped meanwhile is not lost: its attempt stopped renewal before its
            # final write, which may be what the renewal missed.
            lost = [
                lease
                for lease in leases
                if lease.claim.pk in answered
                and (lease.claim.pk, lease.claim.token_text) not in held
                and id(lease.claim) in self._leases
            ]
            for lease in lost:
                del self._leases[id(lease.claim)]
        for lease in leases:
            if (lease.claim.pk, lease.claim.token_text) in held:
                lease.claim.held_for(since)
        for lease in lost:
            _announce_lost(lease)
        if fault is not None:
            unsettled = [lease for lease in leases if lease.claim.pk not in answered]
            self._retry(group, unsettled or leases, fault)

    def _retry(self, group: Group, leases: list[_Lease], exc: Exception) -> None:
        """Retry sooner than the interval, doubling the wait, and sooner still as the lock's
        end nears (:func:`retry_wait`); reconnect first."""
        now = time.monotonic()
        left = min(lease.claim.held_until for lease in leases) - now
        with self._cond:
            failures = self._failures[group] = self._failures.get(group, 0) + 1
            wait = retry_wait(failures, group[1], left)
            if group in self._due:
                self._due[group] = now + wait
        logger.warning(
            "Could not renew idempotency locks on %r (failure %s, retrying in %.2gs): %s",
            display_name(group[0]),
            failures,
            wait,
            exc,
        )
        self._disconnect()


def _close_connections() -> None:
    """Close this thread's connections (only the renewer's own: connections are per thread),
    and forget them: the next renewal makes its connection from the alias's settings as they
    are then. The thread outlives requests while attempts keep coming; a connection object it
    kept would carry the settings of its first renewal (a test suite that points an alias at
    another server, another vendor, renewed through the old one and lost the lock)."""
    for connection in connections.all(initialized_only=True):
        try:
            connection.close()
        except Exception:  # a connection already broken: nothing left to close
            logger.debug("Closing the renewer's connection failed.", exc_info=True)
        with suppress(AttributeError):
            del connections[connection.alias]


def _announce_lost(lease: _Lease) -> None:
    claim = lease.claim
    claim.lock_lost = True
    logger.error(
        "Idempotency record %s: attempt %s lost its lock (taken over or released while it "
        "ran); its result will be refused. Recovery points and derived keys now raise LockLost.",
        claim.pk,
        claim.attempt,
    )
    try:
        signals.lock_lost.send(
            IdempotencyKey,
            claim=claim,
            request=lease.request,
            scope=claim.scope,
            key_hash=claim.key_hash,
        )
    except Exception:  # a receiver's error must not end the renewer
        logger.exception("A lock_lost receiver raised.")


class Renewers:
    """A :class:`Renewer` per store: one store's fault (a frozen Redis, a silent database)
    holds its own renewer's thread alone, never another store's owners' renewals. With one
    thread for every store, a Redis server stopped for 15 s held the database store's
    renewals until a live owner's lock there lapsed and a duplicate payment ran."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every renewer: a forked child has no renewer thread and renews none of its
        parent's attempts."""
        self._lock = threading.Lock()
        self._of: dict[str, Renewer] = {}

    def of(self, alias: str) -> Renewer:
        """The store's renewer (made at its first attempt)."""
        found = self._of.get(alias)
        if found is None:
            with self._lock:
                found = self._of.setdefault(alias, Renewer())
        return found

    def start(self, attempt: Attempt) -> None:
        assert attempt.claim is not None, "an attempt whose claim was not made"
        self.of(attempt.claim.alias).start(attempt)

    def stop(self, claim: Claim | None) -> None:
        if claim is not None and (found := self._of.get(claim.alias)) is not None:
            found.stop(claim)

    def live(self) -> int:
        """How many attempts are being renewed, on every store."""
        return sum(each.live() for each in list(self._of.values()))

    def running(self) -> bool:
        return any(each.running() for each in list(self._of.values()))


renewer = Renewers()
start = renewer.start
stop = renewer.stop
os.register_at_fork(after_in_child=renewer.reset)
