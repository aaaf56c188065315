"""The interface every database's store implements, and what they share.

A vendor module (:mod:`.postgresql`, :mod:`.sqlite`) subclasses :class:`Store` and writes the
statements its database needs: the claim's insert-or-read, the lock-wait bound, the cleanup's
batch delete, and how it reports a lock wait that timed out. Everything else (the takeover,
the fenced writes, the stale scan) is written once here from the rules in
:mod:`django_idempotency._rules`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple, TypeVar, cast
from weakref import WeakKeyDictionary

from django.conf import settings
from django.db import DatabaseError
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import CharField, DateTimeField, Field, QuerySet, TextField
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from django_idempotency import _rules as rules
from django_idempotency.exceptions import LockWaitTimeout, StoreUnavailable
from django_idempotency.models import IdempotencyKey

PROCESSING = IdempotencyKey.Status.PROCESSING
COMPLETED = IdempotencyKey.Status.COMPLETED
FAILED = IdempotencyKey.Status.FAILED
T = TypeVar("T")

_INSERT_COLUMNS = (
    "scope",
    "key_hash",
    "method",
    "path",
    "request_hash",
    "status",
    "response_headers",
    "recovery_point",
    "lock_token",
    "attempt",
    "created_at",
    "updated_at",
    "unlock_at",
    "expires_at",
)

#: What every claim writes alike, as SQL literals in its statements rather than parameters:
#: a parameter costs its adaptation on every request (``[]`` a JSON encoding), a literal none.
_CLAIM_LITERALS = {
    "status": f"'{PROCESSING.value}'",
    "response_headers": "'[]'",
    "recovery_point": "''",
    "attempt": "1",
}
#: The claim's values sent as parameters, in the order of its placeholders.
CLAIM_PARAMS = tuple(name for name in _INSERT_COLUMNS if name not in _CLAIM_LITERALS)

#: Set afresh by a takeover, from the new attempt's values.
_TAKEOVER_FRESH = (
    "method",
    "path",
    "request_hash",
    "status",
    "response_headers",
    "lock_token",
    "updated_at",
    "unlock_at",
)

#: Every field, in table order: the record a claim reads is replayed or handed to signals.
_FIELDS = [field for field in IdempotencyKey._meta.concrete_fields if field.column]
_ATTNAMES = [field.attname for field in _FIELDS]
_COLUMNS = [field.column for field in _FIELDS if field.column]


@dataclass(frozen=True)
class StoredResponse:
    """A final result as the record keeps it (a view's response, a function's result)."""

    status: int
    headers: list[list[str]]
    body: bytes | None  # None: the body was over MAX_BODY_SIZE and was not kept
    #: Its own TTL (``store_for()``), counted from when it is stored; ``None``: ``expires_at``
    #: stays as the claim set it.
    ttl: timedelta | None = None


@dataclass(frozen=True)
class Claimed:
    """The claim's outcome when this attempt now owns the record."""

    pk: int
    lock_token: uuid.UUID
    attempt: int
    recovery_point: str
    recovery_data: Any


@dataclass(frozen=True)
class Held:
    """The claim's outcome when another attempt's record holds the key."""

    record: IdempotencyKey


@dataclass(frozen=True)
class Raced:
    """The claim's outcome when a concurrent attempt claimed or released the key between its
    statements: claim again."""


RACED = Raced()
ClaimOutcome = Claimed | Held | Raced


class Lock(NamedTuple):
    """What a waiter polls: the record's status and when its lock expires."""

    status: str
    unlock_at: datetime | None


@dataclass(frozen=True)
class Batch:
    """One batch of :meth:`Store.delete_expired_batch`."""

    deleted: int
    #: The largest ``expires_at`` seen: the next batch starts there (``None``: nothing left).
    last_expires_at: datetime | None


@dataclass(frozen=True)
class BatchQuery:
    """A cleanup batch: its rows' condition and its parameters, and the ``SELECT`` of their
    ids and ``expires_at`` (``LIMIT`` its last placeholder, ``size``)."""

    where: str
    params: list[Any]
    select: str
    size: int


