"""The checker's reading of the outbox (6) and of operations (7), on histories written by hand
(no servers): the run's last request, sent once every key settled, may run the view anew (its
record expired, or was left ``processing`` when a fault lost its result write and was taken
over), and nothing is asked after it, so no replay names what it kept. Found by hour-long
runs: every such key's message was reported as one of "an attempt that kept nothing", and
its operation's response as "not its key's stored answer"."""

from __future__ import annotations

from typing import Any

from tests.verification import checker

LIMITS = checker.Limits(lock=3, ttl={"outbox": 3600, "accepted": 3600})
WHO = {"principal": "alice", "key": "k", "body": "b"}


def run(
    op: str, t: float, execution: str, *, entry: str = "outbox", message: str | None = "m1",
    replayed: bool = False, fails: bool = False,
) -> list[dict[str, Any]]:  # fmt: skip
    """One request: its invocation, the view's effect (unless replayed) and its answer."""
    who = {**WHO, "entry": entry}
    events: list[dict[str, Any]] = [{"type": "invoke", "op": op, "t": t, **who}]
    if not replayed:
        effect = {"type": "effect", "t": t + 0.1, "execution": execution, "pid": 1, **who}
        if message is not None:
            effect["message"] = message
        if fails:
            effect["fails"] = True
        events.append(effect)
    status, answer = (503, {}) if fails else (201, {"execution": execution, "as": "alice"})
    events.append({"type": "complete", "op": op, "t": t + 0.5, "status": status,
                   "response": f"r-{execution}", "replayed": replayed, **answer})  # fmt: skip
    return events


def delivered(message: str, execution: str, t: float) -> list[dict[str, Any]]:
    return [
        {"type": "delivery", "t": t, "message": message, "args": [execution], "pid": 1},
        {"type": "consumed", "t": t + 0.1, "message": message, "execution": execution},
    ]


def test_the_last_request_run_anew_in_a_new_life_kept_its_message() -> None:
    """Answered and replayed in the record's first life; the last request comes past the
    TTL and runs anew, staging a new message (a new life's id), and nothing follows it."""
    events = [
        *run("op1", 10.0, "x1"),
        *delivered("m1", "x1", 10.6),
        *run("op2", 20.0, "x1", replayed=True),
        *run("op3", 3700.0, "x2", message="m2"),
        *delivered("m2", "x2", 3700.6),
    ]
    assert checker.check(events, LIMITS).violations == []


def test_the_last_request_took_over_a_record_whose_result_write_was_lost() -> None:
    """x1 answered its client, but a fault lost its result write: the record stayed
    ``processing`` until the last request took it over (a window) and ran x2, whose release
    inserted the message both staged (one id in one life), under x2's arguments."""
    events = [
        *run("op1", 10.0, "x1"),
        {"type": "fault", "kind": "db-blackhole", "long": True, "start": 10.2, "end": 15.0},
        *run("op2", 500.0, "x2"),
        *delivered("m1", "x2", 500.6),
    ]
    result = checker.check(events, LIMITS)
    assert result.violations == []
    assert len(result.windows) == 1


def test_a_late_owners_message_is_still_one_that_kept_nothing() -> None:
    """In a life whose replays name x2, a message released under x1 is one the fence should
    have refused."""
    events = [
        *run("op1", 10.0, "x1"),
        {"type": "fault", "kind": "db-blackhole", "long": True, "start": 10.2, "end": 15.0},
        *run("op2", 14.0, "x2"),
        *delivered("m1", "x1", 15.1),
        *run("op3", 30.0, "x2", replayed=True),
    ]
    found = [(v["invariant"], v["what"]) for v in checker.check(events, LIMITS).violations]
    assert found == [(6, "a message of an attempt that kept nothing was delivered")]


def test_a_message_of_an_attempt_that_failed_on_purpose_is_found() -> None:
    events = [
        *run("op1", 10.0, "x1", message="m0", fails=True),
        *delivered("m0", "x1", 10.6),
        *run("op2", 11.0, "x2"),
        *delivered("m1", "x2", 11.6),
    ]
    found = [(v["invariant"], v["what"]) for v in checker.check(events, LIMITS).violations]
    assert found == [(6, "a message of an attempt that failed on purpose was delivered")]


def test_a_message_no_replay_follows_is_still_consumed_once() -> None:
    events = [*run("op1", 10.0, "x1"), *delivered("m1", "x1", 10.6), *delivered("m1", "x1", 11)]
    found = [(v["invariant"], v["what"]) for v in checker.check(events, LIMITS).violations]
    assert found == [(6, "a message had 2 effects at the consumer")]


OPERATION = "/idempotency/operations/1.s"


def accepted(t: float) -> list[dict[str, Any]]:
    """A duplicate of the first request given ``202`` and the operation's URL."""
    return [
        {"type": "invoke", "op": "op0", "t": t, "entry": "accepted", **WHO},
        {"type": "complete", "op": "op0", "t": t + 0.1, "status": 202, "response": "a",
         "replayed": False, "location": OPERATION},
    ]  # fmt: skip


def poll(execution: str, t: float) -> dict[str, Any]:
    return {"type": "poll", "t": t, "owner": "alice", "principal": "alice",
            "operation": OPERATION, "final": True, "status": 200, "state": "succeeded",
            "execution": execution}  # fmt: skip


def test_an_operation_answered_by_the_last_request_run_anew() -> None:
    """The record was left ``processing`` (a lost result write); the last request took it
    over and stored x2, which the operation then gives, with no replay of it."""
    events = [
        *run("op1", 10.0, "x1", entry="accepted", message=None),
        *accepted(10.2),
        {"type": "fault", "kind": "db-blackhole", "long": True, "start": 10.2, "end": 15.0},
        *run("op2", 500.0, "x2", entry="accepted", message=None),
        poll("x2", 530.0),
    ]
    assert checker.check(events, LIMITS).violations == []


def test_an_operation_answering_other_than_the_last_replay_is_found() -> None:
    events = [
        *run("op1", 10.0, "x1", entry="accepted", message=None),
        *accepted(10.2),
        {"type": "fault", "kind": "db-blackhole", "long": True, "start": 10.2, "end": 15.0},
        *run("op2", 14.0, "x2", entry="accepted", message=None),
        *run("op3", 30.0, "x2", entry="accepted", message=None, replayed=True),
        poll("x1", 40.0),
    ]
    found = [(v["invariant"], v["what"]) for v in checker.check(events, LIMITS).violations]
    assert found == [(7, "an operation's response is not its key's stored answer")]
