"""The checker must be able to fail: each plant found by its invariant from a fixed seed, and a
clean run on each database and store finds nothing (.ci/leg-verify; ``IDEMPOTENCY_VERIFY=1``;
the leg runs two halves of about the same length side by side)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.verification.plants import PLANTS

pytestmark = pytest.mark.verification

ROOT = Path(__file__).resolve().parents[2]
#: Seed and seconds of each plant's run, found there on a loaded 2-core machine: seed 9's first
#: 15 s hold three outbox bodies that fail once and ten views working past their lock. A late
#: owner's unfenced write shows only when a long stop lands on a working view and a replay
#: falls between the two writes, which takes a longer run.
PLANT_RUNS = {plant: (2, 15) for plant in PLANTS} | {
    "release-on-failure": (9, 15),
    "no-renewal": (9, 15),
    "no-fencing": (2, 30),
}
#: Short runs keep the leg near 5 minutes with four databases and stores and six plants.
CLEAN_SECONDS = 15


def known(summary: dict[str, Any]) -> bool:
    """Whether every ``500`` of the run is the open finding of docs/verification.rst: a DRF
    function view (``@api_view`` above ``@idempotent``) meeting a database fault in DRF's own
    authentication, before ``@idempotent`` runs, answers Django's ``500``, where the mixin
    answers ``503``."""
    log = Path(summary["server_log"]).read_text(errors="replace")
    errors = re.split(r"(?m)^\S+ \S+ \d+ ERROR django.request: Internal Server Error: ", log)[1:]
    return bool(errors) and all(
        error.startswith(("/function/", "/function-policy/")) and "perform_authentication" in error
        for error in errors
    )


def run(tmp_path: Path, *arguments: str) -> tuple[int, dict[str, Any]]:
    """``IDEMPOTENCY_VERIFY_HISTORIES`` (a folder) keeps the histories and server logs."""
    folder = Path(os.environ.get("IDEMPOTENCY_VERIFY_HISTORIES") or tmp_path)
    name = "-".join(argument.lstrip("-") for argument in arguments)
    result = subprocess.run(
        [sys.executable, "tests/verification/run.py", "--history",
         str(folder / f"{name}.jsonl"), *arguments],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    lines = result.stdout.strip().splitlines()
    assert lines, f"run.py printed nothing:\n{result.stderr[-4000:]}"
    summary = json.loads(lines[-1])
    print(json.dumps({k: v for k, v in summary.items() if k not in ("windows", "violations")}))
    return result.returncode, summary


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_plant_is_found(tmp_path: Path, plant: str) -> None:
    seed, seconds = PLANT_RUNS[plant]
    status, summary = run(
        tmp_path, "--seconds", str(seconds), "--seed", str(seed), "--plant", plant
    )
    found = {violation["invariant"] for violation in summary["violations"]}
    assert status == 1, summary
    assert PLANTS[plant] in found, (plant, found)


@pytest.mark.parametrize(
    ("database", "store", "seed"),
    [
        ("sqlite", "database", 2),
        ("postgresql", "database", 3),
        ("mariadb", "database", 3),
        ("sqlite", "redis", 1),
    ],
)
def test_clean_run(tmp_path: Path, database: str, store: str, seed: int) -> None:
    _, summary = run(tmp_path, "--seconds", str(CLEAN_SECONDS), "--seed", str(seed),
                          "--database", database, "--store", store)  # fmt: skip
    found = [
        violation
        for violation in summary["violations"]
        if not (violation["invariant"] == 8 and violation["what"] == "answered 500"
                and known(summary))
    ]  # fmt: skip
    assert found == [], json.dumps(found, indent=1)[:20000]
    assert summary["requests"] > 100
