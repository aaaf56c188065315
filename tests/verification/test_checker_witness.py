"""The faults a server process sees of its own (witness.py): a result it could not store, and
a pause of the whole process. An hour's soaks found five double runs on PostgreSQL and SQLite
and one on the Redis store that were SPEC 4a's window, each an owner that logged "Could not
store the result" (its database silent until its lock could lapse under a load of 20) or
whose process stood still 2.8 s, and the checker, knowing neither, called them violations."""

from __future__ import annotations

import inspect
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from django_idempotency._call import writing
from tests.verification import checker, witness

LIMITS = checker.Limits(lock=3, ttl={"plain": 3600})
WHO = {"principal": "alice", "key": "k", "entry": "plain", "body": "b"}
ROOT = Path(__file__).resolve().parents[2]


def done(op: str, t: float, execution: str, *, replayed: bool) -> dict[str, Any]:
    return {"type": "complete", "op": op, "t": t, "status": 201, "response": f"r-{execution}",
            "replayed": replayed, "execution": execution, "as": "alice"}  # fmt: skip


def runs_twice(*faults: dict[str, Any], replayed_at: float | None = None) -> list[dict[str, Any]]:
    """x1 ran at 10 s and was answered (unstored, or not); a retry ran x2 at 14 s."""
    history: list[dict[str, Any]] = [
        {"type": "invoke", "op": "op1", "t": 9.9, **WHO},
        {"type": "effect", "t": 10.0, "execution": "x1", "pid": 1, **WHO},
        done("op1", 10.5, "x1", replayed=False),
        *({"type": "fault", "observed": True, **fault} for fault in faults),
    ]
    if replayed_at is not None:
        history += [
            {"type": "invoke", "op": "op9", "t": replayed_at - 0.1, **WHO},
            done("op9", replayed_at, "x1", replayed=True),
        ]
    return [
        *history,
        {"type": "invoke", "op": "op2", "t": 13.9, **WHO},
        {"type": "effect", "t": 14.0, "execution": "x2", "pid": 2, **WHO},
        done("op2", 14.1, "x2", replayed=False),
    ]


def found(history: list[dict[str, Any]]) -> tuple[set[int], list[str]]:
    result = checker.check(history, LIMITS)
    return {v["invariant"] for v in result.violations}, [w["fault"]["kind"] for w in result.windows]


def unstored(*executions: str) -> dict[str, Any]:
    return {"kind": checker.UNSTORED, "pid": 1, "start": 10.0, "end": 13.0, "long": True,
            "executions": list(executions), "record": "7"}  # fmt: skip


def test_a_result_its_owner_could_not_store_is_a_window() -> None:
    assert found(runs_twice()) == ({1, 2}, [])
    assert found(runs_twice(unstored("x1"))) == (set(), [checker.UNSTORED])


def test_another_executions_unstored_result_excuses_nothing() -> None:
    assert 1 in found(runs_twice(unstored("x0")))[0]


def test_an_unstored_result_excuses_nothing_once_a_replay_showed_it_stored() -> None:
    assert 1 in found(runs_twice(unstored("x1"), replayed_at=12.0))[0]


def pause(pid: int, start: float, seconds: float) -> dict[str, Any]:
    return {"kind": "worker-pause", "pid": pid, "start": start, "end": start + seconds,
            "duration": seconds, "long": seconds >= LIMITS.lock * 2 / 3}  # fmt: skip


def test_a_pause_of_the_owners_process_past_its_lock_is_a_window() -> None:
    assert found(runs_twice(pause(1, 10.2, 2.8))) == (set(), ["worker-pause"])


@pytest.mark.parametrize(
    "fault", [pause(1, 10.2, 1.2), pause(3, 10.2, 2.8)], ids=["too-short", "another-worker"]
)
def test_a_short_pause_or_another_workers_excuses_nothing(fault: dict[str, Any]) -> None:
    assert 1 in found(runs_twice(fault))[0]


