"""Values as the table's fields send them to a database, and rows as the ORM loads them.

The store sends statements through a cursor rather than the ORM (a queryset compiles on every
call); these helpers keep what the fields would do, computed once per connection.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar, cast

from django.conf import settings
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.db.models import CharField, DateTimeField, Field, IntegerField, TextField
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from django_idempotency._store import libpq
from django_idempotency.models import IdempotencyKey

T = TypeVar("T")

#: Every field, in table order: the record a claim reads is replayed or handed to signals.
FIELDS = [field for field in IdempotencyKey._meta.concrete_fields if field.column]
ATTNAMES = [field.attname for field in FIELDS]
COLUMNS = [field.column for field in FIELDS if field.column]

Build = Callable[[BaseDatabaseWrapper], T]
#: The attribute of a connection (Django's wrapper) holding what :func:`per_connection`
#: computed for it: an attribute is found for a fraction of a weak dictionary's lookup.
_CACHE = "_django_idempotency_cache"


def per_connection(build: Build[T]) -> Build[T]:
    """Compute ``build(connection)`` once per connection: its values may be bound to it (its
    time zone, its JSON adapter), and computing them costs more than the statement they serve.
    """

    def get(connection: BaseDatabaseWrapper) -> T:
        cache = connection.__dict__.get(_CACHE)
        if cache is None:
            cache = connection.__dict__[_CACHE] = {}
        try:
            return cache[build]  # type: ignore[no-any-return]  # no cast(): a call per use
        except KeyError:
            value = cache[build] = build(connection)
            return value

    return get


#: The attribute of a connection holding the cursor its store statements reuse, with the
#: driver connection that cursor is on.
_CURSOR = "_django_idempotency_cursor"


def kept_cursor(connection: BaseDatabaseWrapper) -> CursorWrapper | None:
    """The cursor the store's statements reuse on this connection; ``None``: make one as
    Django makes it, for this statement alone.

    Making a cursor (``connection.cursor()``) costs Django about what sending the statement
    does. The cursor kept is Django's own wrapper, so the connection's
    ``execute_wrapper()`` hooks and its error translation apply as before; a connection that
    logs queries (``DEBUG``, a test counting them), whose health check is due, or that is not
    open yet gets ``None``, and a new driver connection (a reconnect) a new cursor.
    """
    raw = connection.connection
    health_check_due = getattr(connection, "health_check_enabled", False) and not getattr(
        connection, "health_check_done", True
    )
    if raw is None or connection.queries_logged or health_check_due:
        return None
    kept = connection.__dict__.get(_CURSOR)
    if kept is None or kept[0] is not raw or _closed(kept[1]):
        kept = connection.__dict__[_CURSOR] = (raw, connection.cursor())
    return kept[1]


@contextmanager
def statement_cursor(connection: BaseDatabaseWrapper) -> Iterator[Any]:
    """A cursor for one statement of the store (:func:`kept_cursor`, or one of its own)."""
    cursor = kept_cursor(connection)
    if cursor is not None:
        yield cursor
        return
    with connection.cursor() as cursor:
        yield cursor


def fetch_row(
    connection: BaseDatabaseWrapper,
    sql: str,
    params: list[Any],
    read_result: Callable[[BaseDatabaseWrapper, Any, Any], Any] | None = None,
) -> Any:
    """Send one store statement that returns rows: its first row (``None``: none); with
    ``read_result``, below the cursor where it can be (:func:`_send`). A vendor may send it
    another way (:meth:`.bound.BoundStore.fetch_row`)."""
    return _send(connection, sql, params, _first_row, read_result)


def count_rows(connection: BaseDatabaseWrapper, sql: str, params: list[Any]) -> int:
    """Send one store statement that writes: the rows it matched."""
    return int(_send(connection, sql, params, _row_count, _libpq_row_count))


def _libpq_row_count(connection: BaseDatabaseWrapper, raw: Any, result: Any) -> int:
    return libpq.row_count(result)


def _first_row(cursor: Any) -> Any:
    return cursor.fetchone()


def _row_count(cursor: Any) -> Any:
    return cursor.rowcount


def _send(
    connection: BaseDatabaseWrapper,
    sql: str,
    params: list[Any],
    read: Callable[[Any], T],
    read_result: Callable[[BaseDatabaseWrapper, Any, Any], T] | None = None,
) -> T:
    """Run a store statement and ``read`` its cursor: on the kept cursor's driver cursor
    when nothing else would see the statement (without a generator's context manager: the
    hot path of every claim and write); on PostgreSQL, with ``read_result`` to read
    libpq's result, below that cursor (:mod:`.libpq`)."""
    if read_result is not None:
        raw = _libpq_connection(connection)
        if raw is not None:
            connection.validate_no_broken_transaction()
            with connection.wrap_database_errors:
                result = libpq.execute(raw, sql, params)
                if result is not None:
                    return read_result(connection, raw, result)
    cursor = kept_cursor(connection)
    if cursor is None:
        with connection.cursor() as made:
            made.execute(sql, params)
            return read(made)
    driver = _driver_cursor(connection, cursor)
    if driver is None:
        cursor.execute(sql, params)
        return read(cursor)
    connection.validate_no_broken_transaction()
    with connection.wrap_database_errors:
        driver.execute(sql, params)
        return read(driver)


