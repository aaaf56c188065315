"""The checker's reading of a failover, on histories written by hand (no servers): a result
answered before the primary died must be on the promoted standby, so a second run after it is
no window (nor after any other fault); one still unanswered when it died may be run again, as
under any fault longer than the lock. Violations of a lost write's kinds name their failover."""

from __future__ import annotations

from typing import Any

import pytest

from tests.verification import checker

LIMITS = checker.Limits(lock=3, ttl={"plain": 3600})


def history(fault: dict[str, Any]) -> list[dict[str, Any]]:
    """alice's request run and answered at 10.5 s, the fault, then her retry at 13 s run
    again and answered anew."""
    who = {"principal": "alice", "key": "k", "entry": "plain"}
    return [
        {"type": "invoke", "op": "op1", "t": 9.9, "body": "b", **who},
        {"type": "effect", "t": 10.0, "body": "b", "execution": "x1", "pid": 1, **who},
        {"type": "complete", "op": "op1", "t": 10.5, "status": 201, "response": "r1",
         "replayed": False, "execution": "x1", "as": "alice"},
        {"type": "fault", "long": True, **fault},
        {"type": "invoke", "op": "op2", "t": 13.0, "body": "b", **who},
        {"type": "effect", "t": 13.1, "body": "b", "execution": "x2", "pid": 2, **who},
        {"type": "complete", "op": "op2", "t": 13.5, "status": 201, "response": "r2",
         "replayed": False, "execution": "x2", "as": "alice"},
    ]  # fmt: skip


def test_a_failover_after_the_answer_opens_no_window() -> None:
    failover = {"kind": "db-failover", "mode": "async", "start": 11.0, "end": 12.0}
    result = checker.check(history(failover), LIMITS)
    assert result.windows == []
    assert {v["invariant"] for v in result.violations} == {1, 2}
    assert all(v["failover"]["kind"] == "db-failover" for v in result.violations)


@pytest.mark.parametrize("kind", ["db-failover", "db-restart"])
def test_a_fault_before_the_answer_opens_a_window(kind: str) -> None:
    fault = {"kind": kind, "mode": "sync", "start": 10.2, "end": 12.0}
    result = checker.check(history(fault), LIMITS)
    assert result.violations == []
    assert [window["fault"]["kind"] for window in result.windows] == [kind]


def test_a_restart_after_the_answer_opens_no_window() -> None:
    """Any fault is read this way: a restart loses no stored result, and carries no
    ``failover``."""
    result = checker.check(history({"kind": "db-restart", "start": 11.0, "end": 12.0}), LIMITS)
    assert result.windows == []
    assert {v["invariant"] for v in result.violations} == {1, 2}
    assert not any("failover" in v for v in result.violations)


def test_a_worker_stopped_before_its_view_ran_is_a_late_owner() -> None:
    """A worker SIGSTOPped between its claim and its view, longer than the lock: a retry takes
    the record over and runs the view, and the stopped worker runs it too once it resumes,
    after the taker (SPEC 4a's window; found by an asynchronous failover's run, seed 3)."""
    who = {"principal": "alice", "key": "k", "entry": "plain", "body": "b"}
    events = [
        {"type": "invoke", "op": "op1", "t": 14.3, **who},
        {"type": "fault", "kind": "worker-stop", "pid": 1, "long": True, "start": 15.8,
         "end": 21.9},
        {"type": "invoke", "op": "op2", "t": 20.1, **who},
        {"type": "effect", "t": 20.2, "execution": "x2", "pid": 2, **who},
        {"type": "complete", "op": "op2", "t": 20.4, "status": 201, "response": "r2",
         "replayed": False, "execution": "x2", "as": "alice"},
        {"type": "effect", "t": 21.9, "execution": "x1", "pid": 1, **who},
        {"type": "complete", "op": "op1", "t": 22.1, "status": 201, "response": "r1",
         "replayed": False, "execution": "x1", "as": "alice"},
    ]  # fmt: skip
    result = checker.check(events, LIMITS)
    assert result.violations == []
    assert [window["fault"]["kind"] for window in result.windows] == ["worker-stop"]
