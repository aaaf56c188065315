"""``manage.py idempotency_relay``: deliver the outbox's released messages."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management import CommandError
from django.db import DatabaseError

from django_idempotency._base.errors import StoreUnavailable
from django_idempotency._conf import stores
from django_idempotency._conf.settings import conf, usable
from django_idempotency._conf.values import short_error, shown_store
from django_idempotency._ops import relay
from django_idempotency._ops.relay import Relay
from django_idempotency.management import _arguments, store_of


class Command(_arguments.Command):
    help = (
        "Deliver the outbox's released messages at least once: to Celery (apply_async, the "
        "message id as task_id) or a django.tasks backend. Runs until SIGTERM or SIGINT, woken "
        "by PostgreSQL's NOTIFY or polling; --once for one pass from cron. --failed lists the "
        "messages failed for good, --retry-failed sends them again. It relays the outbox of "
        "STORE, the store the views use; --store or --database picks another."
    )
    numeric = ("--batch-size", "--interval")

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--once", action="store_true", help="One pass, then exit.")
        parser.add_argument(
            "--batch-size", type=int, help="Messages per batch (default: OUTBOX_BATCH_SIZE)."
        )
        parser.add_argument(
            "--interval",
            type=float,
            help="Seconds between polls when nothing wakes the relay (default: "
            "OUTBOX_POLL_INTERVAL).",
        )
        parser.add_argument(
            "--database", help="Database alias (default: the IDEMPOTENCY DATABASE_ALIAS)."
        )
        parser.add_argument(
            "--store",
            help="Relay a Redis store's outbox instead: its CACHES alias or URL, as STORE "
            "names it (one relay per store).",
        )
        parser.add_argument(
            "--failed",
            action="store_true",
            help="List the messages failed for good (OUTBOX_MAX_ATTEMPTS sends refused), with "
            "their last error, and exit.",
        )
        parser.add_argument(
            "--retry-failed",
            action="store_true",
            help="Make every failed message pending and due now (the admin's re-send), then "
            "relay as usual (with --once: one pass).",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="With --retry-failed: list what would be sent again, change and send nothing.",
        )

    def handle(
        self,
        *args: Any,
        once: bool,
        batch_size: int | None,
        interval: float | None,
        database: str | None,
        verbosity: int,
        store: str | None = None,
        failed: bool = False,
        retry_failed: bool = False,
        dry_run: bool = False,
        **options: Any,
    ) -> None:
        # The web server's validator: what stops gunicorn stops the relay, in the same words,
        # with --skip-checks (call_command's default) too.
        usable()
        if batch_size is not None:
            _arguments.count("--batch-size", batch_size)
        if interval is not None:
            _arguments.seconds("--interval", interval, zero=False, most=_arguments.MAX_SLEEP)
        if failed and retry_failed:
            raise CommandError("Give --failed (list) or --retry-failed (send again), not both.")
        if dry_run and not retry_failed:
            raise CommandError("--dry-run goes with --retry-failed.")
        alias = store_of(store, database)
        if store is None and database is None:
            self._left_behind(alias)
        try:
            if why := relay.refusal(alias):  # a store without one (or a cluster): said, at once
                raise CommandError(f"The {_where(alias)} has no outbox to relay: {why}.")
            self._relay(alias, once, batch_size, interval, verbosity, failed, retry_failed, dry_run)
        except (DatabaseError, StoreUnavailable) as exc:  # a store down: said, not a traceback
            where = _where(alias)
            # Short and redacted (its class, its first line); a Redis fault names its store.
            said = short_error(exc, alias).replace(f"{where}: ", "", 1)
            raise CommandError(f"The {where} did not answer: {said}".strip()) from exc

    def _left_behind(self, alias: str) -> None:
        """Say it when the relay follows a ``STORE`` other than the database (Redis) while
        the database's outbox holds messages: the views on ``store="database"`` stage there
        (the only outbox a Redis ``STORE`` had before this release), and a relay started as before
        leaves them unsent."""
        if alias == conf.DATABASE_ALIAS:
            return
        try:
            left = relay.backlog(conf.DATABASE_ALIAS)
        except (DatabaseError, StoreUnavailable):
            return  # the database's own relay, or stats, says that it is down
        waiting = left["outbox_pending"] + left["outbox_failed"]
        if waiting:
            self.stderr.write(
                f"The database's outbox holds {waiting:,} message(s) this relay does not send "
                f"(it relays {_where(alias)}, the STORE): run another relay with "
                "--store database."
            )

    def _relay(
        self,
        alias: str,
        once: bool,
        batch_size: int | None,
        interval: float | None,
        verbosity: int,
        failed: bool,
        retry_failed: bool,
        dry_run: bool,
    ) -> None:
        if failed or retry_failed:
            messages = relay.failed(alias)
            if verbosity >= 1 and (failed or dry_run):
                for message in messages:
                    self.stdout.write(relay.line(message))
            if failed or dry_run:
                if verbosity >= 1:
                    verb = "would be sent again" if dry_run else "failed"
                    self.stdout.write(f"{len(messages):,} message(s) {verb}.")
                return
            count = relay.retry_failed(alias, messages)
            if verbosity >= 1:
                self.stdout.write(f"{count:,} failed message(s) made pending again.")
        sender = Relay(
            alias,
            batch_size=batch_size,
            interval=interval,
            report=self.stdout.write if verbosity >= 2 else None,
        )
        done = sender.run(once=once)
        if verbosity >= 1:
            # Named: two relays (the database's and a Redis store's) print one line each.
            self.stdout.write(
                f"Sent {done.sent:,} message(s); {done.failed:,} failed ({_where(alias)})."
            )


def _where(alias: str) -> str:
    """``database 'default'`` or ``Redis store 'redis://host:6379/0'`` (no password): as the
    store's class describes it (the registry's, :mod:`.._conf.stores`)."""
    kind = stores.kind_of(alias)
    return shown_store(alias) if kind is None else kind.describe(alias)
