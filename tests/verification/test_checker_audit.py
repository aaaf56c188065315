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
        {
            "type": "fault",
            "kind": "worker-kill",
            "pid": 1,
            "start": 10.5,
            "end": 10.6,
            "long": False,
        },
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


def test_a_replay_past_the_ttl_is_no_replay_for_an_outage_after_the_answer() -> None:
    """A 6 s record run and answered at 0 s; Redis frozen half a second at 2 s, long after
    the result was stored; a replay at 30 s is of an expired record. The outage held no
    renewal (the owner had none left to send): it extends nothing."""
    who = {**WHO, "entry": "short-ttl"}
    history = [
        {"type": "invoke", "op": "op1", "t": -0.1, **who},
        {"type": "effect", "t": 0.0, "execution": "x1", "pid": 1, **who},
        {**answer("op1", 0.1, "x1", replayed=False)},
        {"type": "fault", "kind": "redis-stop", "start": 2.0, "end": 2.5, "long": False},
        {"type": "invoke", "op": "op2", "t": 30.0, **who},
        {**answer("op2", 30.05, "x1", replayed=True)},
    ]
    limits = checker.Limits(lock=3, ttl={"short-ttl": 6})
    assert 5 in {v["invariant"] for v in checker.check(history, limits).violations}


def test_a_message_sent_twice_under_two_ids_is_two_effects() -> None:
    """x1 staged m1; the consumer got m1 and a copy of it under another id (m2, the same
    execution's), and ran the effect for each: two effects at the consumer for one kept
    result."""
    who = {**WHO, "entry": "outbox"}
    history = [
        {"type": "invoke", "op": "op1", "t": 9.9, **who},
        {"type": "effect", "t": 10.0, "execution": "x1", "pid": 1, "message": "m1", **who},
        answer("op1", 10.1, "x1", replayed=False),
        *(
            event
            for message in ("m1", "m2")
            for event in (
                {"type": "delivery", "t": 10.6, "message": message, "args": ["x1"], "pid": 1},
                {"type": "consumed", "t": 10.7, "message": message, "execution": "x1"},
            )
        ),
        {"type": "invoke", "op": "op2", "t": 20.0, **who},
        answer("op2", 20.1, "x1", replayed=True),
    ]
    limits = checker.Limits(lock=3, ttl={"outbox": 3600})
    assert 6 in {v["invariant"] for v in checker.check(history, limits).violations}


def test_a_changed_body_answered_otherwise_than_422_is_found() -> None:
    """A used key, another body: answered ``400`` (a final answer, not ``422``)."""
    history = [
        {"type": "invoke", "op": "op1", "t": 9.9, **WHO},
        {"type": "effect", "t": 10.0, "execution": "x1", "pid": 1, **WHO},
        answer("op1", 10.1, "x1", replayed=False),
        {"type": "invoke", "op": "op2", "t": 12.0, **{**WHO, "body": "c"}},
        {
            "type": "complete",
            "op": "op2",
            "t": 12.1,
            "status": 400,
            "response": "e",
            "replayed": False,
        },
    ]
    assert 4 in invariants(history)


EXPORT = {**WHO, "entry": "export"}
EXPORT_LIMITS = checker.Limits(lock=3, ttl={"export": 3600})
GONE = (7, "an operation whose result its key kept is gone (404) after every key settled")


def exported(op: str, t: float, execution: str, operation: str | None, *,
             delivered: bool = True) -> list[dict[str, Any]]:  # fmt: skip
    """An ``/export/`` attempt answered ``202`` (its operation's URL): its effect line (naming
    its operation, as the recorder writes it; ``None``: as it did before), and its message's
    delivery (naming the operation too, as the consumer always has) and effect."""
    effect = {"type": "effect", "t": t + 0.1, "execution": execution, "pid": 1,
              "message": f"m-{execution}", **EXPORT}  # fmt: skip
    if operation is not None:
        effect["operation"] = operation
    events = [
        {"type": "invoke", "op": op, "t": t, **EXPORT},
        effect,
        {"type": "complete", "op": op, "t": t + 0.2, "status": 202, "response": "p",
         "replayed": False, "location": f"/idempotency/operations/{operation or 'o1'}"},
    ]  # fmt: skip
    if delivered:
        events += [
            {"type": "delivery", "t": t + 0.6, "message": f"m-{execution}", "args": [execution],
             "pid": 1, "operation": operation or "o1"},
            {"type": "consumed", "t": t + 0.7, "message": f"m-{execution}",
             "execution": execution},
        ]  # fmt: skip
    return events


