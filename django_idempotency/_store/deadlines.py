"""Deadlines on the app's own statements: a statement on a silent connection is ended.

A blackholed connection (a failover that moved an IP, a dropped NAT entry, a partition) stays
open and silent: no reset, no error, and the kernel retries for about fifteen minutes. A claim,
a renewal or a result write sent on it would block until gunicorn killed the worker, its
result lost. So each of the app's statements is watched: when it outlasts its bound
(:func:`bound`, derived from the lock) the connection's socket is shut down, the driver fails
as on a lost connection (a fault), and the caller discards the connection and tries again on a
new one while the lock holds.

Why the socket, from another thread, and not the driver's timeouts: in two-phase mode the claim
runs on the connection the project's own view then uses, and libpq's ``tcp_user_timeout`` and
keepalives, MySQLdb's ``read_timeout`` and ``write_timeout``, are fixed when the connection is
made, for every statement on it, the project's legitimately long queries included.
``TCP_USER_TIMEOUT`` set on the socket for a moment sees only data the peer has not
acknowledged, not a reply that never comes (a proxy or a server that hangs acknowledges the
request); psycopg waits for its reply with ``poll()`` on a non-blocking socket, which
``SO_RCVTIMEO`` does not bound. A ``shutdown()`` ends a blocked ``poll()`` or ``recv()`` at
once, on every driver, and only the statement being watched meets it.

One thread per process watches every statement: registering one is a dictionary entry under a
lock (no thread switch); the thread looks every :data:`TICK` while any is watched, and exits
once none has been for :data:`LINGER`.
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from datetime import timedelta
from typing import Any

from django.db import OperationalError
from django.db.backends.base.base import BaseDatabaseWrapper

from django_idempotency._base import durations

#: A statement may take this share of ``lock_timeout``: half the lock's renewal interval, so a
#: renewal cut off and made again on a new connection still lands before the next is due.
SHARE = 6
#: The least bound (seconds): a statement slowed by a loaded machine is not a fault. No lock is
#: shorter (``durations.MIN_LOCK_TIMEOUT``, check E026).
LEAST = durations.LEAST_STATEMENT
#: How often the thread looks at the watched statements (seconds): a cut lands this late.
TICK = 0.1
#: How long the idle thread waits for another statement before it exits (seconds).
LINGER = 5.0


class Late(OperationalError):
    """A statement whose connection was cut as its reply came: the connection is dead all the
    same, and the statement counts as failed (a fault; what it did is found by its token)."""


def bound(lock_timeout: timedelta) -> float:
    """The longest one of the app's statements may take under a ``lock_timeout`` (seconds)."""
    return max(lock_timeout.total_seconds() / SHARE, LEAST)


class Watch:
    """One statement's deadline on one connection (Django's wrapper: its driver connection is
    read when the deadline passes, so a statement that reconnects is watched too)."""

    __slots__ = ("at", "connection", "cut", "fd")

    def __init__(self, connection: BaseDatabaseWrapper, at: float) -> None:
        self.connection = connection
        self.at = at
        #: Whether the deadline passed and the connection's socket was shut down.
        self.cut = False
        #: The socket, when read as the statement starts (``None``: read when it is cut).
        self.fd: int | None = None


