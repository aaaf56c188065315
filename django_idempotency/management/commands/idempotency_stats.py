"""``manage.py idempotency_stats``: the table's health at a glance, or as JSON for monitoring."""

from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError
from django.utils.text import capfirst

from django_idempotency._base.durations import human
from django_idempotency._conf import stores
from django_idempotency._conf.values import DATABASE, display_name, short_error, store_alias
from django_idempotency._ops import maintenance, relay, store_checks
from django_idempotency.management import database_alias, store_option


class Command(BaseCommand):
    help = (
        "Show the idempotency table's health: records by status, expired records waiting for "
        "idempotency_cleanup, stale processing records, the table's size and the outbox's "
        "backlog; then each other store's (a Redis store's) records, outbox and operations. "
        "Counting reads the whole table once."
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
            said = short_error(exc)
            raise CommandError(f"The database {alias!r} did not answer: {said}") from exc
        census = store_checks.store_census()
        unreachable = [
            f"{capfirst(_described(name))} did not answer: {figures['error']}"
            for name, figures in census.items()
            if figures["error"] is not None
        ]
        warnings = [*_warnings(stats, outbox, census, alias), *unreachable]
        if as_json:
            figures = {
                **as_dict(stats),
                **outbox,
                "stores": census,
                **store_checks.stats_groups(census),
                "warnings": warnings,
            }
            self.stdout.write(json.dumps(figures, indent=2))
        elif verbosity >= 1:
            self._text(stats, outbox, census, warnings)
        if unreachable:  # monitoring must see the failure, not only read it
            raise CommandError("; ".join(unreachable))

    def _text(
        self,
        stats: maintenance.Stats,
        outbox: dict[str, Any],
        census: dict[str, Any],
        warnings: list[str],
    ) -> None:
        stale = f"{stats.stale:,}" + (f" ({stats.stale_ages})" if stats.stale_ages else "")
        for label, value in (
            ("Records", f"{stats.total:,} ({_statuses(stats.by_status)})"),
            ("Expired, to clean up", f"{stats.expired:,}"),
            ("Stale processing", stale),
            ("Size", stats.size),
            ("Outbox undelivered", relay.describe(outbox)),
            ("Operations running", _operations(stats)),
        ):
            self.stdout.write(f"{label + ':':<22}{value}")
        named = {display_name(store): store for store in store_checks.other_stores()}
        for name, figures in census.items():
            self._redis_text(named.get(name, name), figures)
        for warning in warnings:
            self.stdout.write(self.style.WARNING(f"Warning: {warning}"))

    def _redis_text(self, name: str, figures: dict[str, Any]) -> None:
        """Another store's figures (a Redis store's) under the table's, as its census gives
        them (a figure it cannot give is *unknown*): its records, and its outbox and operations
        (the table's lines count neither); named as its class describes it."""
        label = capfirst(_described(name))
        if figures["error"] is not None:
            self.stdout.write(f"{label}: not reachable ({figures['error']}).")
            return
        kind = stores.kind_of(store_alias(_named(name), ""))
        if kind is not None and kind.expiry:  # then no record of it is the cleanup's
            label += f" ({kind.expiry}: idempotency_cleanup has nothing to delete there)"
        self.stdout.write(f"{label}:")
        running = _count(figures["operations_running"])
        if figures["operations_running"]:
            running += f" ({_count(figures['operations_stuck'])} stuck)"
        records = _count(figures["total"])
        if figures["by_status"]:
            records += f" ({_statuses(figures['by_status'])})"
        for label, value in (
            ("Records", records),
            ("Stale processing", _count(figures["stale"])),
            ("Outbox undelivered", relay.describe(figures)),
            ("Operations running", running),
        ):
            self.stdout.write(f"  {label + ':':<20}{value}")


def _count(value: int | None) -> str:
    """A census's figure; ``unknown`` where the store cannot say (the contract's default
    census counts its records only)."""
    return "unknown" if value is None else f"{value:,}"


def _statuses(by_status: dict[str, int]) -> str:
    """``processing 1, completed 2, failed 0``: the records by status."""
    return ", ".join(f"{status} {count:,}" for status, count in by_status.items())


def _warnings(
    stats: maintenance.Stats, outbox: dict[str, Any], census: dict[str, Any], alias: str
) -> list[str]:
    """The table's warnings, then its outbox's, then each other store's that answered: its
    stuck operations and its outbox's failed messages, whose suggested commands name the
    store unless it is ``STORE`` (the commands' default)."""
    warnings = [*stats.warnings, *relay.warnings(outbox, store_option(DATABASE, alias))]
    silent = human(maintenance.OPERATION_STUCK_AFTER.total_seconds())
    for store in sorted(store_checks.other_stores()):
        figures = census[display_name(store)]
        if figures["error"] is not None:
            continue
        label = capfirst(store_checks.described(store))
        if figures["operations_stuck"]:
            warnings.append(
                f"{label}: {figures['operations_stuck']:,} long-running "
                f"operation(s) had no final response nor progress for over {silent}: "
                "idempotency_recover --operations lists them."
            )
        reach = store_option(store, alias)
        warnings += [f"{label}: {w}" for w in relay.warnings(figures, reach)]
    return warnings


def _named(shown: str) -> str:
    """The store (``STORE``'s value) the census shows as ``shown`` (its key: no password)."""
    found = (s for s in store_checks.other_stores() if display_name(s) == shown)
    return next(found, shown)


def _described(shown: str) -> str:
    """The census's store ``shown`` as its class describes it (``Redis store 'redis'``)."""
    return store_checks.described(_named(shown))


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
