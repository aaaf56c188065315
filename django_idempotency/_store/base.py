"""What every database's store shares, on top of the store contract (:mod:`.contract`).

A vendor module (:mod:`.postgresql`, :mod:`.mysql`, :mod:`.sqlite`) subclasses :class:`Store`
and writes the statements its database needs: the claim's insert-or-read, the lock-wait bound,
the cleanup's batch delete, how it measures the table and how it reports a lock wait that timed
out. Everything else is written once, by concern, from the rules in
:mod:`.._base.rules`: the claim and its takeover (:mod:`.claims`), the fenced writes
(:mod:`.writes`), the operators' queries (:mod:`.maintenance`), a record as an operation
(:mod:`.table_operations`), the outbox's relay (:mod:`.outbox`).
"""

from __future__ import annotations

from django_idempotency._store.claims import Claims
from django_idempotency._store.maintenance import Maintenance
from django_idempotency._store.outbox import TableOutbox
from django_idempotency._store.table_operations import TableOperations
from django_idempotency._store.writes import FencedWrites


class Store(Claims, FencedWrites, Maintenance, TableOperations, TableOutbox):
    """Every statement the app runs against its table, each one atomic on its own, on one
    database alias (:func:`django_idempotency._store.using`). Writes after the claim are
    fenced by its ``lock_token``."""

    @classmethod
    def describe(cls, alias: str) -> str:
        return f"database {alias!r}"

    def ping(self) -> None:
        """One ``SELECT 1`` on the calling thread's connection, made if it has none."""
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT 1")
