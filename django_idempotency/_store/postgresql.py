"""PostgreSQL: the claim in one statement, a bounded lock wait, a cleanup that skips locked rows."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_idempotency._store.base import Batch, BatchQuery, SizeQuery, Statements, Store, first
from django_idempotency.models import IdempotencyKey


@dataclass(frozen=True)
class PostgreSQLStatements(Statements):
    #: The insert and, on a conflict, the read of the row in place, in one statement.
    insert_or_select: str


class PostgreSQLStore(Store):
    vendor = "postgresql"
    name = "PostgreSQL"

    def build_statements(self, connection: BaseDatabaseWrapper) -> PostgreSQLStatements:
        built = Statements.build(connection)
        return PostgreSQLStatements(
            **vars(built),
            insert_or_select=f"WITH inserted AS ({built.insert}) SELECT * FROM inserted "
            f"UNION ALL {built.select}",
        )

    def insert_or_load(
        self,
        connection: BaseDatabaseWrapper,
        params: list[Any],
        scope: str,
        key_hash: str,
        token: uuid.UUID,
    ) -> IdempotencyKey | None:
        """Both in one statement: a data-modifying CTE inserts with ``ON CONFLICT DO NOTHING``
        (which writes nothing on a conflict, so a replay commits no transaction and waits for no
        disk flush), and the outer ``SELECT`` reads the existing row.

        Both see the statement's snapshot, so a row committed by a concurrent attempt after it
        began is seen by neither: ``None``, and the caller claims again.
        """
        statements = self.statements(connection)
        assert isinstance(statements, PostgreSQLStatements)
        return first(connection, statements.insert_or_select, [*params, scope, key_hash])

    def limit_lock_wait(self, connection: BaseDatabaseWrapper, timeout: timedelta) -> str | None:
        """Set ``lock_timeout`` for the transaction and return the value it replaced.

        The ``OFFSET 0`` subquery is read before the outer ``set_config`` runs, so the old value
        is read before it is replaced, in one round trip.
        """
        milliseconds = max(1, int(timeout.total_seconds() * 1000))
        with self.guard(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT before.previous, set_config('lock_timeout', %s, true) "
                "FROM (SELECT current_setting('lock_timeout') AS previous OFFSET 0) AS before",
                [f"{milliseconds}ms"],
            )
            row = cursor.fetchone()
        return str(row[0]) if row else None

    def restore_lock_wait(self, connection: BaseDatabaseWrapper, previous: str | None) -> None:
        if previous is None:
            return
        with self.guard(), connection.cursor() as cursor:
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [previous])

    def delete_batch(self, connection: BaseDatabaseWrapper, batch: BatchQuery) -> Batch:
        """One statement, and only a count and a timestamp back to Python.

        The rows are locked with ``FOR UPDATE SKIP LOCKED``: two runs at once share the rows
        instead of waiting for each other, and a row a claim is rewriting right now is left for
        the next run.
        """
        q = connection.ops.quote_name
        table = q(IdempotencyKey._meta.db_table)
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            # The batch's commit need not wait for its WAL flush (nor make the claims' commits
            # queue behind it): a delete lost in a crash is redone by the next run, and a later
            # claim's synchronous commit flushes it anyway.
            cursor.execute("SET LOCAL synchronous_commit TO OFF")
            cursor.execute(
                f"WITH batch AS ({batch.select} FOR UPDATE SKIP LOCKED), "
                f"gone AS (DELETE FROM {table} USING batch "
                f"WHERE {table}.{q('id')} = batch.{q('id')} RETURNING {table}.{q('expires_at')}) "
                f"SELECT count(*), max({q('expires_at')}) FROM gone",
                [*batch.params, batch.size],
            )
            deleted, last = cursor.fetchone()
        return Batch(deleted, last) if deleted else Batch(0, None)

    def in_ids(self, connection: BaseDatabaseWrapper, ids: list[int]) -> tuple[str, list[Any]]:
        return f"{connection.ops.quote_name('id')} = ANY(%s)", [ids]

    def is_lock_timeout(self, exc: BaseException) -> bool:
        return getattr(exc.__cause__, "sqlstate", None) == "55P03"  # lock_not_available

    def size_query(self, table: str) -> SizeQuery:
        # The table's bytes include its TOAST (large bodies); the indexes are counted apart.
        return SizeQuery(
            "SELECT pg_total_relation_size(t) - pg_indexes_size(t), pg_indexes_size(t) "
            "FROM (SELECT %s::regclass AS t) AS target",
            [f'"{table}"'],
            "pg_total_relation_size, pg_indexes_size",
        )
