"""The commands' arguments, checked before anything is touched.

A value a command cannot honour is a ``CommandError`` naming the argument and its range, the same
on every database: ``--sleep nan`` once deleted a batch and then died, ``--batch-size`` past a
database's integers was an ``OverflowError``, a ``DataError`` or a MySQL syntax error depending
on the database, and MariaDB took a ``--limit`` that SQLite and PostgreSQL refused.
The bounds are documented in docs/commands.rst.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Sequence
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_idempotency._base import durations

#: The largest count a command takes (``--batch-size``, ``--limit``, ``--max-batches``): the
#: largest signed 32-bit integer, which every supported database's ``LIMIT`` and integer
#: columns take, and far more rows than one run should touch.
MAX_COUNT = 2**31 - 1
#: The longest ``--sleep`` between two batches, in seconds: an hour.
MAX_SLEEP = 3600.0
#: The longest ``--max-runtime``, in seconds: a week (leave it out for no limit).
MAX_RUNTIME = 7 * 24 * 3600.0


def count(name: str, value: object) -> int:
    """A whole number from 1 to :data:`MAX_COUNT`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
        raise CommandError(f"{name} must be a whole number from 1 to {MAX_COUNT}, not {value!r}.")
    return value


def seconds(name: str, value: object, *, zero: bool, most: float) -> float:
    """A finite number of seconds up to ``most``, from 0 if ``zero`` is allowed, else above 0.
    ``nan`` fails every comparison, so it is refused with ``inf``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0 <= value <= most
        or (value == 0 and not zero)
    ):
        low = "from 0" if zero else "above 0"
        raise CommandError(f"{name} must be a number of seconds {low} to {most:g}, not {value!r}.")
    return float(value)


def duration(name: str, value: object) -> timedelta:
    """A duration from 0 to the longest the app takes anywhere
    (:data:`~django_idempotency._base.durations.MAX_DURATION`, a thousand years): ``90``, ``90s``,
    ``15m``, ``2h``, ``1d``."""
    try:
        parsed = durations.parse(value, name)
    except (TypeError, ValueError):
        parsed = None
    if parsed is None or parsed < timedelta(0):
        raise CommandError(
            f"{name} must be a duration from 0 to {durations.MAX_DURATION.days} days, such as "
            f"90, 90s, 15m, 2h or 1d, not {value!r}."
        )
    return parsed


#: What argparse takes for a negative number, and more: ``-5m``, ``-1e9``, ``-inf``.
_NEGATIVE = re.compile(r"-(\d|\.\d|inf|nan)", re.IGNORECASE)


def negative_values_joined(argv: Sequence[str], options: Collection[str]) -> list[str]:
    """``argv`` with each of ``options`` followed by a negative-looking value joined to it
    (``--older-than -5m`` becomes ``--older-than=-5m``).

    argparse takes ``-5m`` for an option and says only "expected one argument"; joined, the
    value reaches the command's own check, which says what range it must be in.
    """
    joined: list[str] = []
    index = 0
    while index < len(argv):
        token = argv[index]
        following = argv[index + 1] if index + 1 < len(argv) else ""
        if token in options and _NEGATIVE.match(following):
            joined.append(f"{token}={following}")
            index += 2
        else:
            joined.append(token)
            index += 1
    return joined


class Command(BaseCommand):
    """A command whose options in :attr:`numeric` may be given a negative-looking value."""

    #: The options taking a value that may start with ``-``: the command refuses a negative
    #: one itself, naming the range, rather than argparse taking it for an option.
    numeric: tuple[str, ...] = ()

    def run_from_argv(self, argv: list[str]) -> None:
        super().run_from_argv(negative_values_joined(argv, self.numeric))

    def execute(self, *args: Any, **options: Any) -> str | None:
        """Under ``--verbosity 0``, print nothing: the app's own log lines (an erasure, a
        released record) too, which reach stderr through Python's last resort when the project
        configures no logging for them; a configured handler still gets them."""
        logger = logging.getLogger("django_idempotency")
        if options.get("verbosity", 1) >= 1 or logger.hasHandlers():
            return super().execute(*args, **options)
        quiet = logging.NullHandler()
        logger.addHandler(quiet)
        try:
            return super().execute(*args, **options)
        finally:
            logger.removeHandler(quiet)
