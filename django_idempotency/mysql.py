"""What the store does differently on MySQL and MariaDB (Django's ``mysql`` vendor).

The one place for their error codes and their session settings; :mod:`.store` and
:mod:`.maintenance` branch here. One set of statements serves both servers: MariaDB has
``RETURNING`` on ``INSERT`` and ``DELETE`` but not on ``UPDATE``, MySQL none at all, so neither
uses it. The claim decides from a duplicate-key error and affected-row counts (Django connects
with ``CLIENT_FOUND_ROWS``: an ``UPDATE`` counts the rows it matched) and from the lock token.
"""

from __future__ import annotations

import math
from datetime import timedelta

from django.db import DatabaseError

VENDOR = "mysql"

#: ``ER_DUP_ENTRY``: the claim's ``INSERT`` met the key's record. Only this error means so:
#: ``INSERT IGNORE`` would swallow others too (a value too long, a bad date).
DUPLICATE_KEY = 1062
#: ``ER_LOCK_WAIT_TIMEOUT``: waited ``innodb_lock_wait_timeout`` for another transaction's row.
LOCK_WAIT_TIMEOUT = 1205
#: ``ER_LOCK_DEADLOCK``: InnoDB rolled back the whole transaction to break a deadlock, which
#: concurrent inserts of the same key can make (each holds a shared lock on the duplicate, and
#: each wants an exclusive one once its holder rolls back or deletes it).
DEADLOCK = 1213

#: Where :func:`limit_lock_wait_sql` keeps the session's own limit for :data:`RESTORE_LOCK_WAIT`.
_PREVIOUS = "@django_idempotency_lock_wait"
#: Puts back the limit the session had. ``innodb_lock_wait_timeout`` is a session variable,
#: not a transaction's: unlike PostgreSQL's ``SET LOCAL`` it outlives the transaction, so it is
#: always put back.
RESTORE_LOCK_WAIT = f"SET SESSION innodb_lock_wait_timeout = {_PREVIOUS}"


def error_code(exc: BaseException) -> int | None:
    """The server's error number behind a Django database error (``None`` for another)."""
    cause = exc.__cause__ if isinstance(exc, DatabaseError) else exc
    args = getattr(cause, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def limit_lock_wait_sql(timeout: timedelta) -> str:
    """Keep the session's lock wait limit aside and set ``timeout``, in one round trip.

    The limit is whole seconds, at least one: a wait limit below a second waits a second.
    """
    seconds = max(1, math.ceil(timeout.total_seconds()))
    return (
        f"SET {_PREVIOUS} = @@SESSION.innodb_lock_wait_timeout, "
        f"SESSION innodb_lock_wait_timeout = {seconds}"
    )


def force_index(name: str) -> str:
    """An index hint after a table name: the cleanup's batch must walk ``expires_at``.

    When most rows match (a backlog of expired records) the optimizer prefers a full scan and a
    sort, which reads, and with ``FOR UPDATE`` locks, every matching row for a batch of a few:
    a second cleanup then finds them all locked and skips the lot.
    """
    return f" FORCE INDEX ({name})"


def delete_locked_sql(table: str, id_column: str, in_ids: str) -> str:
    """Delete the rows a batch locked, by id, without waiting on anyone else's row.

    A plain ``DELETE ... WHERE id IN (...)`` may scan the whole table when it is small, and a
    scanning ``DELETE`` waits on every row another transaction holds. Here a non-locking read
    picks the ids and the join reaches each row by its primary key.
    """
    return (
        f"DELETE {table} FROM (SELECT {id_column} FROM {table} WHERE {in_ids}) AS batch "
        f"STRAIGHT_JOIN {table} ON {table}.{id_column} = batch.{id_column}"
    )
