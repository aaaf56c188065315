"""The example project's long-running export (issue 43): the curl session of
docs/operations.rst, run as written against the example on a fresh database, prints what the
page says (as tests/test_example_project.py runs the README's)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_example_project import (
    ROOT,
    TRIMMED,
    Exchange,
    console_session,
    run_curl,
    same_status,
    serve,
)

PAGE = ROOT / "docs" / "operations.rst"
OPERATION_ID = re.compile(r"1\.[A-Za-z0-9_-]{22}")


def docs_session() -> list[Exchange | float]:
    """The page's example session: each ``$ curl`` with what it prints, and each ``$ sleep``."""
    return console_session(PAGE.read_text().split(".. _operations-example:")[1].splitlines())


def test_the_export_session_prints_what_the_docs_say(tmp_path: Path) -> None:
    if shutil.which("curl") is None:
        pytest.skip("needs curl, which the session runs")
    session = docs_session()
    assert len([step for step in session if isinstance(step, Exchange)]) == 5
    # The operation id is the record's primary key and a MAC of its life (created_at): the
    # page's stands for the one the first answer names, wherever it appears.
    shown_id = session[0].headers["location"].rsplit("/", 1)[1]  # type: ignore[union-attr]
    assert OPERATION_ID.fullmatch(shown_id)
    with serve(f"sqlite:///{tmp_path / 'db.sqlite3'}", tmp_path / "runserver.log") as (url, _):
        actual = shown_id
        for step in session:
            if isinstance(step, float):
                time.sleep(step)
                continue
            observed = run_curl(step.command.replace(shown_id, actual), url)
            # The page's ``sleep`` is a reader's pause: a loaded machine's task may not be
            # done by then, and a client polls again after ``Retry-After``, as this does.
            deadline = time.monotonic() + 60
            while '"succeeded"' in step.body and '"running"' in observed.body:
                assert time.monotonic() < deadline, "the export never finished"
                time.sleep(float(observed.headers.get("retry-after", "1")))
                observed = run_curl(step.command.replace(shown_id, actual), url)
            if actual == shown_id:
                actual = observed.headers["location"].rsplit("/", 1)[1]
                assert OPERATION_ID.fullmatch(actual) and len(actual) == len(shown_id)
            where = f"docs/operations.rst: {step.command}"
            assert same_status(step.status, observed.status), (where, observed.status)
            shown = {k: v for k, v in observed.headers.items() if k not in TRIMMED}
            expected = {k: v.replace(shown_id, actual) for k, v in step.headers.items()}
            assert shown == expected, (where, shown)
            assert observed.body == step.body.replace(shown_id, actual), (where, observed.body)


def test_the_example_schema_publishes_the_export_and_the_status_endpoint() -> None:
    done = subprocess.run(
        [sys.executable, "manage.py", "spectacular", "--validate", "--fail-on-warn"],
        cwd=ROOT,
        capture_output=True,
        timeout=120,
        check=False,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "example_project.settings"},
    )
    assert done.returncode == 0, done.stderr.decode()
    schema = done.stdout.decode()
    assert "/api/idempotency/operations/{operation_id}:" in schema
    assert "/api/exports/:" in schema
