"""Every argument of every command is checked before anything is touched: a value out of its
range is a ``CommandError`` naming the argument and the range, the same on every database
(issue 26 item 5)."""

from __future__ import annotations

import sys
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command, load_command_class
from django.utils import timezone

from django_idempotency import IdempotencyKey
from django_idempotency.management import _arguments as arguments
from tests.factories import IdempotencyKeyFactory

pytestmark = pytest.mark.django_db

COUNT_RANGE = f"must be a whole number from 1 to {arguments.MAX_COUNT}"
HUGE = "99999999999999999999"
BEYOND_BIGINT = "9223372036854775808"


def run(command: str, *args: str, **options: Any) -> str:
    out = StringIO()
    call_command(command, *args, stdout=out, **options)
    return out.getvalue()


@pytest.fixture
def records() -> list[IdempotencyKey]:
    """Two expired records and two stale ones: what a command run by mistake would touch."""
    stale = timezone.now() - timedelta(hours=1)
    return [
        *IdempotencyKeyFactory.create_batch(2, expired=True, completed=True),
        *IdempotencyKeyFactory.create_batch(2, unlock_at=stale),
    ]


def untouched(records: list[IdempotencyKey]) -> bool:
    return sorted(IdempotencyKey.objects.values_list("pk", flat=True)) == sorted(
        record.pk for record in records
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sleep", "nan"], "--sleep must be a number of seconds from 0 to 3600, not nan"),
        (["--sleep", "inf"], "--sleep must be a number of seconds from 0 to 3600, not inf"),
        (["--sleep", "-0.5"], "--sleep must be a number of seconds from 0 to 3600"),
        (["--sleep", "3601"], "--sleep must be a number of seconds from 0 to 3600"),
        (["--max-runtime", "nan"], "--max-runtime must be a number of seconds above 0 to 604800"),
        (["--max-runtime", "inf"], "--max-runtime must be a number of seconds above 0"),
        (["--max-runtime", "0"], "--max-runtime must be a number of seconds above 0"),
        (["--max-runtime", "1e300"], "--max-runtime must be a number of seconds above 0"),
        (["--batch-size", HUGE], f"--batch-size {COUNT_RANGE}, not {HUGE}"),
        (["--batch-size", str(arguments.MAX_COUNT + 1)], f"--batch-size {COUNT_RANGE}"),
        (["--batch-size", "0"], f"--batch-size {COUNT_RANGE}"),
        (["--limit", BEYOND_BIGINT], f"--limit {COUNT_RANGE}, not {BEYOND_BIGINT}"),
        (["--limit", "-1"], f"--limit {COUNT_RANGE}"),
        (["--max-batches", HUGE], f"--max-batches {COUNT_RANGE}"),
        (["--max-batches", HUGE, "--dry-run"], f"--max-batches {COUNT_RANGE}"),
    ],
)
def test_cleanup_refuses_values_out_of_range(
    records: list[IdempotencyKey], args: list[str], message: str
) -> None:
    with pytest.raises(CommandError, match=message.replace("+", r"\+")):
        run("idempotency_cleanup", *args)
    assert untouched(records)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"sleep": float("nan")}, "--sleep must be"),
        ({"sleep": True}, "--sleep must be"),
        ({"sleep": "1"}, "--sleep must be"),
        ({"max_runtime": float("-inf")}, "--max-runtime must be"),
        ({"batch_size": 10**20}, "--batch-size must be"),
        ({"batch_size": None}, "--batch-size must be"),
        ({"batch_size": 2.0}, "--batch-size must be"),
        ({"limit": 2**63}, "--limit must be"),
    ],
)
def test_cleanup_refuses_bad_values_from_code(
    records: list[IdempotencyKey], options: dict[str, Any], message: str
) -> None:
    with pytest.raises(CommandError, match=message):
        run("idempotency_cleanup", **options)
    assert untouched(records)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--limit", BEYOND_BIGINT], f"--limit {COUNT_RANGE}, not {BEYOND_BIGINT}"),
        (["--limit", BEYOND_BIGINT, "--release"], f"--limit {COUNT_RANGE}"),
        (["--limit", BEYOND_BIGINT, "--fail"], f"--limit {COUNT_RANGE}"),
        (["--limit", "0", "--release"], f"--limit {COUNT_RANGE}"),
        (["--older-than", "nan", "--release"], "--older-than must be a duration from 0 to 365000"),
        (["--older-than", "inf", "--release"], "--older-than must be a duration from 0"),
        (["--older-than", "999999999d", "--release"], "--older-than must be a duration from 0"),
        (["--older-than", "-5", "--release"], "--older-than must be a duration from 0"),
        (["--older-than=-5m", "--release"], "not '-5m'"),
    ],
)
def test_recover_refuses_values_out_of_range(
    records: list[IdempotencyKey], args: list[str], message: str
) -> None:
    with pytest.raises(CommandError, match=message):
        run("idempotency_recover", *args)
    assert untouched(records)