def test_the_app_logs_what_the_witness_listens_for() -> None:
    assert witness.UNSTORED in inspect.getsource(writing._not_stored)


def test_an_unstored_result_is_recorded_with_its_requests_executions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IDEMPOTENCY_VERIFY_LEDGER", str(tmp_path))
    monkeypatch.setitem(witness._watching, "pid", os.getpid())  # no watcher in pytest's process
    logger = logging.getLogger("django_idempotency")

    def view(request: object) -> None:  # two effects, then the decorator's failed write
        witness.ran("x1")
        witness.ran("x2")
        logger.error(witness.UNSTORED + " %s: %s.", 7, "the database did not answer")

    handler = witness.Unstored()
    logger.addHandler(handler)
    try:
        witness.attempts(view)(None)
        witness.attempts(lambda request: logger.error("Something else %s", 8))(None)
    finally:
        logger.removeHandler(handler)
    effects = [{"execution": "x1", "t": 5.0}, {"execution": "x2", "t": 6.0}]
    [fault] = [f for f in witness.observed(tmp_path, effects) if f["kind"] == checker.UNSTORED]
    assert (fault["executions"], fault["record"], fault["start"]) == (["x1", "x2"], "7", 5.0)
    assert fault["pid"] == os.getpid() and fault["end"] > 5.0


def test_a_stopped_process_records_its_pause(tmp_path: Path) -> None:
    """A process SIGSTOPped 2 s (as a loaded machine may leave one) says so when it runs."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; from tests.verification import witness; "
         "witness._watch(); time.sleep(30)"],
        cwd=ROOT, env={**os.environ, "IDEMPOTENCY_VERIFY_LEDGER": str(tmp_path),
                       "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        time.sleep(1.0)
        child.send_signal(signal.SIGSTOP)
        time.sleep(2.0)
        child.send_signal(signal.SIGCONT)
        deadline = time.time() + 10
        while not list(tmp_path.glob("pauses-*.jsonl")) and time.time() < deadline:
            time.sleep(0.1)
    finally:
        child.kill()
        child.wait()
    [fault] = witness.observed(tmp_path, [])
    assert fault["kind"] == "worker-pause" and fault["pid"] == child.pid
    assert 1.8 <= fault["duration"] < 5 and fault["long"]


SLOW = {"kind": checker.OVERLOAD, "start": 20.0, "end": 51.0, "duration": 31.0, "long": False}


def test_an_overloaded_server_excuses_a_request_left_unanswered_not_a_double_run() -> None:
    """run.py's pulse waited 31 s for ``/health/``: a request given up on then was the
    machine's load, not a worker that hung; a double run in that time is still one."""
    unanswered = [
        {"type": "invoke", "op": "op3", "t": 20.5, **WHO},
        {"type": "complete", "op": "op3", "t": 50.5, "status": None, "error": "ReadTimeout"},
    ]
    assert found(unanswered) == ({8}, [])
    assert found([*unanswered, {"type": "fault", "observed": True, **SLOW}]) == (set(), [])
    assert 1 in found(runs_twice({**SLOW, "start": 9.0}))[0]


def lost(execution: str, lapsed: float = 0.6) -> dict[str, Any]:
    return {"kind": checker.LOST, "pid": 1, "start": 10.0, "end": 13.0, "long": lapsed > 0,
            "executions": [execution], "record": "7", "lapsed": lapsed}  # fmt: skip


@pytest.mark.parametrize("late", ["x1", "x2"], ids=["before-the-takeover", "after-it"])
def test_an_owner_that_lost_its_lapsed_lock_is_a_window(late: str) -> None:
    """A MariaDB soak's owner whose renewals failed for seconds under a load of 60 learnt its
    lock was taken, and its view's second step ran after the taker's: either run of a late
    owner is the window's, even once a replay showed the taker's result stored."""
    assert found(runs_twice(lost(late))) == (set(), [checker.LOST])
    assert found(runs_twice(lost(late), replayed_at=13.5))[1] == [checker.LOST]


