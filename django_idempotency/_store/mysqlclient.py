"""MySQL and MariaDB: a store statement that reads a row sent on mysqlclient's connection
itself, below its cursor.

mysqlclient's cursor runs, per statement, more Python than the rest of a replay does: its
result's description and flags, its counters, its row buffer. The store's reads (the claim
procedure's call, the read of a finished record) need the first row alone, so they are sent as
the cursor sends them (each parameter made a literal by the connection, ``%s`` replaced, the
statement sent with ``query()``) and the row is read from the stored result, converted by the
connection's converters as the cursor's rows are. Every result the statement leaves (a
procedure's status) is read to the end, as the cursor's next statement would, so that the
connection takes the next one.

Sent here only where nothing but Django's plain cursor wrapper would see the statement (no
``execute_wrapper()``, no query logging, no health check due); Django's checks and its error
translation are kept by the caller (:meth:`.mysql.MySQLStore.fetch_row`). The driver's errors
are those its cursor raises: the cursor calls the same functions.
"""

from __future__ import annotations

from typing import Any


def first_row(raw: Any, sql: str, params: list[Any]) -> tuple[Any, ...] | None:
    """Send ``sql`` (``%s`` placeholders) with ``params`` on the driver's connection ``raw``:
    its first row (``None``: none)."""
    literal = raw.literal
    query = sql.encode(raw.encoding) % tuple([literal(value) for value in params])
    raw.query(query)
    try:
        result = raw.store_result()
        rows = () if result is None else result.fetch_row(1)
    finally:
        while raw.next_result() == 0:  # a procedure's status, after its rows
            raw.store_result()
    return rows[0] if rows else None