@dataclass(frozen=True)
class Statements:
    """The claim's statements for one database vendor, built once rather than per request."""

    table: str
    columns: str
    insert: str
    select: str
    take_over: str

    @classmethod
    def build(cls, connection: BaseDatabaseWrapper) -> Statements:
        """The statements with ``ON CONFLICT DO NOTHING`` and ``RETURNING``: the claim reads
        back the row it wrote in the statement that wrote it."""
        plain = cls.plain(connection)
        q = connection.ops.quote_name
        on_conflict = f" ON CONFLICT ({q('scope')}, {q('key_hash')}) DO NOTHING"
        returning = f" RETURNING {plain.columns}"
        return cls(
            plain.table,
            plain.columns,
            plain.insert + on_conflict + returning,
            plain.select,
            plain.take_over + returning,
        )

    @classmethod
    def plain(cls, connection: BaseDatabaseWrapper) -> Statements:
        """The statements in SQL every database takes: a plain ``INSERT`` and ``UPDATE``."""
        q = connection.ops.quote_name
        table = q(IdempotencyKey._meta.db_table)
        columns = ", ".join(q(column) for column in _COLUMNS)
        insert = (
            f"INSERT INTO {table} ({', '.join(q(name) for name in _INSERT_COLUMNS)}) "
            f"VALUES ({', '.join(_CLAIM_LITERALS.get(name, '%s') for name in _INSERT_COLUMNS)})"
        )
        select = f"SELECT {columns} FROM {table} WHERE {q('scope')} = %s AND {q('key_hash')} = %s"
        expired = rules.EXPIRED.where(q)

        def if_expired(name: str, then: str, otherwise: str = "") -> str:
            otherwise = otherwise or q(name)
            return f"{q(name)} = CASE WHEN {expired} THEN {then} ELSE {otherwise} END"

        # MySQL assigns from left to right, later expressions reading the new values: the
        # CASEs test expires_at, so it is assigned last.
        assignments = [
            *(f"{q(name)} = {_CLAIM_LITERALS.get(name, '%s')}" for name in _TAKEOVER_FRESH),
            f"{q('response_status')} = NULL",
            f"{q('response_body')} = NULL",
            if_expired("recovery_point", _CLAIM_LITERALS["recovery_point"]),
            if_expired("recovery_data", "NULL"),
            if_expired("attempt", _CLAIM_LITERALS["attempt"], f"{q('attempt')} + 1"),
            if_expired("created_at", "%s"),
            if_expired("expires_at", "%s"),
        ]
        take_over = (
            f"UPDATE {table} SET {', '.join(assignments)} "
            f"WHERE {q('id')} = %s AND {rules.TAKEOVER.where(q)}"
        )
        return Statements(table, columns, insert, select, take_over)


class SizeQuery(NamedTuple):
    """How a database measures the table: see :meth:`Store.size_query`."""

    sql: str
    params: list[Any]
    source: str