def plain_connection(connection: BaseDatabaseWrapper) -> Any:
    """The driver's connection, when nothing but Django's plain cursor would see a statement
    sent on it: open, no ``execute_wrapper()`` hook, no query logging, no health check due;
    else ``None``."""
    raw = connection.connection
    if (
        raw is None
        or connection.execute_wrappers
        or connection.queries_logged
        or (
            getattr(connection, "health_check_enabled", False)
            and not getattr(connection, "health_check_done", True)
        )
    ):
        return None
    return raw


def _libpq_connection(connection: BaseDatabaseWrapper) -> Any:
    """:func:`plain_connection`, when a statement may go through its libpq connection now
    (:func:`.libpq.usable`)."""
    raw = plain_connection(connection)
    return None if raw is None else libpq.usable(raw)


def _driver_cursor(connection: BaseDatabaseWrapper, cursor: Any) -> Any:
    """The driver's cursor inside Django's plain wrapper, when nothing but that wrapper's
    own layers would see the statement (they cost a store statement as much as
    its parameters): no ``execute_wrapper()`` hook, no query logging. Django's checks that
    matter are kept by :func:`_send`: a broken transaction
    refused, the driver's errors translated to Django's. The driver's cursor is still the
    backend's own (MySQL's error codes, SQLite's placeholders). ``None``: go through
    Django's wrapper."""
    if connection.execute_wrappers or type(cursor) is not CursorWrapper:
        return None
    return cursor.cursor


def _closed(cursor: Any) -> bool:
    """Whether the driver's cursor was closed (psycopg and sqlite3 say so; MySQLdb has none)."""
    inner = cursor.cursor
    closed = getattr(inner, "closed", None)
    if closed is not None:
        return bool(closed)
    return getattr(inner, "connection", True) is None


@per_connection
def _converters(connection: BaseDatabaseWrapper) -> list[tuple[Any, list[Any]]]:
    """What the ORM applies to each column it reads: dates, UUIDs, JSON."""
    table = IdempotencyKey._meta.db_table
    columns = [field.get_col(table) for field in FIELDS]
    return [
        (column, connection.ops.get_db_converters(column) + field.get_db_converters(connection))
        for field, column in zip(FIELDS, columns, strict=True)
    ]


def loaded(connection: BaseDatabaseWrapper, row: Sequence[Any]) -> IdempotencyKey:
    """The model instance of a row of every column, as the ORM loads it."""
    converters = _converters(connection)
    values = []
    for value, (expression, convert_all) in zip(row, converters, strict=True):
        for convert in convert_all:
            value = convert(value, expression, connection)
        values.append(value)
    return IdempotencyKey.from_db(connection.alias, ATTNAMES, values)


#: The columns a lean read sends as text (``::text``): loading a time through Django's
#: time-zone loader, or a UUID, costs more than the rest of the row; they are converted only
#: when read (:class:`Record`).
AS_TEXT = frozenset(
    field.column for field in FIELDS if field.get_internal_type() in ("DateTimeField", "UUIDField")
)
_INDEX = {name: index for index, name in enumerate(ATTNAMES)}
_PK = _INDEX["id"]
_LOCK_TOKEN = _INDEX["lock_token"]


class Converters(list[Callable[[Any], Any] | None]):
    """A record's converters, one per column, and the alias they were made for."""

    alias = "default"


