"""The claim's SQL, built once per store from the model's columns and the rules.

Every vendor starts from :class:`Statements` (PostgreSQL's claim function is written from them
too, and its migration carries a copy a test compares).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.db.backends.base.base import BaseDatabaseWrapper

from django_idempotency._base import rules
from django_idempotency._store.rows import COLUMNS
from django_idempotency.models import IdempotencyKey

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
CLAIM_LITERALS = {
    "status": f"'{rules.PROCESSING}'",
    "response_headers": "'[]'",
    "recovery_point": "''",
    "attempt": "1",
}
#: The claim's values sent as parameters, in the order of its placeholders.
CLAIM_PARAMS = tuple(name for name in _INSERT_COLUMNS if name not in CLAIM_LITERALS)

#: Set afresh by a takeover, from the new claim's values.
TAKEOVER_FRESH = (
    "method",
    "path",
    "request_hash",
    "status",
    "response_headers",
    "lock_token",
    "updated_at",
    "unlock_at",
)


@dataclass(frozen=True)
class Statements:
    """The claim's statements for one database vendor, built once rather than per request."""

    table: str
    columns: str
    insert: str
    select: str
    take_over: str
    #: The key's record when it is finished (not ``processing``) and not expired: read before
    #: atomic mode's transaction opens. Its parameters: ``select``'s, then the time.
    finished: str

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
            plain.finished,
        )

    @classmethod
    def plain(cls, connection: BaseDatabaseWrapper) -> Statements:
        """The statements in SQL every database takes: a plain ``INSERT`` and ``UPDATE``."""
        q = connection.ops.quote_name
        table = q(IdempotencyKey._meta.db_table)
        columns = ", ".join(q(column) for column in COLUMNS)
        insert = (
            f"INSERT INTO {table} ({', '.join(q(name) for name in _INSERT_COLUMNS)}) "
            f"VALUES ({', '.join(CLAIM_LITERALS.get(name, '%s') for name in _INSERT_COLUMNS)})"
        )
        select = f"SELECT {columns} FROM {table} WHERE {q('scope')} = %s AND {q('key_hash')} = %s"
        expired = rules.EXPIRED.where(q)

        def if_expired(name: str, then: str, otherwise: str = "") -> str:
            otherwise = otherwise or q(name)
            return f"{q(name)} = CASE WHEN {expired} THEN {then} ELSE {otherwise} END"

        # MySQL assigns from left to right, later expressions reading the new values: the
        # CASEs test expires_at, so it is assigned last.
        assignments = [
            *(f"{q(name)} = {CLAIM_LITERALS.get(name, '%s')}" for name in TAKEOVER_FRESH),
            f"{q('response_status')} = NULL",
            f"{q('response_body')} = NULL",
            if_expired("recovery_point", CLAIM_LITERALS["recovery_point"]),
            if_expired("recovery_data", "NULL"),
            if_expired("attempt", CLAIM_LITERALS["attempt"], f"{q('attempt')} + 1"),
            if_expired("created_at", "%s"),
            # A stale record's own expiry is kept, but never before the new lock's end: a
            # record expired while its owner runs would be taken over as expired.
            if_expired("expires_at", "%s", later_of("expires_at", "%s", q)),
        ]
        take_over = (
            f"UPDATE {table} SET {', '.join(assignments)} "
            f"WHERE {q('id')} = %s AND {rules.TAKEOVER.where(q)}"
        )
        finished = finished_where(q, select, "%s")
        return Statements(table, columns, insert, select, take_over, finished)


def later_of(column: str, value: str, quote: Callable[[str], str]) -> str:
    """SQL for the later of ``column`` and ``value`` (``GREATEST`` is not SQLite's)."""
    return f"CASE WHEN {quote(column)} < {value} THEN {value} ELSE {quote(column)} END"


def finished_where(quote: Callable[[str], str], select: str, now: str) -> str:
    """``select`` narrowed to a finished record that is not expired at ``now`` (SQL): what the
    claim would find and leave as it is, a replay's or a mismatch's."""
    return (
        f"{select} AND {quote('status')} <> '{rules.PROCESSING}' AND {quote('expires_at')} > {now}"
    )


def fill(sql: str, names: list[str]) -> str:
    """``sql`` with its ``%s`` placeholders replaced by ``names``, in order: a statement of
    :class:`Statements` inside a function or procedure of the database's, on its arguments."""
    parts = sql.split("%s")
    assert len(parts) == len(names) + 1, (sql, names)
    return "".join(part + name for part, name in zip(parts, [*names, ""], strict=True))
