"""The relay's ``LISTEN`` (PostgreSQL with psycopg 3): woken by a release's ``NOTIFY``
rather than at its next poll.

The listener is a connection of its own, never one of Django's pool (it would hold one for
the relay's life), and dies alone (a restart, ``pg_terminate_backend``, a network cut). A
failed wait closes it, and ``LISTEN`` is sent again on a new connection at each second of the
relay's waits until it succeeds: tried again on the dead connection, it failed for good, and
the relay only polled. A blackholed listener fails nothing (no
notification comes, as when there is none), so the relay drops it when a pass finds work
after a wait no notification ended: the evidence that it missed one. A message due without a
``NOTIFY`` (the fast path's lease, a retry's backoff) drops it needlessly: one new connection
per poll at most.

Connecting and the ``LISTEN`` are cut at the relay's statement bound, the login at
:data:`.._store.connecting.CONNECT_TIMEOUT` where the alias's settings give none: a silent
server does not hold the relay here. A store with no ``LISTEN`` never connects for it; a
driver with none (psycopg 2) is found out once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_idempotency._store import database_store, outbox
from django_idempotency._store.bound import discard
from django_idempotency._store.connecting import CONNECT_TIMEOUT

logger = logging.getLogger("django_idempotency")


class Listener:
    """``LISTEN`` for the outbox's releases on a connection of its own to ``alias``."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        #: ``False`` once the store or its driver has no ``LISTEN`` (the relay polls).
        self.able = True
        self._connection: BaseDatabaseWrapper | None = None
        self._wait: Callable[[float], bool] | None = None
        self._failing = False

    def listen(self, bound: float) -> bool:
        """``LISTEN`` on a new connection, within ``bound`` seconds, unless listening already:
        whether listening."""
        if self._wait is not None or not self.able:
            return self._wait is not None
        store = database_store(self.alias)
        if not store.features.notifies:
            self.able = False
            return False
        self._connection = connection = connections[self.alias].copy()
        options = connection.settings_dict.setdefault("OPTIONS", {})
        options.pop("pool", None)
        options.setdefault("connect_timeout", CONNECT_TIMEOUT)
        try:
            wait = store.bounded(connection, bound, partial(outbox.listening, store, connection))
        except DatabaseError as exc:
            self.drop()
            self._failed(f"Outbox relay: no LISTEN ({exc}); polling until it succeeds.")
            return False
        if wait is None:  # psycopg 2
            self.able = False
            self.drop()
            return False
        if self._failing:
            logger.info("Outbox relay: listening again.")
            self._failing = False
        self._wait = wait
        return True

    def wait(self, seconds: float) -> bool:
        """Whether a release's notification came within ``seconds`` (listening). A failed
        wait drops the listener: :meth:`listen` makes a new one."""
        assert self._wait is not None
        try:
            return self._wait(seconds)
        except Exception as exc:  # the driver's own error (psycopg's, not Django's)
            self.drop()
            self._failed(f"Outbox relay: LISTEN failed ({exc}); listening again.")
            return False

    def drop(self) -> None:
        """Close the listener's connection: the next :meth:`listen` makes a new one."""
        self._wait = None
        if self._connection is not None:
            discard(self._connection)
            self._connection = None

    def _failed(self, line: str) -> None:
        """Log a failure: a warning for the first of a row (a server down is retried every
        second), the others at debug."""
        logger.log(logging.DEBUG if self._failing else logging.WARNING, line)
        self._failing = True
