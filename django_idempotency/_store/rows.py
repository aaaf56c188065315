"""Values as the table's fields send them to a database, and rows as the ORM loads them.

The store sends statements through a cursor rather than the ORM (a queryset compiles on every
call); these helpers keep what the fields would do, computed once per connection.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar, cast
from weakref import WeakKeyDictionary

from django.conf import settings
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import CharField, DateTimeField, Field, TextField
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from django_idempotency.models import IdempotencyKey

T = TypeVar("T")

#: Every field, in table order: the record a claim reads is replayed or handed to signals.
FIELDS = [field for field in IdempotencyKey._meta.concrete_fields if field.column]
ATTNAMES = [field.attname for field in FIELDS]
COLUMNS = [field.column for field in FIELDS if field.column]

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
    columns = [field.get_col(table) for field in FIELDS]
    return [
        (column, connection.ops.get_db_converters(column) + field.get_db_converters(connection))
        for field, column in zip(FIELDS, columns, strict=True)
    ]


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


class _Converters(list[Callable[[Any], Any] | None]):
    """A record's converters, one per column, and the alias they were made for."""

    alias = "default"


class Record:
    """A record as the claim read it, without making a model instance (issue 28).

    The row is kept as the database sent it (:data:`AS_TEXT` columns as text); a field is
    converted when it is first read, as the ORM would convert it, and :meth:`instance` makes
    the model instance when something needs one (a signal's receivers). A replay reads the few
    fields it answers from and nothing else.
    """

    __slots__ = ("_convert", "_row", "_values")

    def __init__(self, row: Sequence[Any], convert: _Converters) -> None:
        self._row = row
        self._convert = convert
        self._values: dict[int, Any] = {}

    @property
    def pk(self) -> int:
        return cast(int, self._row[_PK])

    def holds_token(self, token: uuid.UUID) -> bool:
        """Whether the record carries ``token`` (read as text: no UUID is made)."""
        return bool(self._row[_LOCK_TOKEN] == str(token))

    def __getattr__(self, name: str) -> Any:
        index = _INDEX.get(name)
        if index is None:
            raise AttributeError(name)
        return self._value(index)

    def _value(self, index: int) -> Any:
        try:
            return self._values[index]
        except KeyError:
            pass
        value = self._row[index]
        convert = self._convert[index]
        if convert is not None and value is not None:
            value = convert(value)
        self._values[index] = value
        return value

    def instance(self) -> IdempotencyKey:
        """The model instance, as the ORM would load the row."""
        values = [self._value(index) for index in range(len(ATTNAMES))]
        return IdempotencyKey.from_db(self._convert.alias, ATTNAMES, values)

    def __repr__(self) -> str:
        return f"<Record {self.pk}: {self._row[_INDEX['status']]}>"


@_per_connection
def record_converters(connection: BaseDatabaseWrapper) -> _Converters:
    """How each column of a lean read (:data:`AS_TEXT` as text) becomes the field's value:
    the ORM's converters, after the text columns are loaded as the cursor would have loaded
    them (PostgreSQL's time stamps with the connection's time zone, as Django's loader)."""
    from psycopg.postgres import types  # PostgreSQL only
    from psycopg.pq import Format

    oid = types["timestamptz"].oid
    loader_class = connection.connection.adapters.get_loader(oid, Format.TEXT)
    loader = loader_class(oid, connection.connection)
    zone = connection.timezone

    def load_time(text: str) -> datetime:
        return cast(datetime, loader.load(text.encode()).replace(tzinfo=zone))

    converters = _Converters()
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


def read_record(connection: BaseDatabaseWrapper, sql: str, params: list[Any]) -> Record | None:
    """The record a lean statement returns (every column, :data:`AS_TEXT` as text)."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return None if row is None else Record(row, record_converters(connection))


def lean_columns(quote: Callable[[str], str]) -> str:
    """Every column, :data:`AS_TEXT` ones cast to text: what :func:`read_record` reads."""
    return ", ".join(
        f"{quote(column)}::text" if column in AS_TEXT else quote(column) for column in COLUMNS
    )


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


@_per_connection
def preparers(connection: BaseDatabaseWrapper) -> dict[str, Callable[[Any], Any]]:
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

    prepare: dict[str, Callable[[Any], Any]] = {}
    for field in FIELDS:
        if isinstance(field, (CharField, TextField)):
            prepare[field.name] = identity
        elif isinstance(field, DateTimeField):
            prepare[field.name] = connection.ops.adapt_datetimefield_value
        else:
            prepare[field.name] = full(field)
    return prepare
