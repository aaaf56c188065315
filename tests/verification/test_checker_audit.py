"""Histories written by hand in which the app breaks its promise and the checker must say so:
a double run, or a replay, that no fault explains must not pass as SPEC 4a's window."""

from __future__ import annotations

from typing import Any

from tests.verification import checker

LIMITS = checker.Limits(lock=3, ttl={"plain": 3600})
WHO = {"principal": "alice", "key": "k", "entry": "plain", "body": "b"}


def answer(op: str, t: float, execution: str, *, replayed: bool, status: int = 201,
           response: str | None = None) -> dict[str, Any]:  # fmt: skip
    return {"type": "complete", "op": op, "t": t, "status": status,
            "response": response or f"r-{execution}", "replayed": replayed,
            "execution": execution, "as": "alice"}  # fmt: skip


def invariants(history: list[dict[str, Any]]) -> set[int]:
    return {v["invariant"] for v in checker.check(history, LIMITS).violations}


def test_a_fault_after_the_first_answer_excuses_no_second_run() -> None:
    """x1 ran, stored and answered at 10 s; its worker's next request was SIGKILLed at 30 s
    (or the database restarted for 5 s): the record was complete long before, and a retry
    that runs the view again at 40 s is a lost result, not a window."""
    for fault in (
        {"kind": "worker-kill", "pid": 1, "start": 30.0, "end": 30.1},
        {"kind": "db-restart", "start": 30.0, "end": 35.0},
    ):
        history = [
            {"type": "invoke", "op": "op1", "t": 9.9, **WHO},
            {"type": "effect", "t": 10.0, "execution": "x1", "pid": 1, **WHO},
            answer("op1", 10.1, "x1", replayed=False),
            {"type": "fault", "long": False, **fault},
            {"type": "invoke", "op": "op2", "t": 39.9, **WHO},
            {"type": "effect", "t": 40.0, "execution": "x2", "pid": 2, **WHO},
            answer("op2", 40.1, "x2", replayed=False),
        ]
        assert 1 in invariants(history), fault["kind"]


def test_one_window_excuses_no_later_run() -> None:
    """x1's worker killed under it (a window: x2 takes the record over and is answered at
    14 s); a retry at 100 s runs the view a third time, with no fault near it."""
    history = [
        {"type": "invoke", "op": "op1", "t": 9.9, **WHO},
        {"type": "effect", "t": 10.0, "execution": "x1", "pid": 1, **WHO},
        {"type": "fault", "kind": "worker-kill", "pid": 1, "start": 10.5, "end": 10.6,
         "long": False},  # fmt: skip
        {"type": "complete", "op": "op1", "t": 10.6, "status": None, "error": "ReadError"},
        {"type": "invoke", "op": "op2", "t": 13.9, **WHO},
        {"type": "effect", "t": 14.0, "execution": "x2", "pid": 2, **WHO},
        answer("op2", 14.1, "x2", replayed=False),
        {"type": "invoke", "op": "op3", "t": 99.9, **WHO},
        {"type": "effect", "t": 100.0, "execution": "x3", "pid": 2, **WHO},
        answer("op3", 100.1, "x3", replayed=False),
        {"type": "invoke", "op": "op4", "t": 109.9, **WHO},
        answer("op4", 110.0, "x3", replayed=True),
    ]
    result = checker.check(history, LIMITS)
    assert {v["invariant"] for v in result.violations} & {1, 2, 5}, result.windows


def test_a_replay_with_another_status_is_not_the_first_answer() -> None:
    """The replay's body is the first answer's, its status is not (201, then 200): not the
    stored answer byte for byte."""
    history = [
        {"type": "invoke", "op": "op1", "t": 9.9, **WHO},
        {"type": "effect", "t": 10.0, "execution": "x1", "pid": 1, **WHO},
        answer("op1", 10.1, "x1", replayed=False, status=201, response="r"),
        {"type": "invoke", "op": "op2", "t": 11.9, **WHO},
        answer("op2", 12.0, "x1", replayed=True, status=200, response="r"),
    ]
    assert 2 in invariants(history)
