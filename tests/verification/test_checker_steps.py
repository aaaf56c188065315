"""The checker's reading of recovery points (9, and 1 per step) and of operations a background
task completes (7), on histories written by hand (no servers)."""

from __future__ import annotations

from typing import Any

from tests.verification import checker

LIMITS = checker.Limits(lock=3, ttl={"steps": 3600, "export": 3600})
WHO = {"principal": "alice", "key": "k", "body": "b", "entry": "steps"}
Events = list[dict[str, Any]]


def first(execution: str, t: float, attempt: int, *, pid: int = 1, saved: bool = True) -> Events:
    """A first step, and its recovery point saved (``saved``)."""
    events: Events = [{"type": "effect", "t": t, "execution": execution, "pid": pid, "step": 1,
                       "attempt": attempt, **WHO}]  # fmt: skip
    if saved:
        events.append({"type": "point", "t": t + 0.05, "execution": execution,
                       "attempt": attempt, "pid": pid, **WHO})  # fmt: skip
    return events


def second(execution: str, t: float, attempt: int, built_on: str, *, resumed: bool,
           pid: int = 1) -> Events:  # fmt: skip
    return [{"type": "effect", "t": t, "execution": execution, "pid": pid, "step": 2,
             "attempt": attempt, "first": built_on, "resumed": resumed, **WHO}]  # fmt: skip


def answer(op: str, t: float, execution: str, built_on: str, *, replayed: bool) -> Events:
    return [
        {"type": "invoke", "op": op, "t": t, **WHO},
        {"type": "complete", "op": op, "t": t + 0.5, "status": 201, "response": f"r-{execution}",
         "replayed": replayed, "execution": execution, "as": "alice", "first": built_on},
    ]  # fmt: skip


def found(events: Events) -> list[tuple[int, str]]:
    return [(v["invariant"], v["what"]) for v in checker.check(events, LIMITS).violations]


def test_a_retry_resumed_from_the_point_after_a_failed_attempt() -> None:
    """Attempt 1 ran the first step, saved its point and answered 503; attempt 2 took the
    record over at the point and ran the second step only."""
    events = [
        {"type": "invoke", "op": "op0", "t": 9.9, **WHO},
        {"type": "complete", "op": "op0", "t": 10.2, "status": 503, "response": "x"},
        *first("s1", 10.0, 1),
        *second("s2", 10.6, 2, "s1", resumed=True, pid=2),
        *answer("op1", 10.5, "s2", "s1", replayed=False),
        *answer("op2", 12.0, "s2", "s1", replayed=True),
    ]
    assert found(events) == []


def test_a_first_step_run_again_after_its_saved_point_is_found() -> None:
    """``resume-from-start``'s shape: attempt 2 took the record over at attempt 1's point and
    ran the first step again. A kill of the owner excuses a second run of the view (SPEC 4a),
    never a step before a point that was saved."""
    events = [
        *first("s1", 10.0, 1),
        {
            "type": "fault",
            "kind": "worker-kill",
            "long": True,
            "pid": 1,
            "start": 10.5,
            "end": 10.5,
        },
        *first("s1b", 14.0, 2, pid=2),
        *second("s2", 14.2, 2, "s1b", resumed=False, pid=2),
        *answer("op1", 14.0, "s2", "s1b", replayed=False),
    ]
    assert found(events) == [
        (9, "an effect before a saved recovery point ran again in its record life")
    ]


def test_a_late_owner_running_its_first_step_after_the_takeovers_point_is_a_window() -> None:
    """Attempt 1 claimed and was stopped before its view; attempt 2 took over, ran the first
    step and saved its point; attempt 1 resumed and ran its first step (its point is then
    refused by the fence): SPEC 4a's window, not a point ignored."""
    events = [
        {"type": "fault", "kind": "worker-stop", "long": True, "pid": 1, "start": 9.0, "end": 15.0},
        *first("s1b", 13.0, 2, pid=2),
        *second("s2", 13.2, 2, "s1b", resumed=False, pid=2),
        *first("s1", 15.1, 1, saved=False),
        *answer("op1", 13.3, "s2", "s1b", replayed=False),
    ]
    result = checker.check(events, LIMITS)
    assert result.violations == []
    assert len(result.windows) == 1


