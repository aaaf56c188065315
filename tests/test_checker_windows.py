"""The checker of tests/verification on small histories, cut from the hour-long soaks: the
windows it must excuse (SPEC 4a) and the double runs it must not. No servers (outside the
verification leg, which leaves out every test of its folder)."""

from __future__ import annotations

from typing import Any

from tests.verification import checker
from tests.verification.limits import LOCK, TTLS

LIMITS = checker.Limits(lock=LOCK, ttl=TTLS)
KEY = {"principal": "bob", "key": "k", "entry": "plain", "body": "b"}


def invoke(op: str, t: float) -> dict[str, Any]:
    return {"type": "invoke", "op": op, "t": t, **KEY}


def complete(op: str, t: float, execution: str, *, replayed: bool) -> dict[str, Any]:
    return {"type": "complete", "op": op, "t": t, "status": 201, "response": f"r-{execution}",
            "replayed": replayed, "execution": execution, "as": "bob"}  # fmt: skip


def effect(t: float, execution: str, pid: int) -> dict[str, Any]:
    return {"type": "effect", "t": t, **KEY, "execution": execution, "pid": pid, "work": 0.1}


def fault(kind: str, start: float, end: float, *, long: bool, pid: int | None = None) -> Any:
    return {"type": "fault", "kind": kind, "start": start, "end": end, "long": long,
            **({} if pid is None else {"pid": pid})}  # fmt: skip


def found(history: list[dict[str, Any]]) -> set[int]:
    return {v["invariant"] for v in checker.check(history, LIMITS).violations}


def late_owner(stop: dict[str, Any]) -> list[dict[str, Any]]:
    """soak-sqlite-redis-14, bob's e39126b9 (seconds from the run's start): worker 16984 claimed
    the key, was stopped before its view began; the lock lapsed, 14261 took the record over, ran
    the view and stored its answer; 16984, continued, ran the view too and its client had the
    view's own answer, fenced off from the record."""
    return [
        invoke("a", 1033.9),
        stop,
        invoke("b", 1036.9),
        effect(1037.106, "first", pid=14261),
        complete("b", 1037.275, "first", replayed=False),
        invoke("c", 1037.3),
        complete("c", 1037.339, "first", replayed=True),
        effect(1038.873, "late", pid=16984),
        complete("a", 1039.044, "late", replayed=False),
        invoke("d", 1039.0),
        complete("d", 1039.1, "first", replayed=True),
    ]


def test_a_late_owner_stopped_before_its_view_is_a_window() -> None:
    """The owner whose worker was stopped past its lock is the second effect's, not the first's:
    SPEC 4a's window all the same (it was reported as a double run and a changed answer)."""
    stop = fault("worker-stop", 1034.165, 1038.881, long=True, pid=16984)
    result = checker.check(late_owner(stop), LIMITS)
    assert result.violations == []
    assert [w["fault"]["pid"] for w in result.windows] == [16984]


def test_a_short_stop_of_the_second_worker_is_no_window() -> None:
    stop = fault("worker-stop", 1034.165, 1035.0, long=False, pid=16984)
    assert found(late_owner(stop)) == {1, 2}


def test_a_stop_of_the_second_worker_after_the_first_effect_is_no_window() -> None:
    """Both owners held the key at once: the stop came after the first's effect."""
    stop = fault("worker-stop", 1037.2, 1038.881, long=True, pid=16984)
    assert found(late_owner(stop)) == {1, 2}


def redis_kill(end: float) -> list[dict[str, Any]]:
    """soak-sqlite-redis-14, bob's e3be583a: Redis SIGKILLed 0.2 s into a 4.5 s view and
    started again (a schedule shorter than the lock, ``long`` false), answering only some 3.8 s
    later; the owner's lock lapsed, a retry took the record over."""
    return [
        invoke("a", 2307.7),
        effect(2307.790, "first", pid=26015),
        fault("redis-kill", 2308.005, end, long=False),
        invoke("b", 2311.8),
        effect(2311.921, "late", pid=7721),
        complete("a", 2313.345, "first", replayed=False),
        complete("b", 2316.610, "late", replayed=False),
        invoke("c", 2317.8),
        complete("c", 2317.833, "late", replayed=True),
    ]


def test_a_redis_restart_is_as_long_as_it_held() -> None:
    assert found(redis_kill(2312.332)) == set()


def test_a_short_redis_restart_is_no_window() -> None:
    assert found(redis_kill(2308.6)) == {1, 2}


def test_a_violation_shrinks_to_itself() -> None:
    """A later answer that differs from the first, shrunk, keeps the effects that made the two
    answers: without them it was another violation of invariant 2 (an answer no effect made),
    and the minimal history showed neither the double run nor its fault."""
    stop = fault("worker-stop", 1034.165, 1035.0, long=False, pid=16984)
    history = late_owner(stop)
    (violation,) = (v for v in checker.check(history, LIMITS).violations if v["invariant"] == 2)
    shrunk = checker.shrink(history, violation, LIMITS)
    assert {e["execution"] for e in shrunk if e["type"] == "effect"} == {"first", "late"}