def final_poll(operation: str, t: float, status: int = 404, **seen: Any) -> dict[str, Any]:
    return {"type": "poll", "t": t, "operation": f"/idempotency/operations/{operation}",
            "owner": "alice", "principal": "alice", "status": status, "final": True,
            **seen}  # fmt: skip


def found_on_export(history: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [(v["invariant"], v["what"]) for v in checker.check(history, EXPORT_LIMITS).violations]


def test_an_export_operation_gone_after_every_key_settled_is_found() -> None:
    """``/export/``'s operation, completed by its task, answers its owner's final poll
    ``404``, though its key kept its attempt's result (a replay names it): not ``succeeded``
    with its key's stored answer. Found whether the effect line names the operation or, in a
    history recorded before it did, only its message's delivery does."""
    for named in ("o1", None):
        history = [
            *exported("op1", 9.9, "x1", named),
            {"type": "invoke", "op": "op2", "t": 20.0, **EXPORT},
            answer("op2", 20.1, "x1", replayed=True),
            final_poll("o1", 30.0),
        ]
        assert found_on_export(history) == [GONE], named


def test_an_export_operation_released_and_claimed_anew_may_be_gone() -> None:
    """x1 ran under o1 and was answered ``503`` (its result's write met a database restart:
    its record released, its message never sent); the retry claimed the key anew, o2, and
    its x2 is what the key kept. o1 names nothing (``404``); o2 is ``succeeded``."""
    history = [
        *exported("op1", 9.9, "x1", "o1", delivered=False)[:2],
        {"type": "fault", "kind": "db-restart", "start": 10.1, "end": 11.9, "long": True},
        {"type": "complete", "op": "op1", "t": 10.2, "status": 503, "response": "e",
         "replayed": False},
        *exported("op2", 12.0, "x2", "o2"),
        {"type": "invoke", "op": "op3", "t": 20.0, **EXPORT},
        answer("op3", 20.1, "x2", replayed=True),
        final_poll("o1", 30.0),
        final_poll("o2", 30.0, status=200, state="succeeded", execution="x2"),
    ]  # fmt: skip
    assert found_on_export(history) == []


def test_a_duplicates_operation_of_an_attempt_released_may_be_gone() -> None:
    """A duplicate got o1's URL while x1 ran; x1's result was never stored (no replay, no
    message sent) and its client gave up: o1 may be gone."""
    history = [
        *exported("op1", 9.9, "x1", "o1", delivered=False),
        {"type": "unsettled", "op": "op1", "t": 40.0},
        final_poll("o1", 50.0),
    ]
    assert found_on_export(history) == [(8, "no final answer after healing")]


def test_an_export_operation_of_a_record_taken_over_is_kept() -> None:
    """x1's worker was killed under it; x2 took the record over (the same row: the same
    operation, o1) and its result was kept: o1 gone is an operation lost."""
    history = [
        *exported("op1", 9.9, "x1", "o1", delivered=False)[:2],
        {"type": "fault", "kind": "worker-kill", "pid": 1, "start": 10.1, "end": 10.2,
         "long": False},
        {"type": "complete", "op": "op1", "t": 10.2, "status": None, "error": "ReadError"},
        *exported("op2", 13.5, "x2", "o1"),
        {"type": "invoke", "op": "op3", "t": 20.0, **EXPORT},
        answer("op3", 20.1, "x2", replayed=True),
        final_poll("o1", 30.0),
    ]  # fmt: skip
    assert found_on_export(history) == [GONE]


def test_an_unanswered_exports_operation_delivered_is_kept() -> None:
    """No replay named x1 (its client gave up), but its message was delivered: its ``202``
    was stored, so o1 is kept."""
    history = [
        *exported("op1", 9.9, "x1", "o1"),
        {"type": "unsettled", "op": "op1", "t": 40.0},
        final_poll("o1", 50.0),
    ]
    assert set(found_on_export(history)) == {GONE, (8, "no final answer after healing")}


def test_an_export_operation_past_its_ttl_may_be_gone() -> None:
    """The same history as a lost operation's, but the final poll comes after the record's
    TTL from its key's first request: the record may have expired."""
    history = [
        *exported("op1", 9.9, "x1", "o1"),
        {"type": "invoke", "op": "op2", "t": 20.0, **EXPORT},
        answer("op2", 20.1, "x1", replayed=True),
        final_poll("o1", 60.0),
    ]
    limits = checker.Limits(lock=3, ttl={"export": 45})
    assert checker.check(history, limits).violations == []
    assert GONE in found_on_export(history)


def test_a_connection_dropped_with_no_fault_is_found() -> None:
    """No fault at all, yet the server closed a request's connection unanswered (a worker
    crashed or hung until gunicorn's timeout killed it): behind a proxy, a ``502``."""
    history = [
        {"type": "invoke", "op": "op1", "t": 9.9, **WHO},
        {
            "type": "complete",
            "op": "op1",
            "t": 40.0,
            "status": None,
            "error": "RemoteProtocolError",
        },
        {"type": "invoke", "op": "op2", "t": 40.2, **WHO},
        {"type": "effect", "t": 40.3, "execution": "x1", "pid": 2, **WHO},
        answer("op2", 40.4, "x1", replayed=False),
    ]
    assert 8 in invariants(history)


def test_no_window_opens_after_a_replay_proved_the_result_stored() -> None:
    """x1's Redis froze 3.5 s under it (a window could open), but x1's result was stored: it
    was replayed at 16 s. A retry at 20 s runs the view again: the record was complete, no
    owner was late, and the outage long over."""
    history = [
        {"type": "invoke", "op": "op1", "t": 9.9, **WHO},
        {"type": "effect", "t": 10.0, "execution": "x1", "pid": 1, **WHO},
        {"type": "fault", "kind": "redis-stop", "start": 10.5, "end": 14.0, "long": True},
        answer("op1", 14.2, "x1", replayed=False),
        {"type": "invoke", "op": "op2", "t": 16.0, **WHO},
        answer("op2", 16.1, "x1", replayed=True),
        {"type": "invoke", "op": "op3", "t": 20.0, **WHO},
        {"type": "effect", "t": 20.1, "execution": "x2", "pid": 2, **WHO},
        answer("op3", 20.2, "x2", replayed=False),
    ]
    assert invariants(history) & {1, 2, 5}


def test_a_relay_or_consumer_kill_excuses_no_unanswered_request() -> None:
    """The relay's and the consumer's processes serve no web request: their kill at the
    time of a dropped connection explains nothing; a worker's kill does."""
    for kind, found in (("relay-kill", True), ("consumer-kill", True), ("worker-kill", False)):
        history = [
            {"type": "invoke", "op": "op1", "t": 9.9, **WHO},
            {"type": "fault", "kind": kind, "start": 10.0, "end": 10.0, "long": False},
            {"type": "complete", "op": "op1", "t": 10.2, "status": None, "error": "Reset"},
        ]
        assert (8 in invariants(history)) is found, kind


def test_an_unanswered_exports_operation_succeeded_with_its_run_is_its_answer() -> None:
    """No ``2xx`` reached x1's clients (their retries got its ``202`` until they gave up,
    the server slow); its task completed o1 with x1's answer: that is the key's stored answer,
    another execution's is not. (A MariaDB run under a load of 60 reported the first.)"""
    for execution, found in (("x1", []), ("x9", [7])):
        history = [
            *exported("op1", 9.9, "x1", "o1"),
            {"type": "unsettled", "op": "op1", "t": 40.0},
            final_poll("o1", 50.0, status=200, state="succeeded", execution=execution),
        ]
        assert [i for i, _ in found_on_export(history) if i == 7] == found, execution
