"""What every part of a store shares: the database alias it is bound to, the vendor's
statements, and how its errors become the app's own."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import timedelta
from typing import Any, TypeVar

from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_idempotency._base.errors import LockWaitTimeout, StoreUnavailable
from django_idempotency._store import charsets, deadlines, rows
from django_idempotency._store.contract import StoreContract, StoreFeatures
from django_idempotency._store.rows import per_connection, preparers
from django_idempotency._store.statements import Statements
from django_idempotency.models import IdempotencyKey

logger = logging.getLogger("django_idempotency")

T = TypeVar("T")

#: The least time between two drains of one connection pool (seconds): a fault seen by many
#: threads at once drains it once.
DRAIN_EVERY = 1.0
#: The attribute of a pool holding when it was last drained (``time.monotonic()``).
_DRAINED = "_django_idempotency_drained"


class BoundStore(StoreContract):
    """A store bound to one database alias.

    It keeps the alias, never a connection: Django's connections are per thread, and one store
    serves every thread (the request's, the lock renewer's, an async view's). Each statement
    runs on :attr:`connection`, the calling thread's own.
    """

    #: ``connection.vendor`` of the databases this class serves, and their name for people.
    vendor = ""
    name = ""
    #: The only ``isolation_level`` option a claim in atomic mode works under (``None``: any).
    isolation_level: str | None = None

    #: What a database can do (a vendor module replaces those it differs on): atomic mode, its
    #: writes in the thread's transaction, the operators' queries of the app's table.
    features = StoreFeatures(supports_atomic=True, shares_transaction=True, keeps_table=True)

    # What the database's statements differ on, asked by the code every vendor shares instead
    # of its vendor's name (as Django's ``BaseDatabaseFeatures``).

    #: Whether a statement's deadline reads the connection's socket before the statement runs:
    #: MySQLdb refuses ``fileno()`` from another thread while one runs (:mod:`.deadlines`).
    socket_read_first = False
    #: Whether a write's ``RETURNING`` can feed another write in the same statement (a
    #: data-modifying CTE), and an ``UPDATE ... FROM`` read a CTE that locks its rows: the
    #: outbox's release and batch are then one statement each (:mod:`.outbox`).
    chains_writes = False
    #: What an ``INSERT`` ends with to leave a row whose ``{column}`` (quoted) is taken as it is,
    #: and that alone: ``INSERT IGNORE`` would swallow other errors too.
    ignore_duplicate = " ON CONFLICT ({column}) DO NOTHING"

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self._statements: Statements | None = None

    @property
    def connection(self) -> BaseDatabaseWrapper:
        """This thread's connection to the alias; an alias now on another database is
        unavailable (a ``503``), never given this vendor's statements."""
        connection = connections[self.alias]
        if connection.vendor != self.vendor:
            raise unsupported(connection)
        return connection

    def statements(self, connection: BaseDatabaseWrapper) -> Statements:
        if self._statements is None:
            self._statements = self.build_statements(connection)
        return self._statements

    def build_statements(self, connection: BaseDatabaseWrapper) -> Statements:
        return Statements.build(connection)

    def converts_dates_to(self, zone: str) -> bool:
        """Whether the database converts its datetimes to the time zone ``zone``, as Django's
        date functions (the admin's date hierarchy) ask it to (:mod:`.time_zones`)."""
        return True

    def eviction_stall(self) -> timedelta | None:
        """How long the database's surviving nodes stall writes while they evict a dead one
        (:mod:`.galera`); ``None``: it is no such cluster."""
        return None

    def fetch_row(self, connection: BaseDatabaseWrapper, sql: str, params: list[Any]) -> Any:
        """Send one store statement that returns rows: its first row (``None``: none)."""
        return rows.fetch_row(connection, sql, params)

    def first(
        self, connection: BaseDatabaseWrapper, sql: str, params: list[Any]
    ) -> IdempotencyKey | None:
        """The record a statement returns (all of its columns), as the ORM loads it.

        A cursor and the fields' converters (dates, UUIDs, JSON), not ``raw()``, whose per-call
        column resolution costs as much as the statement on a replay.
        """
        row = self.fetch_row(connection, sql, params)
        return None if row is None else rows.loaded(connection, row)

    #: Each column's value as the fenced writes send it (:func:`.rows.preparers`; a vendor may
    #: send some as text its server reads for less).
    text_preparers = staticmethod(preparers)

    @staticmethod
    @per_connection
    def set_placeholders(connection: BaseDatabaseWrapper) -> dict[str, str]:
        """How a fenced write's ``SET`` reads a column's value, where not ``%s``."""
        return {}

    def is_lock_timeout(self, exc: BaseException) -> bool:
        """Whether a database error is a lock wait that ran out (a ``409``, not a ``503``)."""
        return False

    def is_contention(self, exc: BaseException) -> bool:
        """Whether a write failed only because another writer held a lock it needed (a lock
        wait that ran out, a deadlock's victim): the same statement may succeed when tried
        again. An owner's fenced write is (:func:`django_idempotency._call.writing.complete`)."""
        return self.is_lock_timeout(exc)

    def is_fault(self, exc: BaseException) -> bool:
        """Whether a statement failed for its connection or its server, not for itself: the
        connection was lost or refused, the server is shutting down or refuses writes for now
        (read-only, a failover). The same statement may succeed on a new connection once the
        server answers again, so an owner's fenced write is tried again there."""
        return False

    def is_transient(self, exc: BaseException) -> bool:
        """Whether a database error says the store is unavailable for now (a ``503``) rather
        than that a statement is wrong: contention or a fault. The project's code asks (the
        scope function, a framework's authentication), whose error may come from another
        database: one another vendor's driver raised is not this store's to judge (a SQLite
        file's ``no such table`` or MySQL's unknown column is an ``OperationalError`` without
        a SQLSTATE, which PostgreSQL's driver raises only for a lost connection)."""
        return self.raised_by_driver(exc) and (self.is_contention(exc) or self.is_fault(exc))

    def raised_by_driver(self, exc: BaseException) -> bool:
        """Whether ``exc`` is not another driver's: Django's error wrapping this alias's
        driver's, or one no driver of the project's databases raised (the app's own, one the
        project's code raised)."""
        cause = exc.__cause__ if isinstance(exc, DatabaseError) else None
        if cause is None:
            return True
        drivers = {alias: _driver_error(alias) for alias in connections}
        own = drivers.get(self.alias)
        if own is not None and isinstance(cause, own):
            return True
        return not any(error is not None and isinstance(cause, error) for error in drivers.values())

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Translate the store's database errors into the app's own exceptions.

        Any error but a lock wait is the store being unavailable (a ``503``), never a raw
        ``500``: a lost connection and a statement the server refuses alike.
        """
        try:
            yield
        except DatabaseError as exc:
            raise self.refusal(exc) from exc

    def bounded(
        self, connection: BaseDatabaseWrapper, seconds: float, statement: Callable[[], T]
    ) -> T:
        """Run ``statement()``, the app's own on ``connection``, within ``seconds``
        (:mod:`.deadlines`): past them the connection is cut and the statement fails as on a
        lost connection (a fault). One cut just after the statement returned fails it too:
        the connection is dead, and what it did is found again by its lock token. A fault
        drains the alias's connection pool (:meth:`faulted`)."""
        try:
            # Connects first, if need be.
            watch = deadlines.watch(connection, seconds, self.socket_read_first)
            try:
                result = statement()
            finally:
                cut = deadlines.unwatch(watch)
        except DatabaseError as exc:
            self.faulted(exc)
            raise
        if cut:
            late = deadlines.Late(f"No reply from {self.alias!r} within {seconds:.3g} s.")
            self.faulted(late)
            raise late
        return result

    def bounded_here(self, seconds: float, statement: Callable[[], T]) -> T:
        return self.bounded(self.connection, seconds, statement)

    def in_transaction(self) -> bool:
        return self.connection.in_atomic_block

    def reconnect_thread(self, exc: BaseException) -> bool:
        """Close the thread's connection after a fault that left it unusable (not a server
        that answered with a refusal: read-only), outside any transaction; ``False`` where the
        connection never connected (so would connecting again), is in a transaction, or still
        answers."""
        connection = self.connection
        if (
            connection.in_atomic_block
            or connection.connection is None
            or not self.is_fault(exc)
            or connection.is_usable()
        ):
            return False
        discard(connection)
        return True

    def drop_thread_connection(self) -> None:
        connection = self.connection
        if not connection.in_atomic_block:
            discard(connection)

    def idle_thread(self) -> None:
        with suppress(DatabaseError):
            connections[self.alias].close_if_unusable_or_obsolete()

    def narrow_charsets(self, seconds: float) -> Any | None:
        connection = self.connection
        return self.bounded(connection, seconds, lambda: charsets.known_narrow(connection))

    def faulted(self, exc: BaseException) -> None:
        """After a statement's error: a fault (:meth:`is_fault`) drains the alias's pool.

        Django's pool (PostgreSQL, ``"pool"`` in ``OPTIONS``) hands out the connections it
        holds without a check unless ``CONN_HEALTH_CHECKS`` is on, and a restart killed, a
        blackhole silenced, every one made before the fault: each would fail, or hang, one
        request after another. Drained, the pool closes those it holds and those
        in use when they come back, and makes new ones. At most once per :data:`DRAIN_EVERY`.
        """
        if not self.is_fault(exc):
            return
        pool = getattr(connections[self.alias], "pool", None)
        drain = getattr(pool, "drain", None)  # psycopg_pool 3.3+
        if drain is None:
            return
        now = time.monotonic()
        if now - getattr(pool, _DRAINED, -DRAIN_EVERY) < DRAIN_EVERY:
            return
        setattr(pool, _DRAINED, now)
        logger.warning(
            "Idempotency store %r failed (%s); draining its connection pool.", self.alias, exc
        )
        try:
            drain()
        except Exception:  # a pool closed meanwhile: nothing left to drain
            logger.debug("Draining the pool of %r failed.", self.alias, exc_info=True)

    def expected_fault(self, exc: BaseException) -> bool:
        """Whether ``exc`` (a refusal, with its cause) is an outage the store knows, logged on
        one line without a traceback: the database's faults keep theirs."""
        return False

    def refusal(self, exc: BaseException) -> LockWaitTimeout | StoreUnavailable:
        """What :meth:`guard` raises for ``exc`` (for a hot path that cannot afford a
        generator's context manager: ``raise store.refusal(exc) from exc``)."""
        if self.is_lock_timeout(exc):
            return LockWaitTimeout(str(exc))
        return StoreUnavailable(str(exc))


def discard(connection: BaseDatabaseWrapper) -> None:
    """Close a connection a fault left unusable, so that its next use makes a new one.

    A pooled connection's driver connection is closed first: Django's ``close()`` gives it
    back to the pool, which keeps an open one (a socket cut after its statement returned
    still looks open) and drops a closed one."""
    raw = connection.connection
    if raw is not None and getattr(connection, "pool", None) is not None:
        try:
            raw.close()
        except Exception:  # already broken
            logger.debug("Closing a pooled connection failed.", exc_info=True)
    try:
        connection.close()
    except DatabaseError:  # already broken: nothing left to close
        logger.debug("Closing a connection of the idempotency store failed.", exc_info=True)


def database_key(connection: BaseDatabaseWrapper) -> tuple[Any, ...]:
    """The database a connection is on: what is checked once per process (the claim's own
    function or procedure) is kept under it."""
    settings = connection.settings_dict
    return (connection.alias, settings["NAME"], settings["HOST"], settings["PORT"])


def _driver_error(alias: str) -> type[BaseException] | None:
    """The base class of the errors the driver of the database ``alias`` raises (PEP 249's
    ``Error``), which Django's errors wrap as their ``__cause__``."""
    error = getattr(getattr(connections[alias], "Database", None), "Error", None)
    return error if isinstance(error, type) and issubclass(error, BaseException) else None


def unsupported(connection: BaseDatabaseWrapper) -> StoreUnavailable:
    """The error of a database no store serves (check E030 refuses it at start-up)."""
    return StoreUnavailable(
        f"Database {connection.alias!r} ({connection.vendor}) is not supported."
    )
