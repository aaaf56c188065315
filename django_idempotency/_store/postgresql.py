"""PostgreSQL: the claim in one call of a function, a bounded lock wait inside it, a cleanup that
skips locked rows.

The function (``django_idempotency_claim``, created by the migration
``0003_postgresql_claim_function``, replaced by ``0004_claim_reads_first`` and
``0009_takeover_keeps_expiry_past_lock``) reads the key's
record first, and only when there is none inserts it, or takes it over when it is expired or
stale, bounding the lock wait of atomic mode, in one statement: a replay writes nothing, so it
is served while the database refuses writes. PL/pgSQL keeps its statements' plans for the life
of the server connection, where a statement sent as Django sends it (no server-side binding) is
parsed and planned on every request. Nothing is prepared by name
and nothing is set for the session, so it is safe behind a transaction-mode pooler. Without the
function (a table made by ``--nomigrations``), the claim falls back to plain statements, which
insert first.

Each of the function's statements takes a snapshot of its own (it is ``VOLATILE``), as the
statements sent one by one do: the takeover's ``UPDATE`` re-checks the rule against the row a
concurrent winner left, and nothing found means ``None`` (claim again). The caller's
``lock_timeout`` is restored before it returns; a lock wait that ran out aborts the transaction
(or the savepoint), which undoes the function's own ``set_config`` too. Its text is the
migration's alone; ``tests/test_claim_function_postgresql.py`` checks that each statement in it
is the one :class:`Statements` builds, so a change to the table or the rules comes with a
migration that replaces the function.
"""

from __future__ import annotations

import json
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, cast

from django.db import InterfaceError, OperationalError, ProgrammingError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import DateTimeField

from django_idempotency._base.durations import MICROSECOND, microseconds
from django_idempotency._base.errors import StoreUnavailable
from django_idempotency._base.json import acyclic_encoder
from django_idempotency._store import libpq
from django_idempotency._store.base import Store
from django_idempotency._store.bound import database_key
from django_idempotency._store.claims import Claimant, ClaimValues
from django_idempotency._store.maintenance import Batch, BatchQuery, SizeQuery
from django_idempotency._store.rows import (
    AS_TEXT,
    COLUMNS,
    FIELDS,
    Converters,
    Record,
    fetch_row,
    lean_converters,
    per_connection,
    preparers,
)
from django_idempotency._store.statements import Statements, finished_where
from django_idempotency.models import IdempotencyKey

#: The claim function's name and its arguments: the claim's values (the claim's time once, for
#: its ``created_at`` and ``updated_at``), then the lock wait's bound.
CLAIM_FUNCTION = "django_idempotency_claim"
_ARGUMENTS = [
    ("p_scope", "text"),
    ("p_key_hash", "text"),
    ("p_method", "text"),
    ("p_path", "text"),
    ("p_request_hash", "text"),
    ("p_lock_token", "uuid"),
    ("p_now", "timestamptz"),
    ("p_unlock_at", "timestamptz"),
    ("p_expires_at", "timestamptz"),
    ("p_lock_timeout", "text"),
]
CLAIM_FUNCTION_SIGNATURE = f"{CLAIM_FUNCTION}({', '.join(kind for _, kind in _ARGUMENTS)})"
#: SQLSTATE classes of a fault (:meth:`PostgreSQLStore.is_fault`), and a read-only refusal.
_FAULT_CLASSES = ("08", "53", "57", "58")
_READ_ONLY = "25006"


class _InTheClaim:
    """What :meth:`PostgreSQLStore.limit_lock_wait` returns when the claim function bounds the
    wait: the connection to forget the bound on (not looked up again)."""

    __slots__ = ("connection",)

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.connection = connection


@dataclass(frozen=True)
class PostgreSQLStatements(Statements):
    #: The insert and, on a conflict, the read of the row in place, in one statement.
    insert_or_select: str
    #: The same (and the takeover, and the lock wait's bound) in one call of the claim function.
    call: str
    #: :attr:`~.Statements.finished`, every column as :func:`read_record` reads them,
    #: its time the claim's clock (microseconds since the epoch).
    lean_finished: str


