"""``manage.py idempotency_relay``: deliver the outbox's released messages (issue 41)."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django_idempotency._conf.settings import usable
from django_idempotency._ops.relay import Relay
from django_idempotency.management import _arguments, database_alias


class Command(_arguments.Command):
    help = (
        "Deliver the outbox's released messages at least once: to Celery (apply_async, the "
        "message id as task_id) or a django.tasks backend. Runs until SIGTERM or SIGINT, woken "
        "by PostgreSQL's NOTIFY or polling; --once for one pass from cron."
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

    def handle(
        self,
        *args: Any,
        once: bool,
        batch_size: int | None,
        interval: float | None,
        database: str | None,
        verbosity: int,
        **options: Any,
    ) -> None:
        # The web server's validator: what stops gunicorn stops the relay, in the same words,
        # with --skip-checks (call_command's default) too (issue 48).
        usable()
        if batch_size is not None:
            _arguments.count("--batch-size", batch_size)
        if interval is not None:
            _arguments.seconds("--interval", interval, zero=False, most=_arguments.MAX_SLEEP)
        relay = Relay(
            database_alias(database),
            batch_size=batch_size,
            interval=interval,
            report=self.stdout.write if verbosity >= 2 else None,
        )
        done = relay.run(once=once)
        if verbosity >= 1:
            self.stdout.write(f"Sent {done.sent:,} message(s); {done.failed:,} failed.")
