"""The operators' queries (:mod:`django_idempotency._ops.maintenance`): the stale scan, the
cleanup's batches, and the table's size."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import DatabaseError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import QuerySet
from django.utils import timezone

from django_idempotency._base import rules
from django_idempotency._store.bound import BoundStore
from django_idempotency._store.contract import Batch as Batch  # its home before the contract
from django_idempotency._store.rows import prep
from django_idempotency.models import IdempotencyKey


@dataclass(frozen=True)
class BatchQuery:
    """A cleanup batch: its rows' condition and its parameters, and the ``SELECT`` of their
    ids and ``expires_at`` (``LIMIT`` its last placeholder, ``size``)."""

    where: str
    params: list[Any]
    select: str
    size: int


class SizeQuery(NamedTuple):
    """How a database measures the table: see :meth:`Maintenance.size_query`."""

    sql: str
    params: list[Any]
    source: str


class Maintenance(BoundStore):
    """The reads and deletes of the operators' commands and the admin; a vendor writes
    :meth:`delete_batch` and its size statements."""

    def read(self, scope: str, key_hash: str) -> IdempotencyKey | None:
        """The key's record (tests, operators)."""
        return (
            IdempotencyKey.objects.using(self.alias).filter(scope=scope, key_hash=key_hash).first()
        )

    def expire(self, scope: str, key_hash: str) -> IdempotencyKey | None:
        """Expire the key's record now, as its TTL would (:func:`django_idempotency.testing.
        expire_key`): cleanup may delete it, and the key's next request runs as a first one."""
        records = IdempotencyKey.objects.using(self.alias).filter(scope=scope, key_hash=key_hash)
        return records.get() if records.update(expires_at=timezone.now()) else None

    def created_at(self, pk: int) -> datetime | None:
        """When record ``pk``'s life began (``None``: no such record): read on the thread's
        connection, so atomic mode's uncommitted record is found too."""
        with self.guard():
            found = IdempotencyKey.objects.using(self.alias).filter(pk=pk)
            value = found.values_list("created_at").first()
        return None if value is None else value[0]

    def records_of(self, key_hash: str) -> list[IdempotencyKey]:
        """The key's records in every scope, oldest first."""
        return list(
            IdempotencyKey.objects.using(self.alias).filter(key_hash=key_hash).order_by("pk")
        )

    def count(self) -> int:
        """How many records the table holds."""
        return IdempotencyKey.objects.using(self.alias).count()

    def stale_records(self, *, older_than: timedelta = timedelta(0)) -> QuerySet[IdempotencyKey]:
        """Records stuck in ``processing`` whose lock expired at least ``older_than`` ago."""
        cutoff = timezone.now() - older_than
        return (
            IdempotencyKey.objects.using(self.alias)
            .filter(rules.STALE.filter(cutoff))
            .order_by("unlock_at", "pk")
        )

    def expired_records(self, *, now: datetime | None = None) -> QuerySet[IdempotencyKey]:
        """The records :meth:`delete_expired_batch` would delete."""
        return IdempotencyKey.objects.using(self.alias).filter(
            rules.DELETABLE.filter(now or timezone.now())
        )

    def delete_expired_batch(
        self,
        *,
        now: datetime,
        batch_size: int,
        after: datetime | None = None,
        pks: list[int] | None = None,
    ) -> Batch:
        """Delete up to ``batch_size`` :data:`~django_idempotency._base.rules.DELETABLE` records in
        one short transaction of its own.

        The rows are picked by primary key on the ``expires_at`` index, from ``after`` on (so a
        long run does not rescan the dead rows it left behind). ``pks`` restricts the batch to
        those records (the admin's selection).
        """
        if pks is not None and not pks:
            return Batch(0, None)
        connection = self.connection
        return self.delete_batch(
            connection, self.batch_query(connection, now, batch_size, after, pks)
        )

    def delete_batch(self, connection: BaseDatabaseWrapper, batch: BatchQuery) -> Batch:
        """Delete the rows ``batch.select`` picks, in a transaction of their own."""
        raise NotImplementedError

    def batch_query(
        self,
        connection: BaseDatabaseWrapper,
        now: datetime,
        size: int,
        after: datetime | None,
        pks: list[int] | None,
    ) -> BatchQuery:
        q = connection.ops.quote_name
        db_now = prep("expires_at", now, connection)
        where = rules.DELETABLE.where(q)
        params = rules.DELETABLE.args(db_now)
        if after is not None:
            where += f" AND {q('expires_at')} >= %s"
            params.append(prep("expires_at", after, connection))
        if pks:
            in_pks, in_params = self.in_ids(connection, pks)
            where += f" AND {in_pks}"
            params += in_params
        select = f"SELECT {q('id')}, {q('expires_at')} FROM {self.batch_from(connection)} "
        select += f"WHERE {where} ORDER BY {q('expires_at')} LIMIT %s"
        return BatchQuery(where, params, select, size)

    def batch_from(self, connection: BaseDatabaseWrapper) -> str:
        """What the batch's ``SELECT`` reads ``FROM``: the table (and a database's hints)."""
        return connection.ops.quote_name(IdempotencyKey._meta.db_table)

    def in_ids(self, connection: BaseDatabaseWrapper, ids: list[int]) -> tuple[str, list[Any]]:
        """``id`` is one of ``ids``, and its parameters."""
        column = connection.ops.quote_name("id")
        return f"{column} IN ({', '.join(['%s'] * len(ids))})", list(ids)

    def erase_batch(self, scope: str, *, size: int) -> int:
        """Delete up to ``size`` finished records of ``scope``, expired or not, in one
        statement; returns how many. A record in ``processing`` is never deleted.

        One statement, so it takes its write lock at once (SQLite waits for it, where a
        ``SELECT`` then a ``DELETE`` in one transaction may be refused the lock it upgrades
        to). The batch is picked in a derived table: MySQL and MariaDB refuse ``LIMIT`` in an
        ``IN`` subquery, and a subquery on the table it deletes from. The outer condition holds
        again for each row as it is deleted (PostgreSQL re-reads a row a claim changed), so a
        record a claim took over meanwhile stays with its new owner.
        """
        connection = self.connection
        q = connection.ops.quote_name
        table = q(IdempotencyKey._meta.db_table)
        finished = f"{q('scope')} = %s AND {q('status')} <> %s"
        with connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {table} WHERE {q('id')} IN (SELECT {q('id')} FROM "
                f"(SELECT {q('id')} FROM {table} WHERE {finished} ORDER BY {q('id')} LIMIT %s) "
                f"AS batch) AND {finished}",
                [scope, rules.PROCESSING, size, scope, rules.PROCESSING],
            )
            return int(cursor.rowcount)

    def table_size(self) -> tuple[int | None, int | None, str]:
        """``(table bytes, index bytes, how they were measured)``, ``None`` for what is unknown.

        From :meth:`size_query`; where it has no answer (or fails), :meth:`database_size`.
        """
        connection = self.connection
        query = self.size_query(IdempotencyKey._meta.db_table)
        with connection.cursor() as cursor:
            if query is not None:
                sql, params, source = query
                try:
                    with transaction.atomic(
                        using=self.alias
                    ):  # a failure must not break the caller's
                        cursor.execute(sql, params)
                        row = cursor.fetchone()
                except DatabaseError:
                    row = None
                if row is not None:
                    return int(row[0]), int(row[1]), source
        whole = self.database_size(connection)
        if whole is None:
            return None, None, "unknown"
        return whole[0], None, whole[1]

    def size_query(self, table: str) -> SizeQuery | None:
        """The statement giving ``(table bytes, index bytes)``, its parameters and its name for
        an operator (``idempotency_stats``); ``None`` where the database has none."""
        return None

    def database_size(self, connection: BaseDatabaseWrapper) -> tuple[int, str] | None:
        """The whole database's bytes and how they were measured, when :meth:`size_query` has
        no answer; ``None`` where the database has none either."""
        return None
