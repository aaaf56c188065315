"""``manage.py idempotency_recover``: find records stuck in ``processing`` and resolve them."""

from __future__ import annotations

import json
from argparse import ArgumentParser
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import CommandError
from django.db import NotSupportedError
from django.utils import timezone
from django.utils.text import capfirst

from django_idempotency import _store as store
from django_idempotency._base import durations
from django_idempotency._base.durations import human
from django_idempotency._base.errors import StoreUnavailable
from django_idempotency._call import operations as operation_ids
from django_idempotency._conf.values import short_error, store_alias
from django_idempotency._ops import maintenance, store_checks
from django_idempotency._store import operations as operation_store
from django_idempotency.management import _arguments as arguments
from django_idempotency.management import database_alias
from django_idempotency.models import IdempotencyKey

_PATH_WIDTH = 50


class Command(arguments.Command):
    help = (
        "List idempotency records stuck in processing past their lock (their worker presumably "
        "died); --release frees them so the client's retry runs the view again, --fail stores "
        "a definite failure (problem request-abandoned) so retries stop. With --operations: "
        "the long-running operations whose 202 is stored and that had no final response nor "
        "progress for --older-than (their task died or raised); --fail stores the problem "
        "operation-failed as their final response."
    )

    numeric = ("--older-than", "--limit")

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--older-than",
            default=None,
            help="Only records whose lock expired at least this long ago (default 0), or with "
            "--operations operations silent at least this long (default 1h, stuck as "
            "idempotency_stats counts them): 90, 90s, 15m, 2h, 1d "
            f"(at most {durations.MAX_DURATION.days}d).",
        )
        action = parser.add_mutually_exclusive_group()
        action.add_argument(
            "--release", action="store_true", help="Delete them: the next retry runs the view."
        )
        action.add_argument(
            "--fail", action="store_true", help="Store a failed response: retries replay it."
        )
        parser.add_argument(
            "--operations",
            action="store_true",
            help="Operations stuck behind their 202 (no word for --older-than) instead of "
            "stale records; --fail fails them (--release does not apply).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Show what --release or --fail would do."
        )
        parser.add_argument(
            "--json", action="store_true", dest="as_json", help="Print JSON rows for scripts."
        )
        parser.add_argument(
            "--limit",
            type=int,
            help=f"At most this many records, oldest first (1 to {arguments.MAX_COUNT}).",
        )
        parser.add_argument(
            "--database", help="Database alias (default: the IDEMPOTENCY DATABASE_ALIAS)."
        )

    def handle(
        self,
        *args: Any,
        older_than: object,
        release: bool,
        fail: bool,
        operations: bool,
        dry_run: bool,
        as_json: bool,
        limit: int | None,
        database: str | None,
        verbosity: int,
        **options: Any,
    ) -> None:
        if release and fail:
            raise CommandError("Give --release or --fail, not both.")
        if limit is not None:
            limit = arguments.count("--limit", limit)
        margin = _margin(older_than, operations=operations)
        alias = database_alias(database)
        if operations:
            if release:
                raise CommandError(
                    "--release does not apply to --operations: an operation's request "
                    "answered 202; give --fail to store its failure."
                )
            self._operations(alias, margin, fail, dry_run, as_json, limit, verbosity)
            return
        records = store.using(alias).stale_records(older_than=margin)
        if limit is not None:
            records = records[:limit]
        verb = "release" if release else "fail" if fail else ""
        rows, done = _resolve(alias, records, release=release, fail=fail, dry_run=dry_run)
        if self._printed_or_quiet(rows, as_json, verbosity):
            return
        if rows:
            self._table(rows)
        self._summary(
            len(rows),
            "stale idempotency record",
            verb,
            "Released" if release else "Marked as failed",
            done,
            "resolved",
            dry_run=dry_run,
        )
        for note in store_checks.store_notes(
            "a stale record there is taken over by the key's next request (it is not listed)"
        ):
            self.stdout.write(note)

    def _operations(
        self,
        alias: str,
        margin: Any,
        fail: bool,
        dry_run: bool,
        as_json: bool,
        limit: int | None,
        verbosity: int,
    ) -> None:
        records, unreachable = _stuck(alias, margin)
        for note in unreachable:
            self.stderr.write(note)
        if limit is not None:
            records = records[:limit]
        now = timezone.now()
        rows = []
        done = 0
        for where, record in records:
            outcome = None
            if fail and dry_run:
                outcome = "would fail"
            elif fail:
                succeeded = maintenance.fail_operation(where, record)
                done += succeeded
                outcome = "failed" if succeeded else "skipped"
            rows.append(_operation_row(record, outcome, now))
        if self._printed_or_quiet(rows, as_json, verbosity):
            return
        if rows:
            self._operations_table(rows, fail)
        # Stuck as idempotency_stats says it (silent an hour); a shorter --older-than lists
        # operations merely quiet for a while.
        stuck = margin >= maintenance.OPERATION_STUCK_AFTER
        self._summary(
            len(rows),
            "stuck operation" if stuck else "silent operation",
            "fail" if fail else "",
            "Failed",
            done,
            "completed",
            dry_run=dry_run,
        )

    def _operations_table(self, rows: list[dict[str, Any]], fail: bool) -> None:
        columns = ["operation", "scope", "path", "age", "silent for"]
        if fail:
            columns.append("action")
        table = [
            [
                row["operation"],
                row["scope"],
                _shorten(row["path"]),
                human(row["age_seconds"]),
                human(row["silent_seconds"]),
                row["action"] or "",
            ][: len(columns)]
            for row in rows
        ]
        self._lines(columns, table)

    def _printed_or_quiet(self, rows: list[dict[str, Any]], as_json: bool, verbosity: int) -> bool:
        """Whether nothing more is printed: the rows went out as JSON, or verbosity 0."""
        if as_json:
            self.stdout.write(json.dumps(rows, indent=2))
            return True
        return verbosity < 1

    def _lines(self, columns: list[str], table: list[list[str]]) -> None:
        widths = [max(len(line[i]) for line in [columns, *table]) for i in range(len(columns))]
        for line in [columns, *table]:
            self.stdout.write(
                "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
            )

    def _summary(
        self,
        count: int,
        noun: str,
        verb: str,
        done_verb: str,
        done: int,
        meanwhile: str,
        *,
        dry_run: bool,
    ) -> None:
        """The closing line: how many were found, would be or were acted on (``verb``; none:
        only listed), and how many were ``meanwhile`` settled by someone else."""
        noun += "" if count == 1 else "s"
        if not verb:
            self.stdout.write(f"{count} {noun}.")
        elif dry_run:
            self.stdout.write(f"Would {verb} {count} {noun} (dry run: nothing changed).")
        else:
            message = f"{done_verb} {done} of {count} {noun}."
            if done < count:
                message += f" {count - done} were {meanwhile} meanwhile and left alone."
            self.stdout.write(self.style.SUCCESS(message))

    def _table(self, rows: list[dict[str, Any]]) -> None:
        columns = ["scope", "key", "method", "path", "age", "stale for", "attempt"]
        if rows[0]["action"] is not None:
            columns.append("action")
        table = [
            [
                row["scope"],
                row["key_hash"][:12],
                row["method"],
                _shorten(row["path"]),
                human(row["age_seconds"]),
                human(row["stale_seconds"]),
                str(row["attempt"]),
                row["action"] or "",
            ][: len(columns)]
            for row in rows
        ]
        self._lines(columns, table)