#: Whether the claim function is there, per database (checked once per process): without the
#: migration (``--nomigrations``) the claim runs as plain statements.
_HAS_FUNCTION: dict[tuple[Any, ...], bool] = {}

#: The driver connections (server sessions) that have claimed, whose claims call the claim
#: function (:meth:`PostgreSQLStore.claims_by_call`): the driver's, not Django's wrapper, which
#: a pool hands a different one at each checkout.
_CALLING: weakref.WeakSet[Any] = weakref.WeakSet()
#: A driver connection that takes no weak reference is kept on its wrapper, under this name.
_CALLING_HERE = "_django_idempotency_calling"

#: The attribute of a connection holding the lock wait's bound a claim passes to the function:
#: (the atomic block it holds for, value). An attribute: a weak dictionary's entry costs
#: every atomic claim more than its bound's two other steps together.
_LOCK_WAIT = "_django_idempotency_lock_wait"


#: A time sent as microseconds since the epoch, read back by PostgreSQL exactly.
POSTGRESQL_TIME = "timestamptz 'epoch' + %s::float8 * interval '1 microsecond'"


def lean_columns(quote: Callable[[str], str]) -> str:
    """Every column, :data:`~.rows.AS_TEXT` ones cast to text: what :func:`read_record`
    reads."""
    return ", ".join(
        f"{quote(column)}::text" if column in AS_TEXT else quote(column) for column in COLUMNS
    )


def read_record(connection: BaseDatabaseWrapper, sql: str, params: list[Any]) -> Record | None:
    """The record a lean statement returns (every column, :data:`~.rows.AS_TEXT` as text),
    read through libpq where it can be (:mod:`.libpq`)."""
    row = fetch_row(connection, sql, params, libpq.first_row)
    return None if row is None else Record(row, record_converters(connection))


@per_connection
def record_converters(connection: BaseDatabaseWrapper) -> Converters:
    """:func:`~.rows.lean_converters` with the time stamps loaded from their text as psycopg
    loads them, with the connection's time zone (as Django's loader)."""
    from psycopg.postgres import types
    from psycopg.pq import Format

    oid = types["timestamptz"].oid
    loader_class = connection.connection.adapters.get_loader(oid, Format.TEXT)
    loader = loader_class(oid, connection.connection)
    zone = connection.timezone

    def load_time(text: str) -> datetime:
        return cast(datetime, loader.load(text.encode()).replace(tzinfo=zone))

    return lean_converters(connection, load_time)


#: ``json.dumps`` of the headers column's values, its C encoder made once.
_HEADERS_JSON = acyclic_encoder(json.JSONEncoder())


@per_connection
def set_placeholders(connection: BaseDatabaseWrapper) -> dict[str, str]:
    """How a fenced write's ``SET`` reads each column's value (:func:`text_preparers`): a
    time's expression, from microseconds since the epoch."""
    return {field.name: POSTGRESQL_TIME for field in FIELDS if isinstance(field, DateTimeField)}


