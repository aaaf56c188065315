"""PostgreSQL: a store statement sent through libpq itself, below psycopg's cursor.

psycopg's cursor runs, per statement, more Python than the rest of a replay does: merging the
parameters into the text, its generators around the round trip, its result bookkeeping. The
store's statements are few, fixed and simple (text, integers, bytes and ``NULL``), so they go
through ``PQexecParams`` (``pgconn.exec_params``) and the row is loaded with the connection's
own loaders (a :class:`~psycopg.adapt.Transformer`), as the cursor would load it.

What is kept: Django's checks (:func:`._store.rows._send` sends here only when nothing but
Django's plain cursor wrapper would see the statement: no ``execute_wrapper()``, no query
logging; a broken transaction is refused, and errors are translated to Django's), psycopg's
errors (a failed statement raises the exception class psycopg raises for its SQLSTATE; a
connection lost the ``OperationalError`` it raises) and psycopg's transactions: in autocommit
a statement commits on its own, as the cursor's would; outside it, a transaction not begun yet
is begun first with the plain ``BEGIN`` psycopg would send (psycopg reads the transaction's
state from libpq, so it sends no ``BEGIN`` of its own after it, and commits it), and where the
connection sets an isolation level, read-only or deferrable transactions, the cursor begins it.
A text holding a NUL is never sent here: libpq takes a text parameter as a C string and cuts
it at the NUL (``tenant:a\0x`` was stored and found as ``tenant:a``), where the
cursor refuses it (``DataError``). The scope is refused before any statement
(:func:`._store.limits.unkeepable`); this keeps every other text as the cursor would.
Parameters are sent apart from the SQL, as server-side binding sends them, with no statement
prepared by name: safe behind a pooler in transaction mode. A connection set to prepare
statements (``prepare_threshold``) keeps the cursor, which prepares the claim.
"""

from __future__ import annotations

from typing import Any

pq: Any
try:
    from psycopg import OperationalError, errors, pq
    from psycopg.adapt import Transformer
except ImportError:  # psycopg 2, or no PostgreSQL at all: the cursor sends every statement
    pq = None

#: Each statement's text with numbered placeholders, encoded; ``None``: not sendable here.
_NUMBERED: dict[str, bytes | None] = {}
#: The attribute of a connection (Django's wrapper) holding the loader of its rows, with the
#: driver connection it was made for.
_LOADER = "_django_idempotency_loader"
#: Django's PostgreSQL backend always connects with ``client_encoding`` UTF8.
_ENCODING = "utf-8"

if pq is not None:
    _CONNECTION_OK = pq.ConnStatus.OK
    _BAD = pq.ConnStatus.BAD
    _IDLE = pq.TransactionStatus.IDLE
    _INTRANS = pq.TransactionStatus.INTRANS
    _DONE = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)


def usable(raw: Any) -> Any:
    """``raw`` (a driver's connection) when a statement may be sent through its libpq
    connection now: psycopg 3's, open, not preparing statements, in autocommit or in a
    transaction that is begun or that a plain ``BEGIN`` begins; else ``None``."""
    if pq is None:
        return None
    pgconn = getattr(raw, "pgconn", None)
    if pgconn is None or pgconn.status != _CONNECTION_OK or raw.prepare_threshold is not None:
        return None  # a connection that prepares statements: psycopg prepares the claim
    state = pgconn.transaction_status
    if state == _INTRANS:
        return raw
    if state != _IDLE:  # in a failed transaction (or a busy connection): the cursor says so
        return None
    if raw.autocommit or (
        raw.isolation_level is None and raw.read_only is None and raw.deferrable is None
    ):
        return raw
    return None


def execute(raw: Any, sql: str, params: list[Any]) -> Any:
    """Send ``sql`` (``%s`` placeholders) with ``params`` through libpq: its result, or
    ``None`` when this statement or one of its values is not one to send here (nothing was
    sent: the cursor sends it). Raises psycopg's errors, as its cursor would."""
    query = _NUMBERED.get(sql, b"")
    if query == b"":
        query = _NUMBERED[sql] = _numbered(sql)
    if query is None:
        return None
    values: list[bytes | None] = []
    formats: list[int] | None = None
    for value in params:
        kind = type(value)
        if kind is str:
            if "\x00" in value:  # libpq would cut it there: psycopg's cursor refuses it
                return None
            values.append(value.encode(_ENCODING))
        elif kind is int:
            values.append(str(value).encode())
        elif value is None:
            values.append(None)
        elif kind is bytes:  # bytea: sent as it is (binary), not in bytea's text form
            if formats is None:
                formats = [0] * len(params)
            formats[len(values)] = 1
            values.append(value)
        elif isinstance(value, str) and not isinstance(value, bool):  # a text choice's enum
            if "\x00" in value:
                return None
            values.append(value.encode(_ENCODING))
        else:  # bool, datetime, UUID...: psycopg's adapters know them
            return None
    pgconn = raw.pgconn
    if not raw.autocommit and pgconn.transaction_status == _IDLE:
        _check(pgconn, pgconn.exec_(b"BEGIN"))
    return _check(pgconn, pgconn.exec_params(query, values, param_formats=formats))


def _check(pgconn: Any, result: Any) -> Any:
    """The result of a statement that succeeded; else psycopg's error for it."""
    if result.status in _DONE:
        return result
    if pgconn.status == _BAD:  # as psycopg: a lost connection is an OperationalError
        raise OperationalError(result.get_error_message(_ENCODING))
    raise errors.error_from_result(result, encoding=_ENCODING)


def first_row(connection: Any, raw: Any, result: Any) -> tuple[Any, ...] | None:
    """The first row of a result, loaded as psycopg's cursor loads it (``None``: no row)."""
    if not result.ntuples:
        return None
    kept = connection.__dict__.get(_LOADER)
    if kept is None or kept[0] is not raw:
        kept = connection.__dict__[_LOADER] = (raw, Transformer(raw))
    loader = kept[1]
    loader.set_pgresult(result)
    try:
        return loader.load_row(0, tuple)  # type: ignore[no-any-return]
    finally:
        loader.set_pgresult(None)


def row_count(result: Any) -> int:
    """The rows a write matched."""
    count = result.command_tuples
    return -1 if count is None else int(count)


def _numbered(sql: str) -> bytes | None:
    """``sql`` with ``$1``, ``$2``... for its ``%s`` (``%%`` a ``%``); ``None`` when it has any
    other ``%`` sequence (a named placeholder)."""
    parts = sql.split("%%")
    out: list[str] = []
    number = 0
    for index, part in enumerate(parts):
        pieces = part.split("%s")
        for position, piece in enumerate(pieces):
            if "%" in piece:
                return None
            out.append(piece)
            if position < len(pieces) - 1:
                number += 1
                out.append(f"${number}")
        if index < len(parts) - 1:
            out.append("%")
    return "".join(out).encode(_ENCODING)
