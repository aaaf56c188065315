"""The store: every statement the app runs against its table.

:class:`~.base.Store` is the interface and what every database shares; each vendor's
statements live in a module of their own (:mod:`.postgresql`, :mod:`.mysql`, :mod:`.sqlite`),
so another database is one more module and one line in :data:`VENDORS`. The functions below pick the
store of a database alias; the engine and the maintenance module call nothing else.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_idempotency._store.base import (
    RACED,
    Batch,
    Claimed,
    ClaimOutcome,
    Held,
    Lock,
    Raced,
    Store,
    StoredResponse,
)
from django_idempotency._store.base import _prep as _prep
from django_idempotency._store.mysql import MySQLStore
from django_idempotency._store.postgresql import PostgreSQLStore
from django_idempotency._store.sqlite import SQLiteStore
from django_idempotency.exceptions import StoreUnavailable

__all__ = [
    "RACED",
    "VENDORS",
    "Batch",
    "ClaimOutcome",
    "Claimed",
    "Held",
    "Lock",
    "Raced",
    "Store",
    "StoredResponse",
    "claim",
    "for_connection",
    "guard",
    "in_nested_transaction",
    "is_contention",
    "limit_lock_wait",
    "lock_wait_outlives_transaction",
    "peek_status",
    "release",
    "renew",
    "restore_lock_wait",
    "save_recovery_point",
    "store_response",
]

#: The store of each supported ``connection.vendor`` (check E030 refuses any other).
VENDORS: dict[str, Store] = {
    store.vendor: store for store in (PostgreSQLStore(), MySQLStore(), SQLiteStore())
}


def for_connection(connection: BaseDatabaseWrapper) -> Store:
    """The store of the connection's database; an unsupported one is unavailable (a ``503``)."""
    try:
        return VENDORS[connection.vendor]
    except KeyError:
        raise StoreUnavailable(
            f"Database {connection.alias!r} ({connection.vendor}) is not supported."
        ) from None


def claim(alias: str, **attempt: Any) -> ClaimOutcome:
    """:meth:`.Store.claim` on the database ``alias``."""
    connection = connections[alias]
    return for_connection(connection).claim(connection, **attempt)


def peek_status(alias: str, scope: str, key_hash: str) -> Lock | None:
    connection = connections[alias]
    return for_connection(connection).peek_status(connection, scope, key_hash)


def store_response(
    alias: str,
    pk: int,
    token: uuid.UUID,
    stored: StoredResponse,
    *,
    stale_at: datetime | None = None,
) -> bool:
    connection = connections[alias]
    return for_connection(connection).store_response(
        connection, pk, token, stored, stale_at=stale_at
    )


def save_recovery_point(
    alias: str, pk: int, token: uuid.UUID, name: str, data: Any, lock_timeout: timedelta
) -> bool:
    connection = connections[alias]
    return for_connection(connection).save_recovery_point(
        connection, pk, token, name, data, lock_timeout
    )


def release(alias: str, pk: int, token: uuid.UUID, *, stale_at: datetime | None = None) -> bool:
    connection = connections[alias]
    return for_connection(connection).release(connection, pk, token, stale_at=stale_at)


def renew(alias: str, leases: Sequence[tuple[int, uuid.UUID]], lock_timeout: timedelta) -> set[int]:
    """:meth:`.Store.renew` on this thread's connection to ``alias``."""
    connection = connections[alias]
    return for_connection(connection).renew(connection, leases, lock_timeout)


def limit_lock_wait(alias: str, timeout: timedelta) -> str | None:
    connection = connections[alias]
    return for_connection(connection).limit_lock_wait(connection, timeout)


def restore_lock_wait(alias: str, previous: str | None) -> None:
    connection = connections[alias]
    for_connection(connection).restore_lock_wait(connection, previous)


def lock_wait_outlives_transaction(alias: str) -> bool:
    """:attr:`.Store.lock_wait_outlives_transaction` of the database ``alias``."""
    return for_connection(connections[alias]).lock_wait_outlives_transaction


def guard(alias: str) -> AbstractContextManager[None]:
    """:meth:`.Store.guard` of the database ``alias``: its errors as the app's own."""
    return for_connection(connections[alias]).guard()


def in_nested_transaction(alias: str) -> bool:
    """Whether the innermost atomic block is a savepoint inside a caller's transaction."""
    return len(connections[alias].atomic_blocks) > 1


def is_contention(alias: str, exc: BaseException) -> bool:
    """:meth:`.Store.is_contention` of the database ``alias``."""
    return for_connection(connections[alias]).is_contention(exc)