class Record:
    """A record as the claim read it, without making a model instance.

    The row is kept as the database sent it (:data:`AS_TEXT` columns as text); a field is
    converted when it is first read, as the ORM would convert it, and :meth:`instance` makes
    the model instance when something needs one (a signal's receivers). A replay reads the few
    fields it answers from and nothing else.
    """

    __slots__ = ("_convert", "_row", "_values")

    def __init__(self, row: Sequence[Any], convert: Converters) -> None:
        self._row = row
        self._convert = convert
        self._values: dict[int, Any] = {}

    @property
    def pk(self) -> int:
        return self._row[_PK]  # type: ignore[no-any-return]

    def holds_token(self, token: str) -> bool:
        """Whether the record carries ``token`` (a lock token's text: no UUID is made)."""
        return bool(self._row[_LOCK_TOKEN] == token)

    def __getattr__(self, name: str) -> Any:
        index = _INDEX.get(name)
        if index is None:
            raise AttributeError(name)
        return self._value(index)

    def _value(self, index: int) -> Any:
        values = self._values
        if index in values:  # not a KeyError caught: most fields are read once
            return values[index]
        value = self._row[index]
        convert = self._convert[index]
        if convert is not None and value is not None:
            value = convert(value)
        values[index] = value
        return value

    def instance(self) -> IdempotencyKey:
        """The model instance, as the ORM would load the row."""
        values = [self._value(index) for index in range(len(ATTNAMES))]
        return IdempotencyKey.from_db(self._convert.alias, ATTNAMES, values)

    def __repr__(self) -> str:
        return f"<Record {self.pk}: {self._row[_INDEX['status']]}>"


def _field(index: int) -> property:
    return property(lambda record: record._value(index))


# A field read through a property: ``__getattr__`` runs only after the usual lookup failed, an
# ``AttributeError`` made and dropped on every read. It stays for the type checker.
for _name, _index in _INDEX.items():
    if _name != "id":
        setattr(Record, _name, _field(_index))


def lean_converters(
    connection: BaseDatabaseWrapper, load_time: Callable[[Any], datetime]
) -> Converters:
    """How each column of a lean read (:data:`AS_TEXT` as text) becomes the field's value:
    the ORM's converters, after the text columns are loaded as the cursor would have loaded
    them (a time by ``load_time``, the vendor's own loader of its text; a UUID by ``UUID``)."""
    converters = Converters()
    converters.alias = connection.alias
    for field, (expression, convert_all) in zip(FIELDS, _converters(connection), strict=True):
        first_step: Callable[[Any], Any] | None = None
        if field.column in AS_TEXT:
            first_step = load_time if field.get_internal_type() == "DateTimeField" else uuid.UUID
        converters.append(_chain(first_step, expression, convert_all, connection))
    return converters


def _chain(
    first_step: Callable[[Any], Any] | None,
    expression: Any,
    convert_all: list[Any],
    connection: BaseDatabaseWrapper,
) -> Callable[[Any], Any] | None:
    if first_step is None and not convert_all:
        return None

    def convert(value: Any) -> Any:
        if first_step is not None:
            value = first_step(value)
        for each in convert_all:
            value = each(value, expression, connection)
        return value

    return convert


def instance_of(record: IdempotencyKey | Record) -> IdempotencyKey:
    """The model instance of a record a claim read (made now for a :class:`Record`)."""
    return record if isinstance(record, IdempotencyKey) else record.instance()


def aware(connection: BaseDatabaseWrapper, value: Any) -> datetime:
    """A time a cursor read raw, as the ORM would load it: SQLite may hand back the stored
    text, and SQLite and MySQL a naive time in the connection's time zone."""
    if isinstance(value, str):
        value = parse_datetime(value)
    if settings.USE_TZ and timezone.is_naive(value):
        value = timezone.make_aware(value, connection.timezone)
    return cast(datetime, value)


def prep(name: str, value: Any, connection: BaseDatabaseWrapper) -> Any:
    """A value of the named column, as the field would send it to this database."""
    return preparers(connection)[name](value)


@per_connection
def preparers(connection: BaseDatabaseWrapper) -> dict[str, Callable[[Any], Any]]:
    """Each column's preparation, cut to what it does for the values the store writes.

    A string (or ``None``) is what a ``CharField`` or ``TextField`` sends as it is, and so is an
    ``int`` (or ``None``) what an ``IntegerField`` sends; an aware ``timezone.now()`` (or
    ``None``) is what a ``DateTimeField`` hands to the backend's adapter unchanged (the values
    the store sends are such); the full ``get_db_prep_save`` costs as much
    as the claim's other Python work together.
    """

    def identity(value: Any) -> Any:
        return value

    def full(field: Field[Any, Any]) -> Callable[[Any], Any]:
        return lambda value: field.get_db_prep_save(value, connection)

    prepare: dict[str, Callable[[Any], Any]] = {}
    for field in FIELDS:
        if isinstance(field, (CharField, TextField, IntegerField)):
            prepare[field.name] = identity
        elif isinstance(field, DateTimeField):
            prepare[field.name] = connection.ops.adapt_datetimefield_value
        else:
            prepare[field.name] = full(field)
    return prepare