@pytest.mark.parametrize(
    "fault", [lost("x1", lapsed=-1.5), lost("x0")], ids=["still-held", "another-execution"]
)
def test_a_lock_taken_while_held_or_anothers_loss_excuses_nothing(fault: dict[str, Any]) -> None:
    assert 1 in found(runs_twice(fault))[0]


def test_a_lost_lock_is_recorded_at_its_requests_end_with_every_execution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The app's renewer announces the loss (``lock_lost``, from its own thread, with no
    request for an ``idempotent_function`` called in a view: a SQLite soak's loss was written
    with no execution); the claim, made in the request, names its executions, and the line
    waits for the request's end, for its later effects."""
    from types import SimpleNamespace

    from django_idempotency import key_claimed, lock_lost
    from django_idempotency._call import heartbeat
    from django_idempotency._call.claim import Claim

    monkeypatch.setenv("IDEMPOTENCY_VERIFY_LEDGER", str(tmp_path))
    monkeypatch.setitem(witness._watching, "pid", os.getpid())
    holder = SimpleNamespace(key="k", scope="s", key_hash="h")
    claim = Claim(holder, 7, "t", 1, "", None, "default", timedelta(seconds=3))  # type: ignore[arg-type]
    claim.held_until = time.monotonic() - 0.5  # its last renewal held it until half a second ago

    def view(request: object) -> None:
        key_claimed.send(None, claim=claim, request=None)  # as the lifecycle sends it
        witness.ran("x1")
        renewer = threading.Thread(target=heartbeat._announce_lost,
                                   args=(heartbeat._Lease(claim, None),))  # fmt: skip
        renewer.start()
        renewer.join()
        assert not list(tmp_path.glob("lost-*.jsonl"))  # not before the request's end
        witness.ran("x2")

    key_claimed.connect(witness.claimed, dispatch_uid="verification-claimed")
    lock_lost.connect(witness.lost, dispatch_uid="verification-lost")
    witness.attempts(view)(SimpleNamespace())
    effects = [{"execution": "x1", "t": 5.0}, {"execution": "x2", "t": 6.0}]
    [fault] = witness.observed(tmp_path, effects)
    assert (fault["kind"], fault["record"]) == (checker.LOST, "7")
    assert fault["executions"] == ["x1", "x2"]
    assert fault["long"] and 0.5 <= fault["lapsed"] < 5 and fault["start"] == 5.0


def short_ttl_taken_over(later: float) -> list[dict[str, Any]]:
    """A MariaDB soak's ``/short-ttl/`` key (6 s TTL, 3 s lock), seconds from its first
    request: x0's result unstored under a 5.3 s blackhole; x1 took the record over at 6.0 s
    and was replayed at 6.4 s; a request at ``later`` ran x2."""
    who = {**WHO, "entry": "short-ttl"}
    unstored_x0 = {**unstored("x0"), "start": 0.2, "end": 6.2}
    blackhole = {"kind": "db-blackhole", "start": 0.3, "end": 5.7, "long": True}
    return [
        {"type": "invoke", "op": "op1", "t": 0.0, **who},
        {"type": "effect", "t": 0.2, "execution": "x0", "pid": 1, **who},
        *({"type": "fault", "observed": True, **fault} for fault in (blackhole, unstored_x0)),
        {"type": "invoke", "op": "op2", "t": 0.6, **who},
        {"type": "effect", "t": 6.0, "execution": "x1", "pid": 2, **who},
        done("op1", 6.2, "x1", replayed=False),
        done("op2", 6.4, "x1", replayed=True),
        {"type": "invoke", "op": "op3", "t": later - 1.0, **who},
        {"type": "effect", "t": later, "execution": "x2", "pid": 2, **who},
        done("op3", later + 0.2, "x2", replayed=False),
    ]


