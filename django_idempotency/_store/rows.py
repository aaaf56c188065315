"""Values as the table's fields send them to a database, and rows as the ORM loads them.

The store sends statements through a cursor rather than the ORM (a queryset compiles on every
call); these helpers keep what the fields would do, computed once per connection.
"""

from __future__ import annotations

from collections.abc import Callable
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
