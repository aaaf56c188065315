"""The benchmark scripts still run, at toy sizes, so their figures can be reproduced.

They are not timed here (speed goals live in the scripts' own output): a script that breaks
when the code under it changes fails this test instead of the next person who runs it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.server_db

ROOT = Path(__file__).resolve().parents[1]


def run(*command: str) -> str:
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, *command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize(
    ("flags", "options"),
    [
        ([], "Connection OPTIONS: "),
        pytest.param(
            ["--prepared-statements"], "'prepare_threshold': 5", marks=pytest.mark.postgresql
        ),
    ],
)
def test_overhead_benchmark_runs(flags: list[str], options: str) -> None:
    output = run(
        "benchmarks/overhead.py",
        "--server",
        os.environ["DATABASE_URL"],
        "--database",
        f"bench_overhead_smoke_{os.getpid()}",
        "--rounds",
        "3",
        "--no-gunicorn",
        *flags,
    )
    assert options in output
    # The auth query and the claim (one call of the claim function or procedure); a first
    # execution adds the view's INSERT and the stored response.
    assert "two-phase, replay: 2 statements" in output
    assert "two-phase, first execution: 4 statements" in output
    assert "durable commit (an autocommitted INSERT):" in output
    assert "indexed read (a record by scope and key):" in output
    for path, goal in (("two-phase first", "1.70"), ("atomic replay", "1.00")):
        row = rf"{path} +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+ +[+-][\d.]+  <= {goal} (met|MISSED)"
        assert re.search(row, output), path
    # The claim function's (procedure's) call, timed alone.
    assert re.search(r"^  claim \+ write +[\d.]+ ms$", output, re.M)
    row = r"^  two-phase first +[\d.]+  app Python [+-][\d.]+ ms  \(bare \+ claim \+ write\)$"
    assert re.search(row, output, re.M)
    summary = r"^summary (PostgreSQL|MariaDB|MySQL) [\d.]+, .*; atomic replay [\d.]+ \(floor"
    assert re.search(summary, output, re.M)


def test_cleanup_benchmark_runs() -> None:
    output = run(
        "benchmarks/cleanup.py",
        "--url",
        os.environ["DATABASE_URL"],
        "--name",
        f"bench_cleanup_smoke_{os.getpid()}",
        "--rows",
        "2000",
        "--small",
        "200",
        "--rounds",
        "1",
        "--claims",
        "20",
    )
    assert "expired rows left: 0" in output
    assert "cleanup rows per second:" in output
