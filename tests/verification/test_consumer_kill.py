"""The nemesis's ``consumer-kill`` against a ledger folder written by hand (no servers): a kill
comes once the Celery worker has been ready its drawn time, and a ready note is the worker's
own only if written after it was started (the kernel's pids wrap within a long run)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.verification import run

PID = 4242


def runner(folder: Path, started: float) -> run.Run:
    consumer = SimpleNamespace(pid=PID)
    servers: Any = SimpleNamespace(folder=folder, helpers={"consumer": consumer},
                                   started={"consumer": started})  # fmt: skip
    return run.Run(servers, [], [], seconds=1.0, seed=1)


def ready(folder: Path, t: float) -> None:
    with (folder / "consumer-ready.jsonl").open("a") as notes:
        notes.write(json.dumps({"pid": PID, "t": t}) + "\n")


def test_the_kills_are_drawn_as_times_of_work_once_ready() -> None:
    faults = run.consumer_faults(21, 120, "database")
    assert faults and all(4 <= fault.after_ready <= 12 for fault in faults)
    # The seed's draws are what they were: the nominal times are the gaps' sums.
    assert [fault.at for fault in faults] == pytest.approx(
        [sum(f.after_ready for f in faults[: i + 1]) for i in range(len(faults))], abs=0.01
    )


def test_a_kill_waits_for_the_worker_to_have_been_ready_its_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = time.time()
    ready(tmp_path, now)
    monkeypatch.setattr(run, "newest", lambda folder, pattern: time.time())  # a task mid-work
    assert runner(tmp_path, started=now - 1).consumer_busy(0.4, now + 60) == (True, True)
    assert time.time() >= now + 0.4


def test_a_kill_whose_time_of_work_ends_after_the_run_is_not_waited_for(tmp_path: Path) -> None:
    now = time.time()
    ready(tmp_path, now)
    assert runner(tmp_path, started=now - 1).consumer_busy(10, now + 5) is None
    assert time.time() < now + 5


def test_a_dead_workers_ready_note_under_the_same_pid_is_not_the_new_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = time.time()
    ready(tmp_path, now - 30)  # an earlier worker that had this pid
    monkeypatch.setattr(run, "CONSUMER_READY_WAIT", 0.2)
    assert runner(tmp_path, started=now).consumer_ready() is None
    ready(tmp_path, now + 0.1)
    assert runner(tmp_path, started=now).consumer_ready() == pytest.approx(now + 0.1)
