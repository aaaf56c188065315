"""Connecting for the app's own statements: a login the network silenced is not waited out.

A statement is cut at its bound (:mod:`.deadlines`), but connecting cannot be: the driver holds
its socket until it returns, after ``connect_timeout``, whole seconds, the same for every
connection of the alias. A blackhole of new connections shorter than the lock (1.5 s under a
3 s lock) left the renewer's reconnect, made during it, waiting ``connect_timeout`` (3 s) after
the network had healed: the lock lapsed and a duplicate ran the view again (a MariaDB soak's
double runs). So the renewer's connection, and an owner's write made again after a fault, are
connected on threads of their own: while none has connected, another attempt starts beside
them each ``bound`` (up to :data:`ATTEMPTS` at once), and the first to connect is used; the
others are closed as they end. A login slow on a loaded machine is not given up either: every
attempt has the driver's whole ``connect_timeout``. Once an attempt has failed, no new one
starts, and when every one has, the last error is raised: a refused connection (a stopped
server) fails at once, as without this. An alias whose settings give no ``connect_timeout``
(psycopg's default is 130 s, MySQLdb's none) has its attempts given :data:`CONNECT_TIMEOUT`
where the caller asks (a server's): otherwise, once :data:`ATTEMPTS` were under way in a
blackhole, none started after it healed, and the renewer waited minutes for the silent ones.
"""

from __future__ import annotations

import logging
import math
import threading
import time

from django.db.backends.base.base import BaseDatabaseWrapper

from django_idempotency._store import deadlines
from django_idempotency._store.bound import discard

logger = logging.getLogger("django_idempotency")

#: The most attempts to connect under way at once for one connection.
ATTEMPTS = 8
#: The bound on connecting an attempt whose alias gives none (seconds; libpq's least is 2).
CONNECT_TIMEOUT = 5


class _Race:
    """Attempts to connect one connection, the first to connect wins."""

    def __init__(self, bound: float, connect_timeout: int | None) -> None:
        self.bound = bound
        self.connect_timeout = connect_timeout
        self.changed = threading.Condition()
        self.winner: BaseDatabaseWrapper | None = None
        self.error: BaseException | None = None
        self.running = 0
        self.over = False

    def start(self, connection: BaseDatabaseWrapper) -> None:
        """Start an attempt on a copy of ``connection`` (held: :attr:`changed`)."""
        attempt = connection.copy()  # its settings a copy of the alias's
        if self.connect_timeout is not None:
            options = attempt.settings_dict.setdefault("OPTIONS", {})
            options.setdefault("connect_timeout", self.connect_timeout)
        # Closed from its attempt's thread when it loses; used from the caller's if it wins.
        attempt.inc_thread_sharing()
        self.running += 1
        # Named for the thread it connects for (the renewer's, a request's): its signals
        # (``connection_created``) and a thread dump say whose connection it is.
        name = f"{threading.current_thread().name} (connecting)"
        threading.Thread(target=self._attempt, args=(attempt,), name=name, daemon=True).start()

    def _attempt(self, attempt: BaseDatabaseWrapper) -> None:
        error: BaseException | None = None
        try:
            deadlines.connect(attempt, self.bound)
        except Exception as exc:  # the race's caller raises it, if every attempt fails
            error = exc
        with self.changed:
            self.running -= 1
            won = error is None and self.winner is None and not self.over
            if won:
                self.winner = attempt
            elif error is not None:
                self.error = error
            self.changed.notify_all()
        if not won:
            discard(attempt)


def connected(
    connection: BaseDatabaseWrapper,
    bound: float,
    connect_timeout: int | None = None,
    until: float | None = None,
) -> BaseDatabaseWrapper:
    """``connection`` if it is connected; else a copy of it, connected by the first of the
    attempts raced for it (a new one each ``bound`` seconds while none has connected), each
    given ``connect_timeout`` (seconds) if its settings give none. With ``until``
    (``time.monotonic()``), :class:`.deadlines.Late` once it has passed with none connected:
    an owner's write gives up as its lock lapses, not when its last attempt does (eight
    attempts spaced by a 10 s lock's bound held an owner 16 s in a blackhole)."""
    if connection.connection is not None:
        return connection
    race = _Race(bound, connect_timeout)
    with race.changed:
        race.start(connection)
        next_start = time.monotonic() + bound
        while race.winner is None:
            if race.error is not None and not race.running:
                race.over = True
                raise race.error
            now = time.monotonic()
            if until is not None and now >= until:
                race.over = True
                raise deadlines.Late(f"No connection to {connection.alias!r} in time.")
            # No new attempt once one has failed or while ATTEMPTS run: woken as one ends.
            starting = race.error is None and race.running < ATTEMPTS
            if starting and now >= next_start:
                logger.info(
                    "Connecting to %r takes over %.2g s; another attempt starts beside.",
                    connection.alias,
                    bound,
                )
                race.start(connection)
                next_start = now + bound
            starting = race.error is None and race.running < ATTEMPTS
            wake = next_start if starting else math.inf
            if until is not None:
                wake = min(wake, until)
            race.changed.wait(None if wake == math.inf else max(0.0, wake - now))
        winner = race.winner
    winner.dec_thread_sharing()
    return winner