@per_connection
def text_preparers(connection: BaseDatabaseWrapper) -> dict[str, Callable[[Any], Any]]:
    """Each column's value as the store's fenced writes send it: UUIDs and JSON as text,
    which psycopg adapts for a fraction of what a ``UUID`` or a ``Jsonb`` costs,
    sent as of unknown type, which the server reads as the column's type (``SET``, a
    comparison), and times as microseconds since the epoch (:func:`set_placeholders`)."""
    prepare = dict(preparers(connection))

    def text(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
        return lambda value: None if value is None else convert(value)

    for field in FIELDS:
        kind = field.get_internal_type()
        if kind == "DateTimeField":
            prepare[field.name] = text(microseconds)
        elif kind == "UUIDField":
            prepare[field.name] = text(str)
        elif field.name == "response_headers":  # the app's own lists: no cycle
            prepare[field.name] = text(_HEADERS_JSON)
        elif kind == "JSONField" and getattr(field, "encoder", None) is None:
            prepare[field.name] = text(json.dumps)
        elif kind == "BinaryField":
            prepare[field.name] = lambda value: value
    return prepare


class PostgreSQLStore(Store):
    vendor = "postgresql"
    name = "PostgreSQL"
    chains_writes = True
    features = replace(Store.features, notifies=True)
    text_preparers = staticmethod(text_preparers)
    set_placeholders = staticmethod(set_placeholders)

    def build_statements(self, connection: BaseDatabaseWrapper) -> PostgreSQLStatements:
        built = Statements.build(connection)
        # Cast, so that the values can be sent as text (cheaper to send than a UUID) whether
        # psycopg binds them on the client or on the server. The times come from the claim's
        # clock (microseconds since the epoch) and its two durations, added here: exact
        # (whole microseconds), and no datetime made or written out in Python.
        arguments = ", ".join(
            {
                "p_lock_token": "%s::uuid",
                "p_now": "clock.now",
                "p_unlock_at": "clock.now + %s::interval",
                "p_expires_at": "clock.now + %s::interval",
            }.get(name, "%s")
            for name, _ in _ARGUMENTS
        )
        return PostgreSQLStatements(
            **vars(built),
            insert_or_select=f"WITH inserted AS ({built.insert}) SELECT * FROM inserted "
            f"UNION ALL {built.select}",
            call=f"SELECT {lean_columns(connection.ops.quote_name)} "
            f"FROM (SELECT {POSTGRESQL_TIME} AS now) AS clock, {CLAIM_FUNCTION}({arguments})",
            lean_finished=finished_where(
                connection.ops.quote_name,
                f"SELECT {lean_columns(connection.ops.quote_name)} FROM {built.table} "
                f"WHERE {connection.ops.quote_name('scope')} = %s "
                f"AND {connection.ops.quote_name('key_hash')} = %s",
                POSTGRESQL_TIME,
            ),
        )

    def select_finished(
        self, connection: BaseDatabaseWrapper, identity: Claimant[Any]
    ) -> Record | None:
        """One indexed read, sent through libpq (:mod:`.libpq`) where it can be: a replay's
        only statement in atomic mode."""
        statements = self.statements(connection)
        assert isinstance(statements, PostgreSQLStatements)
        params = [identity.scope, identity.key_hash, time.time_ns() // 1000]
        return read_record(connection, statements.lean_finished, params)

    def insert_or_load(
        self, connection: BaseDatabaseWrapper, values: ClaimValues
    ) -> Record | IdempotencyKey | None:
        """One call of the claim function, which takes an expired or stale record over too
        (a :class:`~.rows.Record`: nothing is left for Python to decide but whose it is).

        Its values go as text, each one cast in the statement: psycopg adapts a ``str`` for
        a fraction of what a ``datetime`` or a ``UUID`` costs; its times as the claim's clock
        and two durations (:meth:`build_statements`). The row comes back with its times and
        token as text too, converted only if read (:class:`~.rows.Record`).

        A session's first claim outside a transaction reads the record first (a replay's one
        statement), and inserts as below only when there was none: the function costs a new
        session more than it saves (:meth:`claims_by_call`).

        Without the function, one statement: a data-modifying CTE inserts with ``ON CONFLICT DO
        NOTHING`` (which writes nothing on a conflict, so a replay commits no transaction and
        waits for no disk flush), and the outer ``SELECT`` reads the existing row. Both see the
        statement's snapshot, so a row committed by a concurrent attempt after it began is seen
        by neither: ``None``, and the caller claims again.
        """
        statements = self.statements(connection)
        assert isinstance(statements, PostgreSQLStatements)
        if self.has_function(connection) and not self.claims_by_call(connection):
            # A session's first claim outside a transaction: plain statements, the record read
            # first as the function reads it (a replay writes nothing), the insert only when
            # there was none; the next claims on this session call the function.
            identity = values.identity
            found = self.first(connection, statements.select, [identity.scope, identity.key_hash])
            try:
                _CALLING.add(connection.connection)
            except TypeError:
                connection.__dict__[_CALLING_HERE] = connection.connection
            if found is not None:
                return found
        elif self.has_function(connection):
            try:
                return read_record(connection, statements.call, _call_params(connection, values))
            except ProgrammingError as exc:
                if getattr(exc.__cause__, "sqlstate", None) != "42883":  # undefined_function
                    raise
                _function_dropped(connection, exc)
        identity = values.identity
        params = values.params(connection)
        return self.first(
            connection, statements.insert_or_select, [*params, identity.scope, identity.key_hash]
        )

    @staticmethod
    def claims_by_call(connection: BaseDatabaseWrapper) -> bool:
        """Whether a claim calls the claim function: in a transaction (atomic mode's bound on
        the lock wait goes with the call: :meth:`limit_lock_wait`), and on a session that has
        claimed before. A session's first claim outside one is sent as plain statements
        (:meth:`insert_or_load`): PL/pgSQL is loaded and the function compiled once per
        session, which cost a new session's replay twice a plain read (3.0 ms for 1.5 ms on
        PostgreSQL 15), and with ``CONN_MAX_AGE`` 0, or under ASGI, each request's session is
        new."""
        raw = connection.connection  # None before it connects: a new session, then
        return (
            connection.in_atomic_block
            or raw in _CALLING
            or (raw is not None and connection.__dict__.get(_CALLING_HERE) is raw)
        )

    def has_function(self, connection: BaseDatabaseWrapper) -> bool:
        database = database_key(connection)
        present = _HAS_FUNCTION.get(database)
        if present is None:
            with self.guard(), connection.cursor() as cursor:
                cursor.execute("SELECT to_regprocedure(%s) IS NOT NULL", [CLAIM_FUNCTION_SIGNATURE])
                present = _HAS_FUNCTION[database] = bool(cursor.fetchone()[0])
        return present

    def limit_lock_wait(self, timeout: timedelta) -> object:
        """Bound the lock wait of the claims of this atomic block.

        With the claim function, nothing is sent: the function sets ``lock_timeout`` for its own
        statements and restores the caller's before it returns. Otherwise ``lock_timeout`` is
        set for the transaction and the value it replaced returned; the ``OFFSET 0`` subquery
        is read before the outer ``set_config`` runs, so the old value is read before it is
        replaced, in one round trip.
        """
        connection = self.connection
        milliseconds = _LOCK_TIMEOUTS.get(timeout)
        if milliseconds is None:  # once per policy
            milliseconds = _LOCK_TIMEOUTS[timeout] = f"{max(1, timeout // _MILLISECOND)}ms"
        if connection.atomic_blocks and self.has_function(connection):
            connection.__dict__[_LOCK_WAIT] = (connection.atomic_blocks[-1], milliseconds)
            return _InTheClaim(connection)
        with self.guard(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT before.previous, set_config('lock_timeout', %s, true) "
                "FROM (SELECT current_setting('lock_timeout') AS previous OFFSET 0) AS before",
                [milliseconds],
            )
            row = cursor.fetchone()
        return str(row[0]) if row else None

    def restore_lock_wait(self, previous: object) -> None:
        if isinstance(previous, _InTheClaim):
            previous.connection.__dict__.pop(_LOCK_WAIT, None)
            return
        if not isinstance(previous, str):  # None: nothing was set
            return
        with self.guard(), self.connection.cursor() as cursor:
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [previous])

    def delete_batch(self, connection: BaseDatabaseWrapper, batch: BatchQuery) -> Batch:
        """One statement, and only a count and a timestamp back to Python.

        The rows are locked with ``FOR UPDATE SKIP LOCKED``: two runs at once share the rows
        instead of waiting for each other, and a row a claim is rewriting right now is left for
        the next run.
        """
        q = connection.ops.quote_name
        table = q(IdempotencyKey._meta.db_table)
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            # The batch's commit need not wait for its WAL flush (nor make the claims' commits
            # queue behind it): a delete lost in a crash is redone by the next run, and a later
            # claim's synchronous commit flushes it anyway.
            cursor.execute("SET LOCAL synchronous_commit TO OFF")
            cursor.execute(
                f"WITH batch AS ({batch.select} FOR UPDATE SKIP LOCKED), "
                f"gone AS (DELETE FROM {table} USING batch "
                f"WHERE {table}.{q('id')} = batch.{q('id')} RETURNING {table}.{q('expires_at')}) "
                f"SELECT count(*), max({q('expires_at')}) FROM gone",
                [*batch.params, batch.size],
            )
            deleted, last = cursor.fetchone()
        return Batch(deleted, last) if deleted else Batch(0, None)

    def in_ids(self, connection: BaseDatabaseWrapper, ids: list[int]) -> tuple[str, list[Any]]:
        return f"{connection.ops.quote_name('id')} = ANY(%s)", [ids]

    def is_lock_timeout(self, exc: BaseException) -> bool:
        return getattr(exc.__cause__, "sqlstate", None) == "55P03"  # lock_not_available

    def is_contention(self, exc: BaseException) -> bool:
        # lock_not_available, deadlock_detected, serialization_failure
        return getattr(exc.__cause__, "sqlstate", None) in ("55P03", "40P01", "40001")

    def is_fault(self, exc: BaseException) -> bool:
        """A lost or refused connection (an ``InterfaceError``, or an ``OperationalError``
        without a SQLSTATE), or a SQLSTATE of the connection's or the server's state:
        ``08`` connection exceptions, ``57`` operator intervention (``57P01`` admin shutdown,
        ``57P02`` crash shutdown, ``57P03`` cannot connect now), ``53`` insufficient resources,
        ``58`` system errors, and ``25006`` (a read-only transaction: a standby, or
        ``default_transaction_read_only``)."""
        if isinstance(exc, InterfaceError):
            return True
        if self.is_contention(exc):
            return False
        state = getattr(exc.__cause__, "sqlstate", None)
        if state is None:
            return isinstance(exc, OperationalError)
        return state[:2] in _FAULT_CLASSES or state == _READ_ONLY

    def size_query(self, table: str) -> SizeQuery:
        # The table's bytes include its TOAST (large bodies); the indexes are counted apart.
        return SizeQuery(
            "SELECT pg_total_relation_size(t) - pg_indexes_size(t), pg_indexes_size(t) "
            "FROM (SELECT %s::regclass AS t) AS target",
            [f'"{table}"'],
            "pg_total_relation_size, pg_indexes_size",
        )


def interval(duration: timedelta) -> str:
    """A duration as PostgreSQL's ``interval`` reads it, exactly (whole microseconds); made
    once per duration (a policy's ``lock_timeout`` and ``ttl``)."""
    text = _INTERVALS.get(duration)
    if text is None:
        text = _INTERVALS[duration] = f"{duration // MICROSECOND} microseconds"
    return text


_INTERVALS: dict[timedelta, str] = {}
#: Each lock wait's bound as ``lock_timeout`` reads it (whole milliseconds, at least one).
_LOCK_TIMEOUTS: dict[timedelta, str] = {}
_MILLISECOND = timedelta(milliseconds=1)


def _bound(connection: BaseDatabaseWrapper) -> str | None:
    """The lock wait's bound set for the innermost atomic block, if it is still the one."""
    bound = connection.__dict__.get(_LOCK_WAIT)
    blocks = connection.atomic_blocks
    return bound[1] if bound is not None and blocks and blocks[-1] is bound[0] else None


def _call_params(connection: BaseDatabaseWrapper, values: ClaimValues) -> list[Any]:
    """The claim function's arguments, in its order: text and intervals, each cast by the
    statement (:meth:`PostgreSQLStore.insert_or_load`)."""
    identity = values.identity
    return [
        values.clock,
        identity.scope,
        identity.key_hash,
        identity.method,
        identity.path,
        identity.fingerprint,
        values.token,
        interval(values.lock_timeout),
        interval(values.ttl),
        _bound(connection),
    ]


def _function_dropped(connection: BaseDatabaseWrapper, exc: ProgrammingError) -> None:
    """The claim function was dropped since (the migration unapplied): plain statements from
    now on. In a transaction, lost with the error, the claim is refused and a retry claims
    anew."""
    _HAS_FUNCTION[database_key(connection)] = False
    if connection.in_atomic_block:
        raise StoreUnavailable(str(exc)) from exc
