"""Every statement the app runs against its table, each one atomic on its own.

The claim inserts with ``INSERT ... ON CONFLICT DO NOTHING`` and reads the record in place in
the same statement on PostgreSQL (MySQL and MariaDB: a plain ``INSERT`` and its duplicate-key
error, then a read; :mod:`.mysql`); an expired or stale record is taken over by an ``UPDATE``
whose ``WHERE`` re-checks that it still is one. Every decision is made by one atomic statement,
never by a check in Python followed by a write. Later writes of an attempt are fenced by its
``lock_token``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast
from weakref import WeakKeyDictionary

from django.db import DatabaseError, IntegrityError, OperationalError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import CharField, DateTimeField, Field, TextField
from django.utils import timezone

from django_idempotency import mysql
from django_idempotency.exceptions import LockWaitTimeout, StoreUnavailable
from django_idempotency.models import IdempotencyKey
from django_idempotency.responses import StoredResponse

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
_CLAIM_PARAMS = tuple(name for name in _INSERT_COLUMNS if name not in _CLAIM_LITERALS)

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
class Claimed:
    """What the claim returns when this attempt now owns the record."""

    pk: int
    lock_token: uuid.UUID
    attempt: int
    recovery_point: str
    recovery_data: Any


def claim(
    alias: str,
    *,
    scope: str,
    key_hash: str,
    method: str,
    path: str,
    request_hash: str,
    ttl: timedelta,
    lock_timeout: timedelta,
) -> Claimed | IdempotencyKey | None:
    """Claim the key, or return the record that holds it.

    A new key costs one statement and so does a live key's record (the replay's only one; two
    on MySQL, :func:`_insert_or_load_mysql`). An
    expired record, or a stale ``processing`` one with the same fingerprint, is taken over by
    one more, fenced ``UPDATE``. ``None`` means a concurrent attempt got there between our
    statements (or released the record): claim again.
    """
    connection = connections[alias]
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
    with _guard():  # preparing a value may connect (MariaDB's UUID type depends on its version)
        prepare = _preparers(connection)
        params = [prepare[name](values[name]) for name in _CLAIM_PARAMS]
        if connection.vendor == mysql.VENDOR:
            found = _insert_or_load_mysql(alias, params, scope, key_hash, token)
        else:
            found = _insert_or_load(alias, params, scope, key_hash)
        if found is None or isinstance(found, Claimed):
            return found
        if found.lock_token == token:  # our fresh token: the row is the one we inserted
            return _claimed(found, token)
        if found.is_expired or (found.is_stale and found.request_hash == request_hash):
            return _take_over(alias, found.pk, params, now, request_hash, token)
        return found


def _insert_or_load(
    alias: str, params: list[Any], scope: str, key_hash: str
) -> IdempotencyKey | None:
    """Insert a new record, or read the one in place; ``None`` when neither is visible.

    On PostgreSQL both happen in one statement: a data-modifying CTE inserts with
    ``ON CONFLICT DO NOTHING`` (which writes nothing on a conflict, so a replay commits no
    transaction and waits for no disk flush), and the outer ``SELECT`` reads the existing row.
    Both see the statement's snapshot, so a row committed by a concurrent attempt after it began
    is seen by neither: ``None``, and the caller claims again. Elsewhere (SQLite) it takes two.
    """
    connection = connections[alias]
    sql = _sql(connection)
    if connection.vendor == "postgresql":
        return _first(alias, sql.insert_or_select, [*params, scope, key_hash])
    inserted = _first(alias, sql.insert, params)
    return inserted or _first(alias, sql.select, [scope, key_hash])


def _insert_or_load_mysql(
    alias: str, params: list[Any], scope: str, key_hash: str, token: uuid.UUID
) -> Claimed | IdempotencyKey | None:
    """MySQL's :func:`_insert_or_load`: a new key is claimed outright, else the record is read.

    A plain ``INSERT``, its duplicate-key error caught: InnoDB undoes the failed statement
    alone, so no savepoint is needed even inside a transaction, and a new key costs one
    statement (``lastrowid`` is all it reads back). ``ON DUPLICATE KEY UPDATE`` would lock the
    live record exclusively on every replay, and with ``CLIENT_FOUND_ROWS`` its row count does
    not tell an insert from a duplicate. A key in place costs a ``SELECT`` more.

    A deadlock outside a transaction made this statement alone its victim: ``None``, claim
    again. Inside one, InnoDB rolled the whole transaction back: it is raised (``409``).
    """
    connection = connections[alias]
    sql = _sql(connection)
    try:
        with connection.cursor() as cursor:
            try:
                cursor.execute(sql.insert, params)
            except IntegrityError as exc:
                if mysql.error_code(exc) != mysql.DUPLICATE_KEY:
                    raise
            else:
                return Claimed(int(cursor.lastrowid), token, 1, "", None)
        return _first(alias, sql.select, [scope, key_hash])
    except OperationalError as exc:
        if mysql.error_code(exc) == mysql.DEADLOCK and not connection.in_atomic_block:
            return None
        raise


def _take_over(
    alias: str, pk: int, params: list[Any], now: datetime, request_hash: str, token: uuid.UUID
) -> Claimed | None:
    """Make an expired or stale record this attempt's, if it still is one (else ``None``).

    The ``WHERE`` repeats the test, so of concurrent attempts exactly one wins: PostgreSQL
    re-checks it against the row a concurrent winner left, and SQLite runs writers one at a
    time. An expired record starts afresh; a stale one keeps its recovery point, attempt + 1.
    """
    connection = connections[alias]
    fresh = dict(zip(_CLAIM_PARAMS, params, strict=True))
    db_now = _prep("updated_at", now, connection)
    # In the order of the placeholders of _Sql.take_over.
    values = [fresh[name] for name in _TAKEOVER_FRESH if name not in _CLAIM_LITERALS]
    values += [db_now, db_now, db_now]  # expired? for recovery_point, recovery_data, attempt
    values += [db_now, fresh["created_at"], db_now, fresh["expires_at"]]
    values += [pk, db_now, PROCESSING, db_now, request_hash]
    sql = _sql(connection)
    if connection.vendor == mysql.VENDOR:  # no RETURNING: the row count, then our token's row
        with connection.cursor() as cursor:
            cursor.execute(sql.take_over, values)
            if not cursor.rowcount:
                return None
        values = [pk, _prep("lock_token", token, connection)]
        record = _first(alias, sql.select_owned, values)
    else:
        record = _first(alias, sql.take_over, values)
    return None if record is None else _claimed(record, token)


@dataclass(frozen=True)
class _Sql:
    """The claim's statements for one database vendor, built once rather than per request."""

    insert: str
    select: str
    insert_or_select: str
    take_over: str
    #: The record under an attempt's lock token (MySQL's read after its takeover).
    select_owned: str

    @classmethod
    def build(cls, connection: BaseDatabaseWrapper) -> _Sql:
        q = connection.ops.quote_name
        table = q(IdempotencyKey._meta.db_table)
        columns = ", ".join(q(column) for column in _COLUMNS)
        # MySQL and MariaDB: no ON CONFLICT, and no RETURNING (see mysql.py).
        returning = "" if connection.vendor == mysql.VENDOR else f" RETURNING {columns}"
        insert = (
            f"INSERT INTO {table} ({', '.join(q(name) for name in _INSERT_COLUMNS)}) "
            f"VALUES ({', '.join(_CLAIM_LITERALS.get(name, '%s') for name in _INSERT_COLUMNS)})"
        )
        if returning:
            insert += f" ON CONFLICT ({q('scope')}, {q('key_hash')}) DO NOTHING{returning}"
        select = f"SELECT {columns} FROM {table} WHERE {q('scope')} = %s AND {q('key_hash')} = %s"
        expired = f"{q('expires_at')} <= %s"

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
            f"WHERE {q('id')} = %s AND ({expired} OR ({q('status')} = %s "
            f"AND {q('unlock_at')} <= %s AND {q('request_hash')} = %s)){returning}"
        )
        return cls(
            insert=insert,
            select=select,
            insert_or_select=f"WITH inserted AS ({insert}) SELECT * FROM inserted "
            f"UNION ALL {select}",
            take_over=take_over,
            select_owned=f"SELECT {columns} FROM {table} WHERE {q('id')} = %s "
            f"AND {q('lock_token')} = %s",
        )