def test_a_second_step_on_no_first_step_of_its_life_is_found() -> None:
    events = [*first("s1", 10.0, 1), *second("s2", 10.6, 2, "elsewhere", resumed=True)]
    assert found(events) == [(9, "a second step built on no first step of its record life")]


def test_an_answer_naming_another_first_step_is_found() -> None:
    events = [
        *first("s1", 10.0, 1),
        *second("s2", 10.6, 1, "s1", resumed=False),
        *answer("op1", 9.9, "s2", "s0", replayed=False),
    ]
    assert found(events) == [(9, "an answer names steps that did not run together")]


def exported(state: str | None, status: int = 200) -> Events:
    """bob's export: its 202 with the operation's URL, its final answer replayed (the
    completion's), and the final polls."""
    who = {"principal": "bob", "key": "e", "body": "b", "entry": "export"}
    poll = {"type": "poll", "operation": "/op/1", "owner": "bob", "final": True}
    return [
        {"type": "effect", "t": 1.0, "execution": "x1", "pid": 1, "message": "m1", **who},
        {"type": "invoke", "op": "op1", "t": 0.9, **who},
        {"type": "complete", "op": "op1", "t": 1.1, "status": 202, "location": "/op/1",
         "replayed": False, "response": "a"},
        {"type": "invoke", "op": "op2", "t": 3.0, **who},
        {"type": "complete", "op": "op2", "t": 3.1, "status": 201, "response": "r",
         "replayed": True, "execution": "x1", "as": "bob"},
        {"type": "delivery", "t": 1.5, "message": "m1", "args": ["x1"], "pid": 9},
        {"type": "consumed", "t": 1.6, "message": "m1", "execution": "x1"},
        {**poll, "t": 9.0, "principal": "bob", "status": status, "state": state,
         "execution": "x1" if state == "succeeded" else None},
        {**poll, "t": 9.0, "principal": "alice", "status": 404},
    ]  # fmt: skip


def test_an_operation_its_task_completed_is_succeeded() -> None:
    assert found(exported("succeeded")) == []


def test_an_operation_its_task_never_completed_is_found() -> None:
    """``completion-dropped``'s shape: its client was answered the completion (here: a lost
    one would leave it unsettled too), and the operation still runs."""
    assert found(exported("running")) == [
        (7, "an operation its task completes is running after every key settled")
    ]
    assert found(exported("stalled")) == [
        (7, "an operation its task completes is stalled after every key settled")
    ]


def test_an_operation_released_and_claimed_anew_is_another() -> None:
    """Its record released (its view raised) and claimed anew: the id it gave names
    nothing (``404``), as any operation's."""
    assert found(exported(None, status=404)) == []


def test_a_life_begun_at_the_ttls_end_is_one_life() -> None:
    """A key's record expired after an hour, and a request of another story claimed it anew:
    its two steps are one life, though the first life's retry came a second after that life
    began (taken for the new life's claim, it split the new life in two: an hour's soak)."""
    events = [
        *answer("o1", 0.0, "e1", "f1", replayed=False),
        *answer("o2", 1.4, "e1", "f1", replayed=True),
        *first("f1", 1.6, 1),
        *second("e1", 1.9, 1, "f1", resumed=False),
        *answer("o3", 3616.3, "e2", "f2", replayed=False),
        *first("f2", 3616.5, 1),
        *second("e2", 3616.6, 1, "f2", resumed=False),
    ]
    assert found(events) == []


def test_a_double_run_just_after_the_ttls_end_is_found() -> None:
    """Two first steps of one new life, 0.4 s apart, an hour after the key's first life: one
    life, so a double run (it was read as two lives, and went unseen)."""
    events = [
        *answer("o1", 0.0, "e1", "f1", replayed=False),
        *answer("o2", 1.4, "e1", "f1", replayed=True),
        *first("f1", 1.6, 1),
        *second("e1", 1.9, 1, "f1", resumed=False),
        *answer("o3", 3616.3, "e2", "f2", replayed=False),
        *first("f2", 3616.5, 1, pid=2),
        *first("f3", 3616.9, 1, pid=3, saved=False),
    ]
    assert (1, "a view ran twice in one record life") in found(events)
