"""SQLite: the claim in two statements; writers run one at a time, and wait for each other.

SQLite has one write lock per database. Its busy handler waits for a lock another connection
holds on a file (``database is locked`` once ``busy_timeout`` ran out), but not for one that a
connection of the same "shared cache" holds (``database table is locked``, at once): Django's
in-memory test database shared by threads is such a cache. The store waits those out itself,
for as long as the busy timeout (:meth:`SQLiteStore.waited_out`), so that both kinds of
database make a concurrent duplicate wait for the first, never fail at once.

The busy handler is no queue: a connection that has waited long tries again every 100 ms, one
that just came tries at once and then every few milliseconds, so under a crowd of writers the
longest waiter loses every hand-over of the lock. An owner's writes (its renewal, its result, a
release, a recovery point) would lose so to the claims and views of other calls, past the lock
they keep: a duplicate then took a live owner's record over. They try for the lock every few
milliseconds instead, until their bound (:meth:`SQLiteStore.owner_write`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import OperationalError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_idempotency._conf.values import display_name
from django_idempotency._store import deadlines
from django_idempotency._store.base import Store
from django_idempotency._store.claims import ClaimValues
from django_idempotency._store.contract import ClaimHandle
from django_idempotency._store.maintenance import Batch, BatchQuery, SizeQuery
from django_idempotency._store.rows import aware
from django_idempotency.models import IdempotencyKey

T = TypeVar("T")

logger = logging.getLogger("django_idempotency")

#: What SQLite says of a file it cannot open or write for now (:meth:`SQLiteStore.is_fault`).
_FAULTS = ("unable to open database file", "disk i/o error", "readonly database")
#: What a shared-cache connection says of another's table lock (``SQLITE_LOCKED``), which its
#: busy handler does not wait for: ``database table is locked[: name]``, ``database schema is
#: locked``. Never "database is locked" (``SQLITE_BUSY``): the busy wait already ran out.
_TABLE_LOCKS = ("table is locked", "schema is locked")
#: The first and the longest pause between tries of a statement a table lock refused (seconds):
#: such locks last a statement or a transaction, as SQLite's own busy handler assumes.
_FIRST_PAUSE = 0.001
_LONGEST_PAUSE = 0.05
#: SQLite caps a statement's parameters: the cleanup deletes a batch in chunks of this many.
_CHUNK = 500
#: An owner's write tries for the write lock at once, then within this busy timeout (SQLite's
#: handler sleeps 1, 2, 5 ms between its tries) (seconds).
_OWNER_TRY = 0.01
#: Then it begins ``IMMEDIATE`` with no busy wait, again after each such pause until its bound
#: (seconds): sooner than any newcomer's busy handler tries again (1, 2, 5 ms), so that it wins
#: most hand-overs of the lock (``benchmarks/sqlite_owner_race.py``: under a crowd of writers
#: that hold the lock 0.2 s each, an owner's longest wait 0.96 s, against 2.8 s with a 10 ms
#: busy timeout's tries).
_OWNER_PAUSE = 0.0005


class SQLiteStore(Store):
    vendor = "sqlite"
    name = "SQLite"
    features = replace(Store.features, has_server=False, one_writer=True)

    def __init__(self, alias: str) -> None:
        super().__init__(alias)
        #: The keys (scope, key hash) that this process's atomic attempts hold: a transaction
        #: that has not committed, which no other connection can see (:meth:`holds`).
        self._held: Counter[tuple[str, str]] = Counter()
        self._held_lock = threading.Lock()
        #: The deadline (``time.monotonic()``) of the thread's bounded statement (:meth:`bounded`).
        self._bounds = threading.local()

    @contextmanager
    def atomic(self, wait: timedelta) -> Iterator[None]:
        """Atomic mode's transaction, begun ``IMMEDIATE``: it takes the write lock before any
        statement, waiting at most ``wait`` (and no longer than the busy timeout) for a
        concurrent attempt to commit.

        A deferred transaction that reads first (the claim's scope reading a session, DRF's
        authentication) cannot wait for the write lock when its claim then writes: SQLite
        answers ``database is locked`` at once rather than risk a deadlock. Begun
        ``IMMEDIATE``, every attempt waits its turn at the start and then runs alone, so a
        duplicate that got the lock finds the first's committed record and replays it. Inside a
        caller's transaction (a savepoint) the caller chose how it began (the ``transaction_mode``
        option).
        """
        connection = self.connection
        if connection.in_atomic_block:
            with transaction.atomic(using=self.alias):
                yield
            return
        with ExitStack() as stack:
            self._begin_immediate(connection, stack, wait.total_seconds())
            yield

    def _begin_immediate(
        self, connection: BaseDatabaseWrapper, stack: ExitStack, wait: float
    ) -> None:
        busy = busy_timeout(connection)
        limit = min(wait, busy)
        if limit < busy:
            _set_busy_timeout(connection, limit)
        try:
            self.waited_out(connection, lambda: _enter_immediate(connection, stack), limit)
        finally:
            if limit < busy:
                _set_busy_timeout(connection, busy)

    def owner_write(
        self, connection: BaseDatabaseWrapper, call: Callable[[], T], deadline: float | None
    ) -> T:
        """An owner's write (``call()``), tried for the write lock every few milliseconds until
        ``deadline`` (``time.monotonic()``; ``None``: as any statement, with SQLite's busy
        handler alone).

        First as it is, within a short busy timeout. Met by another writer's lock, it is tried
        again in a transaction begun ``IMMEDIATE`` (:meth:`_holding_the_lock`), as quick as any
        newcomer to take the lock when it is let go, however long it has waited. Inside a
        transaction the caller's (atomic mode) it is one statement of that, run as it is.
        """
        if deadline is None or connection.in_atomic_block:
            return self.waited_out(connection, call)
        busy = busy_timeout(connection)
        _set_busy_timeout(connection, _OWNER_TRY)
        try:
            try:
                return call()
            except OperationalError as exc:
                if not self.is_contention(exc) or time.monotonic() >= deadline:
                    raise
            logger.info(
                "Idempotency store %r busy; writing again as soon as its write lock is free "
                "(for %.2gs at most).",
                display_name(self.alias),
                deadline - time.monotonic(),
            )
            while True:
                try:
                    return self._holding_the_lock(connection, call, busy)
                except OperationalError as exc:
                    if not self.is_contention(exc) or time.monotonic() >= deadline:
                        raise
                time.sleep(_OWNER_PAUSE)
        finally:
            _set_busy_timeout(connection, busy)

    def _holding_the_lock(
        self, connection: BaseDatabaseWrapper, call: Callable[[], T], busy: float
    ) -> T:
        """``call()`` in a transaction begun ``IMMEDIATE`` with no busy wait; begun, it holds
        the write lock, and its statements and commit (which waits for the readers to finish)
        wait the busy timeout whole: they lose the lock to no one."""
        _set_busy_timeout(connection, 0)
        with ExitStack() as stack:
            _enter_immediate(connection, stack)
            _set_busy_timeout(connection, busy)
            return call()

    def bounded(
        self, connection: BaseDatabaseWrapper, seconds: float, statement: Callable[[], T]
    ) -> T:
        """As every store's, and the bound is also the deadline of an owner's write inside
        (:meth:`owner_write`): no statement on a file is cut, but a wait for its lock ends."""
        outer = getattr(self._bounds, "deadline", None)
        self._bounds.deadline = time.monotonic() + seconds
        try:
            return super().bounded(connection, seconds, statement)
        finally:
            self._bounds.deadline = outer

    def waited_out(
        self, connection: BaseDatabaseWrapper, call: Callable[[], T], limit: float | None = None
    ) -> T:
        """``call()``, tried again while another connection's table lock refuses it, for at
        most ``limit`` seconds (``None``: the connection's busy timeout), as SQLite's busy
        handler does for a file's lock. A refused statement is undone alone, so it can be
        tried again inside a transaction too."""
        try:
            return call()
        except OperationalError as exc:
            if not self.is_table_lock(exc):
                raise
        deadline = time.monotonic() + (busy_timeout(connection) if limit is None else limit)
        pause = _FIRST_PAUSE
        while True:
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            try:
                return call()
            except OperationalError as exc:
                if not self.is_table_lock(exc) or time.monotonic() >= deadline:
                    raise
            pause = min(pause * 2, _LONGEST_PAUSE)

    def is_table_lock(self, exc: BaseException) -> bool:
        """Another connection of a shared cache holds a lock this statement needs: a neighbour
        in this process, for the length of one statement or transaction."""
        return isinstance(exc, OperationalError) and any(lock in str(exc) for lock in _TABLE_LOCKS)

    def hold(self, scope: str, key_hash: str) -> None:
        with self._held_lock:
            self._held[scope, key_hash] += 1

    def let_go(self, scope: str, key_hash: str) -> None:
        with self._held_lock:
            key = (scope, key_hash)
            self._held[key] -= 1
            if self._held[key] <= 0:
                del self._held[key]

    def holds(self, scope: str, key_hash: str) -> bool:
        """Whether an atomic attempt of this process holds the key now (its transaction not
        ended): a duplicate whose wait for the write lock ran out is then answered ``409``,
        as a wait on a server's row lock is. Only an answer is chosen by it, never a claim:
        the database decides those."""
        return (scope, key_hash) in self._held

    def insert_or_load(
        self, connection: BaseDatabaseWrapper, values: ClaimValues
    ) -> IdempotencyKey | None:
        return self.waited_out(connection, lambda: self._insert_or_load(connection, values))

    def _insert_or_load(
        self, connection: BaseDatabaseWrapper, values: ClaimValues
    ) -> IdempotencyKey | None:
        """Outside a transaction the record is read first, so a replay writes nothing (and
        takes no write lock: another process's write does not hold it up in WAL mode); a new
        key is inserted next. Inside one, the ``INSERT`` comes first: a transaction that has
        read cannot wait for the write lock (SQLite answers ``database is locked`` at once
        rather than risk a deadlock), while one that writes first waits its busy timeout."""
        statements = self.statements(connection)
        key = [values.identity.scope, values.identity.key_hash]
        if not connection.in_atomic_block:
            found = self.first(connection, statements.select, key)
            if found is not None:
                return found
        inserted = self.first(connection, statements.insert, values.params(connection))
        return inserted or self.first(connection, statements.select, key)

    # The statements after the claim, each waited out as the claim is (see the module).

    def take_over(
        self, connection: BaseDatabaseWrapper, pk: int, values: list[Any], token: str
    ) -> IdempotencyKey | None:
        take_over = super().take_over
        return self.waited_out(connection, lambda: take_over(connection, pk, values, token))

    def read_status(
        self, connection: BaseDatabaseWrapper, scope: str, key_hash: str, bound: float | None
    ) -> tuple[str, Any] | None:
        """The read, not :meth:`peek_status`, is waited out: its guard makes the table lock a
        ``StoreUnavailable``, which was never tried again (a waiter's ``503`` while its owner
        wrote the result)."""
        read = super().read_status
        return self.waited_out(connection, lambda: read(connection, scope, key_hash, bound))

    def renew(
        self,
        leases: Sequence[tuple[ClaimHandle, Any]],
        lock_timeout: timedelta,
        bound: float | None = None,
    ) -> set[tuple[ClaimHandle, Any]]:
        """An owner's write (:meth:`owner_write`) until the renewal's bound."""
        renew = super().renew
        seconds = deadlines.bound(lock_timeout) if bound is None else bound
        return self.owner_write(
            self.connection,
            lambda: renew(leases, lock_timeout, bound),
            time.monotonic() + seconds,
        )

    def _fenced(
        self,
        connection: BaseDatabaseWrapper,
        statement: Any,
        params: list[Any],
        pk: int,
        token: Any,
        stale_at: datetime | None,
        release: Any = None,
    ) -> bool:
        """Every fenced write: the result, a release, a recovery point. An owner's, given a
        bound (:meth:`bounded`), is an owner's write until then (:meth:`owner_write`); an
        operator's waits as any statement."""
        fenced = super()._fenced
        return self.owner_write(
            connection,
            lambda: fenced(connection, statement, params, pk, token, stale_at, release),
            getattr(self._bounds, "deadline", None),
        )

    def delete_batch(self, connection: BaseDatabaseWrapper, batch: BatchQuery) -> Batch:
        table = connection.ops.quote_name(IdempotencyKey._meta.db_table)
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            cursor.execute(batch.select, [*batch.params, batch.size])
            rows = cursor.fetchall()
            if not rows:
                return Batch(0, None)
            deleted = 0
            ids = [row[0] for row in rows]
            for start in range(0, len(ids), _CHUNK):
                in_ids, in_params = self.in_ids(connection, ids[start : start + _CHUNK])
                cursor.execute(
                    f"DELETE FROM {table} WHERE {in_ids} AND {batch.where}",
                    [*in_params, *batch.params],
                )
                deleted += cursor.rowcount
        return Batch(deleted, aware(connection, max(row[1] for row in rows)))

    def is_contention(self, exc: BaseException) -> bool:
        """``database is locked`` (busy past the wait) and ``database table is locked`` (a
        shared-cache neighbour's lock, still held when :meth:`waited_out` gave up).

        Not a lock wait that ran out (:meth:`is_lock_timeout`, a ``409``): SQLite does not
        say who holds its write lock, which is as likely another process's long transaction
        as a call of the same key, so a claim that meets it is the store unavailable, a
        ``503``, unless an atomic attempt of this process holds the key
        (:meth:`holds`). An owner's writes wait it out
        (:func:`django_idempotency._call.fencing.fenced_write`)."""
        return isinstance(exc, OperationalError) and "is locked" in str(exc)

    def is_fault(self, exc: BaseException) -> bool:
        """The file cannot be opened or written for now (a disk, a mount, a read-only file):
        its connection is opened again for an owner's write, as a server's is."""
        message = str(exc).lower()
        return isinstance(exc, OperationalError) and any(fault in message for fault in _FAULTS)

    def database_size(self, connection: BaseDatabaseWrapper) -> tuple[int, str]:
        """SQLite without ``dbstat`` only knows the whole file's size: given as the table's,
        said so in the source, and the indexes are unknown."""
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA page_count")
            pages = cursor.fetchone()[0]
            cursor.execute("PRAGMA page_size")
            return pages * cursor.fetchone()[0], "page_count * page_size (the whole file)"

    def size_query(self, table: str) -> SizeQuery:
        # dbstat is a compile-time option of SQLite (on in most Python builds); without it the
        # statement fails and maintenance.table_size falls back to the file's size.
        return SizeQuery(
            "SELECT COALESCE(SUM(CASE WHEN name = %s THEN pgsize END), 0), "
            "COALESCE(SUM(CASE WHEN name <> %s THEN pgsize END), 0) FROM dbstat "
            "WHERE name IN (SELECT name FROM sqlite_master WHERE tbl_name = %s)",
            [table, table, table],
            "dbstat",
        )


def busy_timeout(connection: BaseDatabaseWrapper) -> float:
    """How long the connection waits for another's lock on the file (seconds): Django's
    ``timeout`` option, 5 s by default, or what ``PRAGMA busy_timeout`` set since. Read on the
    driver's connection: an owner's every write reads and sets it, and Django's cursor costs
    more than the statement."""
    connection.ensure_connection()
    with connection.wrap_database_errors:
        return int(connection.connection.execute("PRAGMA busy_timeout").fetchone()[0]) / 1000


def _enter_immediate(connection: BaseDatabaseWrapper, stack: ExitStack) -> None:
    """Enter a transaction begun ``IMMEDIATE`` (``EXCLUSIVE`` if the project begins its own so)
    on ``connection``, left with ``stack``."""
    mode = connection.transaction_mode  # type: ignore[attr-defined]  # Django 5.1+
    connection.transaction_mode = mode if mode == "EXCLUSIVE" else "IMMEDIATE"  # type: ignore[attr-defined]
    try:
        stack.enter_context(transaction.atomic(using=connection.alias))
    finally:
        connection.transaction_mode = mode  # type: ignore[attr-defined]


def _set_busy_timeout(connection: BaseDatabaseWrapper, seconds: float) -> None:
    connection.ensure_connection()
    with connection.wrap_database_errors:
        milliseconds = 0 if seconds <= 0 else max(1, round(seconds * 1000))  # 0: no wait
        connection.connection.execute(f"PRAGMA busy_timeout = {milliseconds}")