_SQL_BY_VENDOR: dict[str, _Sql] = {}


def _sql(connection: BaseDatabaseWrapper) -> _Sql:
    if connection.vendor not in _SQL_BY_VENDOR:
        _SQL_BY_VENDOR[connection.vendor] = _Sql.build(connection)
    return _SQL_BY_VENDOR[connection.vendor]


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


def _first(alias: str, sql: str, params: list[Any]) -> IdempotencyKey | None:
    """The record a statement returns (all of ``_COLUMNS``), as the ORM loads it.

    A cursor and the fields' converters (dates, UUIDs, JSON), not ``raw()``, whose per-call
    column resolution costs as much as the statement on a replay.
    """
    connection = connections[alias]
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
    return IdempotencyKey.from_db(alias, _ATTNAMES, values)


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


def peek_status(alias: str, scope: str, key_hash: str) -> tuple[str, datetime | None] | None:
    """The cheap poll of a waiter: status and ``unlock_at`` only."""
    with _guard():
        return (
            IdempotencyKey.objects.using(alias)
            .filter(scope=scope, key_hash=key_hash)
            .values_list("status", "unlock_at")
            .first()
        )


def store_response(
    alias: str,
    pk: int,
    token: uuid.UUID,
    stored: StoredResponse,
    *,
    stale_at: datetime | None = None,
) -> bool:
    """Store the final response; ``False`` when the lock was lost (the result is refused).

    With ``stale_at`` (an operator failing a stuck record) only while the lock is still
    expired at that time.
    """
    return _fenced_update(
        alias,
        pk,
        token,
        stale_at,
        status=COMPLETED if stored.status < 400 else FAILED,
        response_status=stored.status,
        response_headers=stored.headers,
        response_body=stored.body,
        unlock_at=None,
        updated_at=timezone.now(),
    )


