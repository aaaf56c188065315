"""The checker of tests/verification against generated histories (Hypothesis), no servers.

A history a correct store could give (each request answered, one at a time, as the contract
says: the first runs the view, a retry of the same body replays it, another body is ``422``)
must show no violation, whatever its principals, keys, bodies, entry points and timing. One
bug planted in such a history (a view run again, another principal's answer, a changed body
run, a replay that differs) must be found by its invariant, and the shrunk history
(``checker.shrink``) must still show it, in no more events than its key had. Hypothesis
shrinks a failing example to the smallest history: the runs' own failures shrink by
``checker.shrink``, whose property this is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.verification import checker
from tests.verification.limits import LOCK, TTL, TTLS

LIMITS = checker.Limits(lock=LOCK, ttl=TTLS)
ENTRIES = sorted(name for name, ttl in TTLS.items() if ttl == TTL)
PRINCIPALS = ["alice", "bob", "carol", "anonymous"]


@dataclass(frozen=True)
class Request:
    principal: str
    key: str
    body: str
    entry: str
    gap: float


requests = st.lists(
    st.builds(
        Request,
        principal=st.sampled_from(PRINCIPALS),
        key=st.sampled_from(["k1", "k2", "k3"]),
        body=st.sampled_from(["b1", "b2"]),
        entry=st.sampled_from(ENTRIES),
        gap=st.floats(min_value=0.05, max_value=30.0),
    ),
    min_size=1,
    max_size=25,
)


def served(asked: list[Request]) -> list[dict[str, Any]]:
    """The history of ``asked`` served one at a time by a store that keeps the contract."""
    events: list[dict[str, Any]] = []
    stored: dict[tuple[str, str], tuple[str, str]] = {}  # (principal, key): (body, execution)
    t = 0.0
    for number, request in enumerate(asked):
        t += request.gap
        op = f"op{number}"
        key = {"principal": request.principal, "key": request.key, "entry": request.entry}
        events.append({"type": "invoke", "op": op, "t": t, "body": request.body, **key})
        answer: dict[str, Any] = {"type": "complete", "op": op, "t": t + 0.02,
                                  "as": request.principal}  # fmt: skip
        held = stored.get((request.principal, request.key))
        if held is None:
            execution = f"e{number}"
            stored[request.principal, request.key] = (request.body, execution)
            events.append({"type": "effect", "t": t + 0.01, "body": request.body,
                           "execution": execution, "pid": 1, "work": 0.01, **key})  # fmt: skip
            answer.update(status=201, execution=execution, replayed=False)
        elif held[0] == request.body:
            answer.update(status=201, execution=held[1], replayed=True)
        else:
            answer.update(status=422, execution=None, replayed=False)
        if answer["execution"]:
            answer["response"] = f"r-{answer['execution']}"
        events.append(answer)
    return events


@settings(max_examples=150, derandomize=True, deadline=None)
@given(requests)
def test_a_history_that_keeps_the_contract_shows_nothing(asked: list[Request]) -> None:
    result = checker.check(served(asked), LIMITS)
    assert result.violations == []
    assert result.windows == []


def _replays(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "complete" and e["replayed"]]


def _run_again(events: list[dict[str, Any]], replay: dict[str, Any]) -> None:
    """The replay's request ran the view again and was answered by that run."""
    asked = next(e for e in events if e["type"] == "invoke" and e["op"] == replay["op"])
    execution = f"again-{replay['op']}"
    events.append({"type": "effect", "t": asked["t"] + 0.01, "body": asked["body"],
                   "execution": execution, "pid": 2, "work": 0.01,
                   **{k: asked[k] for k in ("principal", "key", "entry")}})  # fmt: skip
    replay.update(execution=execution, response=f"r-{execution}", replayed=False)


def _cross(events: list[dict[str, Any]], replay: dict[str, Any]) -> None:
    """The replay reached another principal than the one whose request it answers."""
    asked = next(e for e in events if e["type"] == "invoke" and e["op"] == replay["op"])
    replay["as"] = next(p for p in PRINCIPALS if p != asked["principal"])


def _changed_body_ran(events: list[dict[str, Any]], refusal: dict[str, Any]) -> None:
    """A ``422`` request (another body under a used key) ran the view instead."""
    _run_again(events, refusal)
    refusal["status"] = 201


def _differs(events: list[dict[str, Any]], replay: dict[str, Any]) -> None:
    """A replay's bytes are not the stored answer's."""
    replay["response"] = replay["response"] + "-changed"


PLANTS = {
    "run-again": (_run_again, _replays, 1),
    "cross": (_cross, _replays, 3),
    "changed-body-ran": (
        _changed_body_ran,
        lambda events: [e for e in events if e["type"] == "complete" and e["status"] == 422],
        4,
    ),
    "replay-differs": (_differs, _replays, 2),
}


@settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.filter_too_much],
)
@given(requests, st.sampled_from(sorted(PLANTS)), st.data())
def test_a_planted_bug_is_found_and_its_shrunk_history_shows_it(
    asked: list[Request], plant: str, data: st.DataObject
) -> None:
    events = served(asked)
    bug, targets, invariant = PLANTS[plant]
    candidates = targets(events)
    if not candidates:
        return  # nothing in this history to plant the bug on
    target = data.draw(st.sampled_from(candidates))
    bug(events, target)
    events.sort(key=lambda e: e["t"])
    found = checker.check(events, LIMITS).violations
    assert invariant in {v["invariant"] for v in found}, (plant, found)
    violation = next(v for v in found if v["invariant"] == invariant)
    small = checker.shrink(events, violation, LIMITS)
    shown = checker.check(small, LIMITS).violations
    assert any(v["invariant"] == invariant for v in shown)
    key = (violation["principal"], violation["key"])
    assert all(
        (e["principal"], e["key"]) == key for e in small if e["type"] in ("invoke", "effect")
    )
    ops = {e["op"] for e in events if e["type"] == "invoke" and (e["principal"], e["key"]) == key}
    its_own = [
        e
        for e in events
        if e.get("op") in ops or (e["type"] == "effect" and (e["principal"], e["key"]) == key)
    ]
    assert len(small) <= len(its_own)