class Store:
    """Every statement the app runs against its table, each one atomic on its own.

    The claim inserts with ``INSERT ... ON CONFLICT DO NOTHING``; an expired or stale record is
    taken over by an ``UPDATE`` whose ``WHERE`` re-checks that it still is one. Every decision
    is made by one atomic statement, never by a check in Python followed by a write. Later
    writes of an attempt are fenced by its ``lock_token``. One instance per database vendor.
    """

    #: ``connection.vendor`` of the databases this class serves, and their name for people.
    vendor = ""
    name = ""
    #: The only ``isolation_level`` option a claim in atomic mode works under (``None``: any).
    isolation_level: str | None = None

    def __init__(self) -> None:
        self._statements: Statements | None = None

    def statements(self, connection: BaseDatabaseWrapper) -> Statements:
        if self._statements is None:
            self._statements = self.build_statements(connection)
        return self._statements

    def build_statements(self, connection: BaseDatabaseWrapper) -> Statements:
        return Statements.build(connection)

    # The claim.

    def claim(
        self,
        connection: BaseDatabaseWrapper,
        *,
        scope: str,
        key_hash: str,
        method: str,
        path: str,
        request_hash: str,
        ttl: timedelta,
        lock_timeout: timedelta,
    ) -> ClaimOutcome:
        """Claim the key, or return the record that holds it.

        A new key costs one statement and so does a live key's record (the replay's only one).
        An expired record, or a stale ``processing`` one with the same fingerprint, is taken
        over by one more, fenced ``UPDATE``.
        """
        now = timezone.now()
        token = uuid.uuid4()
        values = {
            "scope": scope,
            "key_hash": key_hash,
            "method": method,
            "path": path,
            "request_hash": request_hash,
            "lock_token": token,
            "created_at": now,
            "updated_at": now,
            "unlock_at": now + lock_timeout,
            "expires_at": now + ttl,
        }
        with self.guard():  # preparing a value may connect (MariaDB's UUID type: its version)
            prepare = _preparers(connection)
            params = [prepare[name](values[name]) for name in CLAIM_PARAMS]
            found = self.insert_or_load(connection, params, scope, key_hash, token)
            if found is None:
                return RACED
            if isinstance(found, Claimed):
                return found
            if found.lock_token == token:  # our fresh token: the row is the one we inserted
                return _claimed(found, token)
            if rules.TAKEOVER.holds(found, now, request_hash):
                return self.take_over(connection, found.pk, params, now, request_hash, token)
            return Held(found)

    def insert_or_load(
        self,
        connection: BaseDatabaseWrapper,
        params: list[Any],
        scope: str,
        key_hash: str,
        token: uuid.UUID,
    ) -> Claimed | IdempotencyKey | None:
        """Insert a new record, or read the one in place; ``None`` when neither is visible.

        The inserted record carries ``token``; a store that knows it inserted without reading
        the row back returns the :class:`Claimed` outright.
        """
        raise NotImplementedError

    def take_over(
        self,
        connection: BaseDatabaseWrapper,
        pk: int,
        params: list[Any],
        now: datetime,
        request_hash: str,
        token: uuid.UUID,
    ) -> Claimed | Raced:
        """Make an expired or stale record this attempt's, if it still is one.

        The ``WHERE`` repeats the test (:data:`~django_idempotency._rules.TAKEOVER`), so of
        concurrent attempts exactly one wins: the database re-checks it against the row a
        concurrent winner left. An expired record starts afresh; a stale one keeps its recovery
        point, attempt + 1.
        """
        values = self.take_over_params(connection, pk, params, now, request_hash)
        record = first(connection, self.statements(connection).take_over, values)
        return RACED if record is None else _claimed(record, token)

    def take_over_params(
        self,
        connection: BaseDatabaseWrapper,
        pk: int,
        params: list[Any],
        now: datetime,
        request_hash: str,
    ) -> list[Any]:
        """The values of :attr:`Statements.take_over`'s placeholders, in order."""
        fresh = dict(zip(CLAIM_PARAMS, params, strict=True))
        db_now = _prep("updated_at", now, connection)
        values = [fresh[name] for name in _TAKEOVER_FRESH if name not in _CLAIM_LITERALS]
        values += [db_now, db_now, db_now]  # expired? for recovery_point, recovery_data, attempt
        values += [db_now, fresh["created_at"], db_now, fresh["expires_at"]]
        return [*values, pk, *rules.TAKEOVER.args(db_now, request_hash)]

    def peek_status(
        self, connection: BaseDatabaseWrapper, scope: str, key_hash: str
    ) -> Lock | None:
        """The cheap poll of a waiter: status and ``unlock_at`` only."""
        with self.guard():
            row = (
                IdempotencyKey.objects.using(connection.alias)
                .filter(scope=scope, key_hash=key_hash)
                .values_list("status", "unlock_at")
                .first()
            )
        return None if row is None else Lock(*row)

    def limit_lock_wait(self, connection: BaseDatabaseWrapper, timeout: timedelta) -> str | None:
        """Bound how long the claim waits for another transaction's uncommitted row (atomic
        mode); returns what :meth:`restore_lock_wait` puts back, ``None`` for nothing."""
        return None

    def restore_lock_wait(self, connection: BaseDatabaseWrapper, previous: str | None) -> None:
        """Put back what :meth:`limit_lock_wait` replaced, before the caller's own code runs."""

    #: Whether :meth:`limit_lock_wait` lasts past the transaction (a session setting), and so
    #: is put back whatever the claim's outcome.
    lock_wait_outlives_transaction = False

    # The writes of an attempt, fenced by its lock token.

    def store_response(
        self,
        connection: BaseDatabaseWrapper,
        pk: int,
        token: uuid.UUID,
        stored: StoredResponse,
        *,
        stale_at: datetime | None = None,
    ) -> bool:
        """Store the final response; ``False`` when the lock was lost (the result is refused).

        With ``stale_at`` (an operator failing a stuck record) only while the lock is still
        expired at that time. A result with its own ``ttl`` sets ``expires_at`` in the same
        statement; any other leaves it out, so the default costs nothing more.
        """
        now = timezone.now()
        expiry = {} if stored.ttl is None else {"expires_at": now + stored.ttl}
        return self._fenced_update(
            connection,
            pk,
            token,
            stale_at,
            status=COMPLETED if stored.status < 400 else FAILED,
            response_status=stored.status,
            response_headers=stored.headers,
            response_body=stored.body,
            unlock_at=None,
            updated_at=now,
            **expiry,
        )

    def save_recovery_point(
        self,
        connection: BaseDatabaseWrapper,
        pk: int,
        token: uuid.UUID,
        name: str,
        data: Any,
        lock_timeout: timedelta,
    ) -> bool:
        """Record progress and renew the lock: an attempt that makes progress is alive."""
        now = timezone.now()
        return self._fenced_update(
            connection,
            pk,
            token,
            None,
            recovery_point=name,
            recovery_data=data,
            unlock_at=now + lock_timeout,
            updated_at=now,
        )

    def renew(
        self,
        connection: BaseDatabaseWrapper,
        leases: Sequence[tuple[int, uuid.UUID]],
        lock_timeout: timedelta,
    ) -> set[int]:
        """Push ``unlock_at`` of many attempts' records forward in one fenced statement
        (:mod:`django_idempotency._heartbeat`); returns the primary keys still held.

        Every record's own lock token must still be on it (tokens are fresh for every claim,
        so ``lock_token IN (...)`` cannot match one record with another's token), and it must
        still be ``processing``. When fewer rows match than were asked for (rare: a lock was
        lost), one ``SELECT`` says which: portable, where ``UPDATE ... RETURNING`` is not.
        """
        q = connection.ops.quote_name
        table = q(IdempotencyKey._meta.db_table)
        marks = ", ".join(["%s"] * len(leases))
        where = f"{q('id')} IN ({marks}) AND {q('lock_token')} IN ({marks}) AND {q('status')} = %s"
        params: list[Any] = [pk for pk, _ in leases]
        params += [_prep("lock_token", token, connection) for _, token in leases]
        params.append(PROCESSING)
        unlock_at = _prep("unlock_at", timezone.now() + lock_timeout, connection)
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET {q('unlock_at')} = %s WHERE {where}", [unlock_at, *params]
            )
            if cursor.rowcount == len(leases):
                return {pk for pk, _ in leases}
            cursor.execute(f"SELECT {q('id')} FROM {table} WHERE {where}", params)
            return {row[0] for row in cursor.fetchall()}

    def release(
        self,
        connection: BaseDatabaseWrapper,
        pk: int,
        token: uuid.UUID,
        *,
        stale_at: datetime | None = None,
    ) -> bool:
        """Delete the attempt's record so a retry claims afresh; ``False`` if the lock was lost.

        With ``stale_at`` (an operator releasing a stuck record) only while the lock is still
        expired at that time.
        """
        return self._fenced(connection, "DELETE FROM {table}", [], pk, token, stale_at)

    def _fenced_update(
        self,
        connection: BaseDatabaseWrapper,
        pk: int,
        token: uuid.UUID,
        stale_at: datetime | None,
        **changes: Any,
    ) -> bool:
        q = connection.ops.quote_name
        sets = ", ".join(f"{q(name)} = %s" for name in changes)
        values = [_prep(name, value, connection) for name, value in changes.items()]
        return self._fenced(connection, f"UPDATE {{table}} SET {sets}", values, pk, token, stale_at)

    def _fenced(
        self,
        connection: BaseDatabaseWrapper,
        statement: str,
        params: list[Any],
        pk: int,
        token: uuid.UUID,
        stale_at: datetime | None,
    ) -> bool:
        """Run a write on the attempt's own record only: its lock token, still ``processing``
        (and with ``stale_at``, still :data:`~django_idempotency._rules.STALE` then).

        Plain SQL: a queryset's ``update()`` and ``delete()`` compile on every call, and
        ``delete()`` may first ``SELECT`` the rows to send signals, which would lose the fence
        between the two statements.
        """
        q = connection.ops.quote_name
        sql = statement.format(table=q(IdempotencyKey._meta.db_table))
        sql += f" WHERE {q('id')} = %s AND {q('lock_token')} = %s"
        params = [*params, pk, _prep("lock_token", token, connection)]
        if stale_at is None:
            sql += f" AND {q('status')} = %s"
            params.append(PROCESSING)
        else:
            sql += f" AND {rules.STALE.where(q)}"
            params += rules.STALE.args(_prep("unlock_at", stale_at, connection))
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return bool(cursor.rowcount)

    # The operators' reads and the cleanup.

    def stale_records(
        self, connection: BaseDatabaseWrapper, *, older_than: timedelta = timedelta(0)
    ) -> QuerySet[IdempotencyKey]:
        """Records stuck in ``processing`` whose lock expired at least ``older_than`` ago."""
        cutoff = timezone.now() - older_than
        return (
            IdempotencyKey.objects.using(connection.alias)
            .filter(rules.STALE.filter(cutoff))
            .order_by("unlock_at", "pk")
        )

    def expired_records(
        self, connection: BaseDatabaseWrapper, *, now: datetime
    ) -> QuerySet[IdempotencyKey]:
        """The records :meth:`delete_expired_batch` would delete."""
        return IdempotencyKey.objects.using(connection.alias).filter(rules.DELETABLE.filter(now))

    def delete_expired_batch(
        self,
        connection: BaseDatabaseWrapper,
        *,
        now: datetime,
        batch_size: int,
        after: datetime | None = None,
        pks: list[int] | None = None,
    ) -> Batch:
        """Delete up to ``batch_size`` :data:`~django_idempotency._rules.DELETABLE` records in
        one short transaction of its own.

        The rows are picked by primary key on the ``expires_at`` index, from ``after`` on (so a
        long run does not rescan the dead rows it left behind). ``pks`` restricts the batch to
        those records (the admin's selection).
        """
        if pks is not None and not pks:
            return Batch(0, None)
        return self.delete_batch(
            connection, self.batch_query(connection, now, batch_size, after, pks)
        )

    def delete_batch(self, connection: BaseDatabaseWrapper, batch: BatchQuery) -> Batch:
        """Delete the rows ``batch.select`` picks, in a transaction of their own."""
        raise NotImplementedError

    def batch_query(
        self,
        connection: BaseDatabaseWrapper,
        now: datetime,
        size: int,
        after: datetime | None,
        pks: list[int] | None,
    ) -> BatchQuery:
        q = connection.ops.quote_name
        db_now = _prep("expires_at", now, connection)
        where = rules.DELETABLE.where(q)
        params = rules.DELETABLE.args(db_now)
        if after is not None:
            where += f" AND {q('expires_at')} >= %s"
            params.append(_prep("expires_at", after, connection))
        if pks:
            in_pks, in_params = self.in_ids(connection, pks)
            where += f" AND {in_pks}"
            params += in_params
        select = f"SELECT {q('id')}, {q('expires_at')} FROM {self.batch_from(connection)} "
        select += f"WHERE {where} ORDER BY {q('expires_at')} LIMIT %s"
        return BatchQuery(where, params, select, size)

    def batch_from(self, connection: BaseDatabaseWrapper) -> str:
        """What the batch's ``SELECT`` reads ``FROM``: the table (and a database's hints)."""
        return connection.ops.quote_name(IdempotencyKey._meta.db_table)

    def in_ids(self, connection: BaseDatabaseWrapper, ids: list[int]) -> tuple[str, list[Any]]:
        """``id`` is one of ``ids``, and its parameters."""
        column = connection.ops.quote_name("id")
        return f"{column} IN ({', '.join(['%s'] * len(ids))})", list(ids)

    # Errors.

    def size_query(self, table: str) -> SizeQuery | None:
        """The statement giving ``(table bytes, index bytes)``, its parameters and its name for
        an operator (``idempotency_stats``); ``None`` where the database has none."""
        return None

    def database_size(self, connection: BaseDatabaseWrapper) -> tuple[int, str] | None:
        """The whole database's bytes and how they were measured, when :meth:`size_query` has
        no answer; ``None`` where the database has none either."""
        return None

    def is_lock_timeout(self, exc: BaseException) -> bool:
        """Whether a database error is a lock wait that ran out (a ``409``, not a ``503``)."""
        return False

    def is_contention(self, exc: BaseException) -> bool:
        """Whether a write failed only because another writer held a lock it needed (a lock
        wait that ran out, a deadlock's victim): the same statement may succeed when tried
        again. An owner's fenced write is (:func:`django_idempotency._engine.complete`)."""
        return self.is_lock_timeout(exc)

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Translate the store's database errors into the app's own exceptions.

        Any error but a lock wait is the store being unavailable (a ``503``), never a raw
        ``500``: a lost connection and a statement the server refuses alike.
        """
        try:
            yield
        except DatabaseError as exc:
            if self.is_lock_timeout(exc):
                raise LockWaitTimeout(str(exc)) from exc
            raise StoreUnavailable(str(exc)) from exc


Build = Callable[[BaseDatabaseWrapper], T]
_PER_CONNECTION: WeakKeyDictionary[BaseDatabaseWrapper, dict[Build[Any], Any]]
_PER_CONNECTION = WeakKeyDictionary()


def _per_connection(build: Build[T]) -> Build[T]:
    """Compute ``build(connection)`` once per connection: its values may be bound to it (its
    time zone, its JSON adapter), and computing them costs more than the statement they serve.
    """

    def get(connection: BaseDatabaseWrapper) -> T:
        cache = _PER_CONNECTION.get(connection)
        if cache is None:
            cache = _PER_CONNECTION[connection] = {}
        if build not in cache:
            cache[build] = build(connection)
        return cast(T, cache[build])

    return get


@_per_connection
def _converters(connection: BaseDatabaseWrapper) -> list[tuple[Any, list[Any]]]:
    """What the ORM applies to each column it reads: dates, UUIDs, JSON."""
    table = IdempotencyKey._meta.db_table
    columns = [field.get_col(table) for field in _FIELDS]
    return [
        (column, connection.ops.get_db_converters(column) + field.get_db_converters(connection))
        for field, column in zip(_FIELDS, columns, strict=True)
    ]


def _claimed(record: IdempotencyKey, token: uuid.UUID) -> Claimed:
    return Claimed(record.pk, token, record.attempt, record.recovery_point, record.recovery_data)


def first(connection: BaseDatabaseWrapper, sql: str, params: list[Any]) -> IdempotencyKey | None:
    """The record a statement returns (all of its columns), as the ORM loads it.

    A cursor and the fields' converters (dates, UUIDs, JSON), not ``raw()``, whose per-call
    column resolution costs as much as the statement on a replay.
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    converters = _converters(connection)
    values = []
    for value, (expression, convert_all) in zip(row, converters, strict=True):
        for convert in convert_all:
            value = convert(value, expression, connection)
        values.append(value)
    return IdempotencyKey.from_db(connection.alias, _ATTNAMES, values)


