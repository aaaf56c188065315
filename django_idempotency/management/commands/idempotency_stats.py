"""``manage.py idempotency_stats``: the table's health at a glance, or as JSON for monitoring."""

from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from django_idempotency._base.durations import human
from django_idempotency._ops import maintenance, relay, store_checks
from django_idempotency.management import database_alias


class Command(BaseCommand):
    help = (
        "Show the idempotency table's health: records by status, expired records waiting for "
        "idempotency_cleanup, stale processing records, and the table's size. Counting reads "
        "the whole table once."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--json", action="store_true", dest="as_json", help="Print one JSON object."
        )
        parser.add_argument(
            "--database", help="Database alias (default: the IDEMPOTENCY DATABASE_ALIAS)."
        )

    def handle(
        self, *args: Any, as_json: bool, database: str | None, verbosity: int, **options: Any
    ) -> None:
        alias = database_alias(database)
        try:
            stats = maintenance.stats(alias)
            outbox = relay.backlog(alias)
        except DatabaseError as exc:
            raise CommandError(f"The database {alias!r} did not answer: {exc}".strip()) from exc
        census = store_checks.redis_census()
        unreachable = [
            f"Redis store {name!r} did not answer: {figures['error']}"
            for name, figures in census.items()
            if figures["error"] is not None
        ]
        stuck = [
            f"Redis store {name!r}: {figures['operations_stuck']:,} long-running operation(s) "
            f"had no final response nor progress for over "
            f"{human(maintenance.OPERATION_STUCK_AFTER.total_seconds())}: "
            "idempotency_recover --operations lists them."
            for name, figures in census.items()
            if figures["operations_stuck"]
        ]
        warnings = [*stats.warnings, *relay.warnings(outbox), *stuck, *unreachable]
        for name, figures in census.items():
            if figures["error"] is None:
                warnings += [f"Redis store {name!r}: {w}" for w in relay.warnings(figures)]
        if as_json:
            figures = {**as_dict(stats), **outbox, "redis_stores": census, "warnings": warnings}
            self.stdout.write(json.dumps(figures, indent=2))
        elif verbosity >= 1:
            self._text(stats, outbox, warnings)
        if unreachable:  # monitoring must see the failure, not only read it
            raise CommandError("; ".join(unreachable))

    def _text(self, stats: maintenance.Stats, outbox: dict[str, Any], warnings: list[str]) -> None:
        stale = f"{stats.stale:,}" + (f" ({stats.stale_ages})" if stats.stale_ages else "")
        statuses = ", ".join(f"{status} {count:,}" for status, count in stats.by_status.items())
        for label, value in (
            ("Records", f"{stats.total:,} ({statuses})"),
            ("Expired, to clean up", f"{stats.expired:,}"),
            ("Stale processing", stale),
            ("Size", stats.size),
            ("Outbox undelivered", relay.describe(outbox)),
            ("Operations running", _operations(stats)),
        ):
            self.stdout.write(f"{label + ':':<22}{value}")
        for warning in warnings:
            self.stdout.write(self.style.WARNING(f"Warning: {warning}"))
        for note in store_checks.redis_notes("idempotency_cleanup has nothing to delete there"):
            self.stdout.write(note)


def _operations(stats: maintenance.Stats) -> str:
    """``3 (1 stuck, longest silent 2h)``: the operations waiting behind their ``202``."""
    if not stats.operations_running or stats.longest_operation_silence is None:
        return f"{stats.operations_running:,}"
    return (
        f"{stats.operations_running:,} ({stats.operations_stuck:,} stuck, longest silent "
        f"{human(stats.longest_operation_silence)})"
    )


def as_dict(stats: maintenance.Stats) -> dict[str, Any]:
    """The ``--json`` object; every key is always present (``null`` when unknown)."""
    return {
        "total": stats.total,
        "by_status": stats.by_status,
        "expired": stats.expired,
        "stale": stats.stale,
        "oldest_stale_age_seconds": stats.oldest_stale_age,
        "longest_stale_for_seconds": stats.longest_stale_for,
        "operations_running": stats.operations_running,
        "operations_stuck": stats.operations_stuck,
        "longest_operation_silence_seconds": stats.longest_operation_silence,
        "table_bytes": stats.table_bytes,
        "index_bytes": stats.index_bytes,
        "size_source": stats.size_source,
        "cleanup_rows_per_minute": maintenance.CLEANUP_ROWS_PER_MINUTE,
        "warnings": stats.warnings,
    }