def test_a_takeover_past_the_ttl_of_the_keys_first_request_keeps_its_life() -> None:
    """x1 may be the takeover it was (the record lived until x0's TTL, past x1) rather than a
    new life's claim, and its lock held the record to 9.0 s: x2 at 9.6 s began a new life.
    Counted from a new life at x1, x2 was a double run (invariants 1 and 2)."""
    limits = checker.Limits(lock=3, ttl={"short-ttl": 6})
    result = checker.check(short_ttl_taken_over(9.6), limits)
    assert result.violations == []
    assert [w["fault"]["kind"] for w in result.windows] == [checker.UNSTORED]


def test_a_run_past_the_ttl_is_a_takeover_only_where_a_fault_let_the_life_lapse() -> None:
    """Without the unstored result (nothing let x0's lock lapse), x1 began a new life at the
    TTL's end, and x2 ran in it: a double run."""
    limits = checker.Limits(lock=3, ttl={"short-ttl": 6})
    history = [e for e in short_ttl_taken_over(9.6) if e["type"] != "fault"]
    found = checker.check(history, limits).violations
    assert {v["invariant"] for v in found} == {1, 2}


def frozen_store_claims(born: float | None) -> list[dict[str, Any]]:
    """A Redis-store soak's ``/short-ttl/`` key (6 s TTL, 3 s lock), seconds from its first
    request: the store stopped from -0.7 s to 3.4 s, and every request in it answered ``503``,
    one claim of theirs made as the store thawed (born at 3.4 s); x1 took that record over at
    6.5 s, as its lock lapsed, and was replayed; the record expired at 9.4 s, and a request at
    9.8 s ran x2 in a new life. ``born``: what x1's line says of its record."""
    who = {**WHO, "entry": "short-ttl"}
    stop = {"kind": "redis-stop", "start": -0.7, "end": 3.4, "long": True}
    x1 = {"type": "effect", "t": 6.5, "execution": "x1", "pid": 2, **who}
    return [
        {"type": "fault", **stop},
        {"type": "invoke", "op": "op1", "t": 0.0, **who},
        {"type": "complete", "op": "op1", "t": 1.0, "status": 503, "replayed": False},
        {"type": "invoke", "op": "op2", "t": 6.4, **who},
        {**x1, **({} if born is None else {"born": born})},
        done("op2", 6.8, "x1", replayed=False),
        {"type": "invoke", "op": "op3", "t": 6.9, **who},
        done("op3", 7.0, "x1", replayed=True),
        {"type": "invoke", "op": "op4", "t": 9.8, **who},
        {"type": "effect", "t": 10.0, "execution": "x2", "pid": 2, **who},
        done("op4", 10.2, "x2", replayed=False),
    ]


def test_a_takeover_bounds_its_life_by_its_records_birth() -> None:
    """x1's record was born at 3.4 s: it expired at 9.4 s, and x2 is a new life's. Without
    ``born`` the checker took x1 for a new record (the key's first request's TTL had passed),
    born at the earliest as x1's own request came (6.4 s), and x2 in its life: a double run."""
    limits = checker.Limits(lock=3, ttl={"short-ttl": 6})
    assert checker.check(frozen_store_claims(3.4), limits).violations == []
    found = checker.check(frozen_store_claims(None), limits).violations
    assert {v["invariant"] for v in found} == {1, 2}


def test_a_birth_before_the_bound_widens_no_life() -> None:
    """A ``born`` whose record had expired before the run (0.5 s, its TTL over at 6.5 s) is no
    record the run took over: it changes nothing, and x2 is still a double run."""
    limits = checker.Limits(lock=3, ttl={"short-ttl": 6})
    found = checker.check(frozen_store_claims(0.5), limits).violations
    assert {v["invariant"] for v in found} == {1, 2}