def test_the_bounds_themselves_are_accepted_by_the_database(
    records: list[IdempotencyKey],
) -> None:
    """The largest values the commands take reach every database's LIMIT without an error."""
    most = str(arguments.MAX_COUNT)
    assert "Would delete 2 " in run("idempotency_cleanup", "--batch-size", most, "--dry-run")
    run("idempotency_recover", "--limit", most, "--older-than", "365000d")
    run("idempotency_recover", "--limit", most, "--release")
    assert IdempotencyKey.objects.count() == 2  # the stale ones released
    run(
        "idempotency_cleanup",
        *("--batch-size", most, "--limit", most, "--max-batches", most),
        *("--sleep", "3600", "--max-runtime", "604800"),
    )
    assert not IdempotencyKey.objects.exists()


# run_from_argv closes the connections when it ends, as manage.py does: not in a test's transaction.
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["idempotency_recover", "--older-than", "-5m"],
            "--older-than must be a duration from 0 to 365000 days, such as 90, 90s, 15m, 2h "
            "or 1d, not '-5m'.",
        ),
        (
            ["idempotency_cleanup", "--sleep", "-1e5"],
            "--sleep must be a number of seconds from 0 to 3600, not -100000.0.",
        ),
        (
            ["idempotency_cleanup", "--max-runtime", "-inf"],
            "--max-runtime must be a number of seconds above 0 to 604800, not -inf.",
        ),
    ],
)
def test_a_negative_value_on_the_command_line_is_named_with_its_range(
    records: list[IdempotencyKey],
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    """argparse takes ``-5m`` for an option ("expected one argument"); the command says what
    is wrong with it instead."""
    command = load_command_class("django_idempotency", argv[0])
    # Without the system checks, which Django 6.1 runs on every database alias (queries a test
    # may not make); what is checked here comes before them anyway.
    with pytest.raises(SystemExit) as exited:
        command.run_from_argv([sys.argv[0], *argv, "--skip-checks"])
    assert exited.value.code == 1
    assert capsys.readouterr().err.strip() == f"CommandError: {message}"
    assert untouched(records)


# --- --verbosity 0 prints nothing (issue 38) ----------------------------------------------------

#: Run in a project that configures no logging for the app, as a newcomer's does: a log line
#: then reaches stderr through Python's last resort.
_QUIET_RUNS = r"""
import contextlib, io, json, sys
from datetime import timedelta
import django
django.setup()
from django.core.management import call_command
from django.utils import timezone
call_command("migrate", verbosity=0)
from tests.factories import IdempotencyKeyFactory
IdempotencyKeyFactory.create_batch(2, completed=True, scope="user:1")
IdempotencyKeyFactory.create_batch(2, expired=True, completed=True)
IdempotencyKeyFactory.create_batch(2, unlock_at=timezone.now() - timedelta(hours=1))
printed = {}
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        call_command(*argv, "--verbosity", "0")
    printed[" ".join(argv)] = out.getvalue() + err.getvalue()
print(json.dumps(printed))
"""


def test_every_command_prints_nothing_at_verbosity_0(tmp_path: Any) -> None:
    import json
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "quiet_settings.py").write_text(
        "from tests.settings import *  # noqa: F403\n"
        "LOGGING = {'version': 1, 'disable_existing_loggers': False}\n"
        "DATABASES = {'default': {'ENGINE': 'django.db.backends.sqlite3', "
        f"'NAME': {str(tmp_path / 'db.sqlite3')!r}}}}}\n"
    )
    runs = [
        ["idempotency_cleanup", "--scope", "user:1", "--dry-run"],
        ["idempotency_cleanup", "--scope", "user:1"],
        ["idempotency_cleanup", "--scope", "user:404"],
        ["idempotency_cleanup", "--dry-run"],
        ["idempotency_cleanup"],
        ["idempotency_recover"],
        ["idempotency_recover", "--release", "--dry-run"],
        ["idempotency_recover", "--fail", "--limit", "1"],
        ["idempotency_recover", "--release"],
        ["idempotency_stats"],
    ]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "quiet_settings",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)]),
    }
    env.pop("DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", _QUIET_RUNS, json.dumps(runs)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    printed = json.loads(done.stdout)
    assert printed == {" ".join(argv): "" for argv in runs}, done.stderr