def _resolve(
    alias: str, records: Iterable[IdempotencyKey], *, release: bool, fail: bool, dry_run: bool
) -> tuple[list[dict[str, Any]], int]:
    """Each stale record's row, acted on as asked (or said what would be, with ``dry_run``),
    and how many the act resolved: one that another process settled meanwhile is skipped."""
    verb = "release" if release else "fail" if fail else ""
    rows = []
    done = 0
    for record in records:
        outcome = None
        if verb and dry_run:
            outcome = f"would {verb}"
        elif verb:
            act = maintenance.release if release else maintenance.mark_failed
            succeeded = act(alias, record)
            done += succeeded
            outcome = ("released" if release else "failed") if succeeded else "skipped"
        rows.append(_row(record, outcome))
    return rows, done


def _row(record: IdempotencyKey, action: str | None) -> dict[str, Any]:
    now = timezone.now()
    assert record.unlock_at is not None
    return {
        "id": record.pk,
        "scope": record.scope,
        "key_hash": record.key_hash,
        "method": record.method,
        "path": record.path,
        "attempt": record.attempt,
        "recovery_point": record.recovery_point,
        "created_at": record.created_at.isoformat(),
        "unlock_at": record.unlock_at.isoformat(),
        "age_seconds": round((now - record.created_at).total_seconds(), 3),
        "stale_seconds": round((now - record.unlock_at).total_seconds(), 3),
        "action": action,
    }


def _stuck(alias: str, margin: Any) -> tuple[list[tuple[str, IdempotencyKey]], list[str]]:
    """The stuck operations of the database ``alias``, then of each other store the settings
    and the URLconf's views name (a Redis store's ``SCAN``), with the alias of their store; and
    a note of each that did not answer, named by its class (the others' are still listed)."""
    found = [(alias, record) for record in operation_store.stuck(alias, older_than=margin)]
    notes = []
    for named in sorted(store_checks.other_stores()):
        where = store_alias(named, "")
        try:
            records = operation_store.stuck(where, older_than=margin)
        except StoreUnavailable as exc:
            said = short_error(exc, where)
            notes.append(f"{capfirst(store_checks.described(named))} did not answer: {said}")
            continue
        except NotSupportedError:  # a store that keeps no operations has none stuck
            continue
        found += [(where, record) for record in records]
    return found, notes


def _operation_row(record: IdempotencyKey, action: str | None, now: datetime) -> dict[str, Any]:
    """A stuck operation as ``--json`` gives it: its id as its client knows it (the one its
    ``202`` gave), how old it is and how long it has been silent, all ages from one ``now``."""
    return {
        "id": record.pk,
        "operation": operation_ids.make_id(
            record.pk, record.scope, record.key_hash, record.created_at
        ),
        "scope": record.scope,
        "key_hash": record.key_hash,
        "method": record.method,
        "path": record.path,
        "created_at": record.created_at.isoformat(),
        "updated_at": record.updated_at.isoformat(),
        "age_seconds": round((now - record.created_at).total_seconds(), 3),
        "silent_seconds": round((now - record.updated_at).total_seconds(), 3),
        "progress": operation_store.from_record(record).progress,
        "action": action,
    }


def _shorten(path: str) -> str:
    return path if len(path) <= _PATH_WIDTH else path[: _PATH_WIDTH - 1] + "…"


def _margin(older_than: object, *, operations: bool) -> timedelta:
    """``--older-than``; by default 0 for stale records, and for operations the silence that
    makes one stuck as ``idempotency_stats`` counts them (an hour)."""
    if older_than is None:
        return maintenance.OPERATION_STUCK_AFTER if operations else timedelta(0)
    return arguments.duration("--older-than", older_than)