def aware(connection: BaseDatabaseWrapper, value: Any) -> datetime:
    """A time a cursor read raw, as the ORM would load it: SQLite may hand back the stored
    text, and SQLite and MySQL a naive time in the connection's time zone."""
    if isinstance(value, str):
        value = parse_datetime(value)
    if settings.USE_TZ and timezone.is_naive(value):
        value = timezone.make_aware(value, connection.timezone)
    return cast(datetime, value)


def _prep(name: str, value: Any, connection: BaseDatabaseWrapper) -> Any:
    """A value of the named column, as the field would send it to this database."""
    return _preparers(connection)[name](value)


@_per_connection
def _preparers(connection: BaseDatabaseWrapper) -> dict[str, Callable[[Any], Any]]:
    """Each column's preparation, cut to what it does for the values the store writes.

    A string (or ``None``) is what a ``CharField`` or ``TextField`` sends as it is, and an aware
    ``timezone.now()`` (or ``None``) is what a ``DateTimeField`` hands to the backend's adapter
    unchanged (the values the store sends are such); the full ``get_db_prep_save`` costs as much
    as the claim's other Python work together.
    """

    def identity(value: Any) -> Any:
        return value

    def full(field: Field[Any, Any]) -> Callable[[Any], Any]:
        return lambda value: field.get_db_prep_save(value, connection)

    preparers: dict[str, Callable[[Any], Any]] = {}
    for field in _FIELDS:
        if isinstance(field, (CharField, TextField)):
            preparers[field.name] = identity
        elif isinstance(field, DateTimeField):
            preparers[field.name] = connection.ops.adapt_datetimefield_value
        else:
            preparers[field.name] = full(field)
    return preparers
