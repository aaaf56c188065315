"""The ledgers the nemesis never touches: files of JSON lines in the run's folder, appended
and fsynced by the app's processes (the views' effects, the consumer's deliveries) and read by
the run. Nothing here imports Django or Celery."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def deliveries(folder: Path) -> list[dict[str, Any]]:
    """Every delivery the consumer's task started, in no particular order."""
    return read_lines(folder, "deliveries-*.jsonl")


def read_lines(folder: Path, pattern: str) -> list[dict[str, Any]]:
    """Every line of the files ``pattern`` names (``points-*.jsonl``: the recovery points the
    ``/steps/`` views saved), in no particular order."""
    found = []
    for path in sorted(folder.glob(pattern)):
        found += [json.loads(line) for line in path.read_text().splitlines() if line]
    return found


def newest(folder: Path, pattern: str) -> float:
    """The newest time (``t``) among the last lines of the files ``pattern`` names (``0``:
    none yet)."""
    newest = 0.0
    for path in folder.glob(pattern):
        with path.open("rb") as ledger:
            ledger.seek(max(0, path.stat().st_size - 1024))
            lines = ledger.read().splitlines()
        if lines:
            try:
                newest = max(newest, float(json.loads(lines[-1])["t"]))
            except (ValueError, KeyError):  # a line still being written
                continue
    return newest


def append_line(path: Path, line: dict[str, Any]) -> None:
    """One JSON line appended and on disk before the caller goes on: the ledger a fault of the
    app's processes never loses."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
