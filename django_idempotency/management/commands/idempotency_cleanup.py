"""``manage.py idempotency_cleanup``: delete expired records in short batches, from cron; with
``--scope``, erase one principal's finished records now (:func:`django_idempotency.erase_scope`).
"""

from __future__ import annotations

import time
from argparse import ArgumentParser
from datetime import datetime
from typing import Any

from django.core.management.base import CommandError
from django.db import NotSupportedError
from django.utils import timezone

from django_idempotency import _store as store
from django_idempotency._base.errors import StoreUnavailable
from django_idempotency._ops import maintenance, store_checks
from django_idempotency._ops.erasure import STORED_HASH, erase_scope
from django_idempotency._ops.relay import delete_delivered
from django_idempotency.management import _arguments as arguments
from django_idempotency.management import database_alias

# At the default verbosity a progress line at most this often (seconds); every batch at -v 2.
PROGRESS_EVERY = 5.0


class Command(arguments.Command):
    help = (
        "Delete expired idempotency records in batches, each a short transaction of its own. "
        "Safe to run while the API serves traffic, and safe to run twice at once."
    )

    numeric = ("--batch-size", "--sleep", "--max-batches", "--limit", "--max-runtime")

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--batch-size",
            type=int,
            default=maintenance.DEFAULT_BATCH_SIZE,
            help=f"Records per batch, 1 to {arguments.MAX_COUNT} "
            f"(default {maintenance.DEFAULT_BATCH_SIZE}).",
        )
        parser.add_argument(
            "--sleep",
            type=float,
            default=0.0,
            help=f"Seconds to pause between batches, to spare the database: 0 to "
            f"{arguments.MAX_SLEEP:g} (default 0).",
        )
        parser.add_argument("--max-batches", type=int, help="Stop after this many batches.")
        parser.add_argument("--limit", type=int, help="Stop after deleting this many records.")
        parser.add_argument(
            "--max-runtime",
            type=float,
            help=f"Start no new batch after this many seconds (at most {arguments.MAX_RUNTIME:g}).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count the expired records; delete nothing."
        )
        parser.add_argument(
            "--database", help="Database alias (default: the IDEMPOTENCY DATABASE_ALIAS)."
        )
        parser.add_argument(
            "--scope",
            help="Erase: delete every finished record of this scope now, expired or not (as "
            "the scope function returns it, e.g. user:42); records in progress are left and "
            "reported.",
        )
        parser.add_argument(
            "--stored",
            action="store_true",
            help="--scope is the scope as a record stores it, as the admin shows it "
            "(sha256:<64 hex digits> for a scope stored hashed), not as the scope function "
            "returns it.",
        )

    def handle(
        self,
        *args: Any,
        batch_size: int,
        sleep: float,
        max_batches: int | None,
        limit: int | None,
        max_runtime: float | None,
        dry_run: bool,
        database: str | None,
        verbosity: int,
        scope: str | None = None,
        stored: bool = False,
        **options: Any,
    ) -> None:
        batch_size = arguments.count("--batch-size", batch_size)
        if max_batches is not None:
            max_batches = arguments.count("--max-batches", max_batches)
        if limit is not None:
            limit = arguments.count("--limit", limit)
        sleep = arguments.seconds("--sleep", sleep, zero=True, most=arguments.MAX_SLEEP)
        if max_runtime is not None:
            max_runtime = arguments.seconds(
                "--max-runtime", max_runtime, zero=False, most=arguments.MAX_RUNTIME
            )
        alias = database_alias(database)
        bounds = (max_batches, limit, max_runtime)
        if scope is not None:
            # Without --database, erase_scope() erases the Redis stores' records too.
            self._erase(scope, database and alias, batch_size, dry_run, bounds, verbosity, stored)
            if not dry_run:  # the erased records' delivered messages go with them
                delete_delivered(alias, batch_size)
            return
        if stored:
            raise CommandError("--stored says how --scope is given: it goes with --scope.")
        if verbosity >= 1:
            for note in store_checks.store_notes("nothing to delete there"):
                self.stdout.write(note)
        now = timezone.now()
        if dry_run:
            self._dry_run(alias, now, batch_size, limit, max_batches, verbosity)
            return
        self._delete_expired(alias, now, batch_size, bounds, sleep, verbosity)
        # The outbox's delivered messages go with their record.
        messages = delete_delivered(alias, batch_size, sleep=sleep)
        if verbosity >= 1 and messages:
            self.stdout.write(f"Deleted {messages} delivered outbox message{_s(messages)}.")

    def _delete_expired(
        self,
        alias: str,
        now: datetime,
        batch_size: int,
        bounds: tuple[int | None, int | None, float | None],
        sleep: float,
        verbosity: int,
    ) -> None:
        """The expired records deleted in batches within ``bounds`` (``--max-batches``,
        ``--limit``, ``--max-runtime``), their progress written at most every
        ``PROGRESS_EVERY`` seconds (each batch with ``-v 2``): a long run shows it is alive."""
        max_batches, limit, max_runtime = bounds
        last = [time.monotonic()]

        def progress(count: int, deleted: int, batches: int, elapsed: float) -> None:
            if verbosity >= 2 or (verbosity >= 1 and time.monotonic() - last[0] >= PROGRESS_EVERY):
                last[0] = time.monotonic()
                self.stdout.write(
                    f"Batch {batches}: deleted {count} "
                    f"({deleted} in all, {_rate(deleted, elapsed)} rows/s)."
                )

        done = maintenance.delete_expired(
            alias,
            now,
            batch_size,
            max_batches=max_batches,
            limit=limit,
            max_runtime=max_runtime,
            sleep=sleep,
            progress=progress,
        )
        if verbosity >= 1:
            self.stdout.write(
                self.style.SUCCESS(
                    f"Deleted {done.deleted} expired idempotency record{_s(done.deleted)} in "
                    f"{done.batches} batch{'es' if done.batches != 1 else ''} "
                    f"({done.seconds:.1f} s, {_rate(done.deleted, done.seconds)} rows/s)."
                )
            )
            if done.stopped_by:
                self.stdout.write(f"Stopped by {done.stopped_by}; expired records may remain.")

    def _erase(
        self,
        scope: str,
        alias: str | None,
        batch_size: int,
        dry_run: bool,
        bounds: tuple[int | float | None, ...],
        verbosity: int,
        stored: bool,
    ) -> None:
        if any(bound is not None for bound in bounds):
            raise CommandError(
                "--scope erases every finished record of the scope: --max-batches, --limit and "
                "--max-runtime do not apply to it."
            )
        try:
            erasure = erase_scope(
                scope, using=alias, batch_size=batch_size, dry_run=dry_run, stored=stored
            )
        except (ValueError, NotSupportedError, StoreUnavailable) as exc:  # a store that cannot
            raise CommandError(str(exc)) from exc  # erase, or does not answer
        if verbosity < 1:
            return
        shown = _shown(scope)
        if not (erasure.deleted or erasure.in_progress):
            self._none_found(shown, hashed=not stored and bool(STORED_HASH.fullmatch(scope)))
            return
        verb = "Would delete" if dry_run else "Deleted"
        self.stdout.write(
            self.style.SUCCESS(
                f"{verb} {erasure.deleted} finished idempotency record{_s(erasure.deleted)} "
                f"of scope {shown}."
            )
        )
        if erasure.in_progress:
            self.stdout.write(
                self.style.WARNING(
                    f"{erasure.in_progress} record{_s(erasure.in_progress)} of the scope "
                    f"{'is' if erasure.in_progress == 1 else 'are'} still processing and "
                    "left to finish; run this again once they have."
                )
            )

    def _none_found(self, shown: str, *, hashed: bool) -> None:
        """An erasure that found nothing is a warning, not a success: a scope mistyped, or
        copied from the admin (``hashed``: its stored form, which ``--stored`` takes)."""
        self.stdout.write(
            self.style.WARNING(f"No idempotency record has scope {shown}: nothing to delete.")
        )
        if hashed:
            self.stdout.write(
                self.style.WARNING(
                    "That is how the admin shows a scope stored hashed: to erase the "
                    "records stored under it, add --stored."
                )
            )

    def _dry_run(
        self,
        alias: str,
        now: datetime,
        batch_size: int,
        limit: int | None,
        max_batches: int | None,
        verbosity: int,
    ) -> None:
        total = store.using(alias).expired_records(now=now).count()
        count = total
        if limit is not None:
            count = min(count, limit)
        if max_batches is not None:
            count = min(count, max_batches * batch_size)
        batches = -(-count // batch_size)
        if verbosity >= 1:
            self.stdout.write(
                f"Would delete {count} expired idempotency record{_s(count)} in {batches} "
                f"batch{'es' if batches != 1 else ''} of up to {batch_size} "
                f"({total} expired in all)."
            )


def _rate(rows: int, seconds: float) -> str:
    return f"{rows / seconds:,.0f}" if seconds > 0 else "-"


#: The longest scope a message repeats whole; a longer one is cut.
SHOWN_SCOPE = 80


def _shown(scope: str) -> str:
    """The scope as messages show it: quoted, and cut with its length when it is long."""
    if len(scope) <= SHOWN_SCOPE:
        return repr(scope)
    return f"{scope[: SHOWN_SCOPE - 20]!r}… ({len(scope):,} characters)"


def _s(count: int) -> str:
    return "" if count == 1 else "s"