class Watchdog:
    """The process's watched statements, and the thread that ends those past their deadline."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget everything; a forked child has no watchdog thread and no statement."""
        self._lock = threading.Lock()
        self._watches: dict[int, Watch] = {}
        self._thread: threading.Thread | None = None

    def watch(
        self, connection: BaseDatabaseWrapper, seconds: float, socket_first: bool = False
    ) -> Watch:
        """Watch the statement about to run on ``connection`` for ``seconds``; end it with
        :meth:`unwatch`, always (``try``/``finally``).

        The connection is made first, if need be, and the ``seconds`` count from then:
        connecting is the driver's to bound (``connect_timeout``), and a cut cannot end it;
        the statements Django runs once connected have a bound of their own
        (:meth:`connect`). Counted in, a connection slow to open (a loaded machine, a server
        busy coming back) spent the statement's bound, and the first tick after it cut the
        statement it was made for: renewals after an outage connected in 1 to 3 s, each was
        cut as it began, and owners whose records were still theirs lost them.
        ``socket_first``: the driver refuses ``fileno()`` from another thread while a
        statement runs (MySQLdb), so the socket is read now."""
        if connection.connection is None:
            self.connect(connection, seconds)
        watch = Watch(connection, time.monotonic() + seconds)
        if socket_first:
            watch.fd = _socket_of(connection.connection)
        self._add(watch)
        return watch

    def connect(self, connection: BaseDatabaseWrapper, seconds: float) -> None:
        """Connect ``connection``, the statements Django runs as it connects within
        ``seconds`` of the driver's connection being made (and the login itself left to
        ``connect_timeout``). Those statements (PostgreSQL's ``SET TIME ZONE`` whenever the
        server's zone is not spelled as Django's, ``SET ROLE``; MySQL's ``SET SESSION
        TRANSACTION ISOLATION LEVEL`` on every connection) run before the statement's watch
        begins: a connection silenced right after its login held them for good, and a
        renewer reconnecting after a restart renewed nothing for over 20 s. The socket is
        read in this thread as the driver returns (MySQLdb refuses ``fileno()`` from
        another while a statement runs)."""
        setup = Watch(connection, math.inf)
        made = connection.get_new_connection

        def get_new_connection(params: dict[str, Any]) -> Any:
            raw = made(params)
            setup.fd = _socket_of(raw)
            setup.at = time.monotonic() + seconds
            return raw

        # This thread's wrapper (connections are per thread), for this one connect; one the
        # instance had of its own (a project's, a tool's) is put back after it.
        own = vars(connection).get("get_new_connection")
        vars(connection)["get_new_connection"] = get_new_connection
        self._add(setup)
        try:
            connection.ensure_connection()
        finally:
            if own is None:
                vars(connection).pop("get_new_connection", None)
            else:
                vars(connection)["get_new_connection"] = own
            cut = self.unwatch(setup)
        if cut:
            raise Late(
                f"No reply to the statements setting up a connection within {seconds:.3g} s."
            )

    def _add(self, watch: Watch) -> None:
        with self._lock:
            self._watches[id(watch)] = watch
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="django-idempotency-deadlines", daemon=True
                )
                self._thread.start()

    def unwatch(self, watch: Watch) -> bool:
        """Stop watching; whether the statement's connection was cut meanwhile. Once this
        returns, the connection is never cut for this watch (the cut is made under the same
        lock), so the project's own statements on it after the app's are safe."""
        with self._lock:
            del self._watches[id(watch)]
        return watch.cut

    def watching(self) -> int:
        """How many statements are watched (tests)."""
        with self._lock:
            return len(self._watches)

    def _run(self) -> None:
        idle_since: float | None = None
        while True:
            time.sleep(TICK)
            now = time.monotonic()
            with self._lock:
                if not self._watches:
                    idle_since = idle_since or now
                    if now - idle_since >= LINGER:
                        self._thread = None
                        return
                    continue
                idle_since = None
                for watch in self._watches.values():
                    if watch.at <= now and not watch.cut:
                        watch.cut = cut(watch)


def cut(watch: Watch) -> bool:
    """Shut the socket of the watched statement's connection down (its descriptor stays
    open, so it cannot be another's meanwhile): whether there was one to shut."""
    fd = watch.fd if watch.fd is not None else _socket_of(watch.connection.connection)
    if fd is None or fd < 0:
        return False
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return False
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        return False
    finally:
        sock.detach()
    return True


def _socket_of(raw: Any) -> int | None:
    """The socket descriptor of a driver connection: psycopg 3's ``pgconn.socket``, psycopg2's
    and MySQLdb's ``fileno()``; ``None`` for one without (SQLite, not connected, closed)."""
    if raw is None:
        return None
    try:
        pgconn = getattr(raw, "pgconn", None)
        if pgconn is not None:
            return int(pgconn.socket)
        fileno = getattr(raw, "fileno", None)
        return None if fileno is None else int(fileno())
    except Exception:  # closed meanwhile: nothing to cut
        return None


watchdog = Watchdog()
watch = watchdog.watch
connect = watchdog.connect
unwatch = watchdog.unwatch
os.register_at_fork(after_in_child=watchdog.reset)
