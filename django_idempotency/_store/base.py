"""What every database's store shares, on top of the store contract (:mod:`.contract`).

A vendor module (:mod:`.postgresql`, :mod:`.mysql`, :mod:`.sqlite`) subclasses :class:`Store`
and writes the statements its database needs: the claim's insert-or-read, the lock-wait bound,
the cleanup's batch delete, how it measures the table and how it reports a lock wait that timed
out. Everything else is written once, by concern, from the rules in
:mod:`.._base.rules`: the claim and its takeover (:mod:`.claims`), the fenced writes
(:mod:`.writes`), the operators' queries (:mod:`.maintenance`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connections

from django_idempotency._store import outbox
from django_idempotency._store.claims import Claims
from django_idempotency._store.maintenance import Maintenance
from django_idempotency._store.writes import FencedWrites


class Store(Claims, FencedWrites, Maintenance):
    """Every statement the app runs against its table, each one atomic on its own, on one
    database alias (:func:`django_idempotency._store.using`). Writes after the claim are
    fenced by its ``lock_token``."""

    def backlog(self) -> outbox.Backlog:
        """The outbox table's pending and failed messages, and its oldest undelivered one."""
        return outbox.backlog(connections[self.alias])

    def failed_messages(self) -> list[Any]:
        """The outbox table's messages failed for good, oldest release first."""
        from django_idempotency.models import OutboxMessage

        rows = OutboxMessage.objects.using(self.alias).filter(state=outbox.FAILED)
        return list(rows.order_by("released_at", "id"))

    def resend(self, keys: Sequence[Any]) -> int:
        """Make those of the messages ``keys`` (their ids) still failed pending, due now."""
        from django_idempotency.models import OutboxMessage

        rows = OutboxMessage.objects.using(self.alias).filter(pk__in=keys, state=outbox.FAILED)
        return outbox.resend(connections[self.alias], list(rows.values_list("pk", flat=True)))
