"""SQLite: the claim in two statements (writers run one at a time), no lock wait to bound."""

from __future__ import annotations

from django.db import OperationalError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_idempotency._store.base import Store
from django_idempotency._store.claims import ClaimValues
from django_idempotency._store.maintenance import Batch, BatchQuery, SizeQuery
from django_idempotency._store.rows import aware, first
from django_idempotency.models import IdempotencyKey

#: What SQLite says of a file it cannot open or write for now (:meth:`SQLiteStore.is_fault`).
_FAULTS = ("unable to open database file", "disk i/o error", "readonly database")
#: SQLite caps a statement's parameters: the cleanup deletes a batch in chunks of this many.
_CHUNK = 500


class SQLiteStore(Store):
    vendor = "sqlite"
    name = "SQLite"

    def insert_or_load(
        self, connection: BaseDatabaseWrapper, values: ClaimValues
    ) -> IdempotencyKey | None:
        """Outside a transaction the record is read first, so a replay writes nothing (and
        takes no write lock: another process's write does not hold it up in WAL mode); a new
        key is inserted next. Inside one, the ``INSERT`` comes first: a transaction that has
        read cannot wait for the write lock (SQLite answers ``database is locked`` at once
        rather than risk a deadlock), while one that writes first waits its busy timeout."""
        statements = self.statements(connection)
        key = [values.identity.scope, values.identity.key_hash]
        if not connection.in_atomic_block:
            found = first(connection, statements.select, key)
            if found is not None:
                return found
        inserted = first(connection, statements.insert, values.params(connection))
        return inserted or first(connection, statements.select, key)

    def delete_batch(self, connection: BaseDatabaseWrapper, batch: BatchQuery) -> Batch:
        table = connection.ops.quote_name(IdempotencyKey._meta.db_table)
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            cursor.execute(batch.select, [*batch.params, batch.size])
            rows = cursor.fetchall()
            if not rows:
                return Batch(0, None)
            deleted = 0
            ids = [row[0] for row in rows]
            for start in range(0, len(ids), _CHUNK):
                in_ids, in_params = self.in_ids(connection, ids[start : start + _CHUNK])
                cursor.execute(
                    f"DELETE FROM {table} WHERE {in_ids} AND {batch.where}",
                    [*in_params, *batch.params],
                )
                deleted += cursor.rowcount
        return Batch(deleted, aware(connection, max(row[1] for row in rows)))

    def is_contention(self, exc: BaseException) -> bool:
        """``database is locked`` (busy past the wait) and ``database table is locked``: a
        shared-cache database (an in-memory one shared by threads, as Django's test database
        is) reports another connection's table lock at once, without a busy wait.

        Not a lock wait that ran out (:meth:`is_lock_timeout`, a ``409``): SQLite does not
        say who holds its write lock, which is as likely another process's long transaction
        as a call of the same key, so a claim that meets it is the store unavailable, a
        ``503`` (issue 25). An owner's writes wait it out (:func:`._engine._fenced_write`)."""
        return isinstance(exc, OperationalError) and "is locked" in str(exc)

    def is_fault(self, exc: BaseException) -> bool:
        """The file cannot be opened or written for now (a disk, a mount, a read-only file):
        its connection is opened again for an owner's write, as a server's is."""
        message = str(exc).lower()
        return isinstance(exc, OperationalError) and any(fault in message for fault in _FAULTS)

    def database_size(self, connection: BaseDatabaseWrapper) -> tuple[int, str]:
        """SQLite without ``dbstat`` only knows the whole file's size: given as the table's,
        said so in the source, and the indexes are unknown."""
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA page_count")
            pages = cursor.fetchone()[0]
            cursor.execute("PRAGMA page_size")
            return pages * cursor.fetchone()[0], "page_count * page_size (the whole file)"

    def size_query(self, table: str) -> SizeQuery:
        # dbstat is a compile-time option of SQLite (on in most Python builds); without it the
        # statement fails and maintenance.table_size falls back to the file's size.
        return SizeQuery(
            "SELECT COALESCE(SUM(CASE WHEN name = %s THEN pgsize END), 0), "
            "COALESCE(SUM(CASE WHEN name <> %s THEN pgsize END), 0) FROM dbstat "
            "WHERE name IN (SELECT name FROM sqlite_master WHERE tbl_name = %s)",
            [table, table, table],
            "dbstat",
        )