def save_recovery_point(
    alias: str, pk: int, token: uuid.UUID, name: str, data: Any, lock_timeout: timedelta
) -> bool:
    """Record progress and renew the lock: an attempt that makes progress is alive."""
    now = timezone.now()
    return _fenced_update(
        alias,
        pk,
        token,
        None,
        recovery_point=name,
        recovery_data=data,
        unlock_at=now + lock_timeout,
        updated_at=now,
    )


def release(alias: str, pk: int, token: uuid.UUID, *, stale_at: datetime | None = None) -> bool:
    """Delete the attempt's record so a retry claims afresh; ``False`` if the lock was lost.

    With ``stale_at`` (an operator releasing a stuck record) only while the lock is still
    expired at that time.
    """
    return _fenced(alias, "DELETE FROM {table}", [], pk, token, stale_at)


def _fenced_update(
    alias: str, pk: int, token: uuid.UUID, stale_at: datetime | None, **changes: Any
) -> bool:
    connection = connections[alias]
    q = connection.ops.quote_name
    sets = ", ".join(f"{q(name)} = %s" for name in changes)
    values = [_prep(name, value, connection) for name, value in changes.items()]
    return _fenced(alias, f"UPDATE {{table}} SET {sets}", values, pk, token, stale_at)


def _fenced(
    alias: str,
    statement: str,
    params: list[Any],
    pk: int,
    token: uuid.UUID,
    stale_at: datetime | None,
) -> bool:
    """Run a write on the attempt's own record only: its lock token, still ``processing``.

    Plain SQL: a queryset's ``update()`` and ``delete()`` compile on every call, and
    ``delete()`` may first ``SELECT`` the rows to send signals, which would lose the fence
    between the two statements.
    """
    connection = connections[alias]
    q = connection.ops.quote_name
    sql = statement.format(table=q(IdempotencyKey._meta.db_table))
    sql += f" WHERE {q('id')} = %s AND {q('lock_token')} = %s AND {q('status')} = %s"
    params = [*params, pk, _prep("lock_token", token, connection), PROCESSING]
    if stale_at is not None:
        sql += f" AND {q('unlock_at')} <= %s"
        params.append(_prep("unlock_at", stale_at, connection))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return bool(cursor.rowcount)


def limit_lock_wait(alias: str, timeout: timedelta) -> str | None:
    """Bound how long the claim waits for another transaction's uncommitted row (atomic mode).

    Returns the ``lock_timeout`` it replaced, for :func:`restore_lock_wait` (``None`` where
    there is nothing to restore: SQLite). The ``OFFSET 0`` subquery is read before the outer
    ``set_config`` runs, so the old value is read before it is replaced, in one round trip.
    MySQL keeps the old value in the session (:mod:`.mysql`).
    """
    connection = connections[alias]
    if connection.vendor == mysql.VENDOR:
        with _guard(), connection.cursor() as cursor:
            cursor.execute(mysql.limit_lock_wait_sql(timeout))
        return mysql.RESTORE_LOCK_WAIT
    if connection.vendor != "postgresql":
        return None
    milliseconds = max(1, int(timeout.total_seconds() * 1000))
    with _guard(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT before.previous, set_config('lock_timeout', %s, true) "
            "FROM (SELECT current_setting('lock_timeout') AS previous OFFSET 0) AS before",
            [f"{milliseconds}ms"],
        )
        row = cursor.fetchone()
    return str(row[0]) if row else None


def restore_lock_wait(alias: str, previous: str | None) -> None:
    """Put back what :func:`limit_lock_wait` replaced, before the caller's own code runs."""
    if previous is None:
        return
    with _guard(), connections[alias].cursor() as cursor:
        if previous == mysql.RESTORE_LOCK_WAIT:
            cursor.execute(previous)
        else:
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [previous])


def lock_wait_outlives_transaction(alias: str) -> bool:
    """Whether :func:`limit_lock_wait` lasts past the transaction (a session setting), and so
    must be restored whatever the claim's outcome."""
    return connections[alias].vendor == mysql.VENDOR


def in_nested_transaction(alias: str) -> bool:
    """Whether the innermost atomic block is a savepoint inside a caller's transaction."""
    return len(connections[alias].atomic_blocks) > 1


@contextmanager
def _guard() -> Iterator[None]:
    """Translate the store's database errors into the app's own exceptions.

    Any error but a lock wait is the store being unavailable (a ``503``), never a raw ``500``:
    a lost connection, and a statement the server refuses alike.
    """
    try:
        yield
    except DatabaseError as exc:
        if is_lock_timeout(exc):
            raise LockWaitTimeout(str(exc)) from exc
        raise StoreUnavailable(str(exc)) from exc


def is_lock_timeout(exc: BaseException) -> bool:
    """A lock wait that ran out, or (MySQL) a deadlock whose victim was this transaction."""
    cause = exc.__cause__
    if getattr(cause, "sqlstate", None) == "55P03":  # PostgreSQL lock_not_available
        return True
    if mysql.error_code(exc) in (mysql.LOCK_WAIT_TIMEOUT, mysql.DEADLOCK):
        return True
    return isinstance(exc, OperationalError) and "database is locked" in str(exc)
