"""The checker's reading of a store outage, on histories written by hand (no servers): its
length is its measured span, its start's time included, and outages one right after the
other are one. Found by the hour-long soaks: a 1 s ``redis-kill`` that kept Redis away 4.3 s,
and two back-to-back MariaDB restarts of 1.8 and 1.7 s, each reported as a view run twice."""

from __future__ import annotations

from typing import Any

import pytest

from tests.verification import checker

LIMITS = checker.Limits(lock=3, ttl={"plain": 3600})


def history(*faults: dict[str, Any]) -> list[dict[str, Any]]:
    """alice's view run at 10 s by worker 1 (4.5 s of work: its result written during the
    faults), the faults, then her retry run again at 16 s by worker 2."""
    who = {"principal": "alice", "key": "k", "entry": "plain", "body": "b"}
    return [
        {"type": "invoke", "op": "op1", "t": 9.9, **who},
        {"type": "effect", "t": 10.0, "execution": "x1", "pid": 1, **who},
        *({"type": "fault", "long": False, **fault} for fault in faults),
        {"type": "invoke", "op": "op2", "t": 15.9, **who},
        {"type": "effect", "t": 16.0, "execution": "x2", "pid": 2, **who},
    ]


def runs_twice(result: checker.Result) -> bool:
    return any(v["invariant"] == 1 for v in result.violations)


def test_a_restart_counts_its_start() -> None:
    kill = {"kind": "redis-kill", "duration": 1.05, "start": 12.0, "end": 16.3}
    result = checker.check(history(kill), LIMITS)
    assert not runs_twice(result)
    assert [window["fault"]["kind"] for window in result.windows] == ["redis-kill"]


@pytest.mark.parametrize("gap", [0.0, 0.05])
def test_outages_one_right_after_the_other_are_one(gap: float) -> None:
    first = {"kind": "db-restart", "duration": 1.08, "start": 12.0, "end": 13.8}
    second = {"kind": "db-restart", "duration": 0.97, "start": 13.8 + gap, "end": 15.5}
    result = checker.check(history(first, second), LIMITS)
    assert not runs_twice(result)
    assert len(result.windows) == 1


def test_short_outages_with_time_between_them_open_no_window() -> None:
    first = {"kind": "db-restart", "duration": 1.08, "start": 12.0, "end": 13.5}
    second = {"kind": "redis-stop", "duration": 1.0, "start": 14.0, "end": 15.0}
    instant = {"kind": "db-cut", "duration": 0.0, "start": 15.0, "end": 15.1}
    assert runs_twice(checker.check(history(first, second, instant), LIMITS))


def short_ttl(*faults: dict[str, Any]) -> list[dict[str, Any]]:
    """alice's 6 s TTL record run at 0 s, first replayed at 5.3 s, replayed again at 7.1 s."""
    who = {"principal": "alice", "key": "k", "entry": "short-ttl", "body": "b"}
    answer = {"type": "complete", "status": 201, "response": "r", "replayed": True,
              "execution": "x1", "as": "alice"}  # fmt: skip
    return [
        {"type": "invoke", "op": "op1", "t": -0.1, **who},
        {"type": "effect", "t": 0.0, "execution": "x1", "pid": 1, **who},
        *({"type": "fault", "long": True, **fault} for fault in faults),
        {"type": "invoke", "op": "op2", "t": 5.3, **who},
        {"op": "op2", "t": 5.35, **answer},
        {"type": "invoke", "op": "op3", "t": 7.1, **who},
        {"op": "op3", "t": 7.15, **answer},
    ]


def expired_replays(history: list[dict[str, Any]]) -> int:
    limits = checker.Limits(lock=3, ttl={"short-ttl": 6})
    return sum(v["invariant"] == 5 for v in checker.check(history, limits).violations)


def test_a_renewal_held_by_a_store_outage_keeps_the_record_past_its_ttl() -> None:
    freeze = {"kind": "redis-stop", "duration": 5.3, "start": 0.01, "end": 5.3}
    assert expired_replays(short_ttl(freeze)) == 0


def test_without_an_outage_a_replay_past_the_ttl_is_expired() -> None:
    stop = {"kind": "worker-stop", "duration": 5.3, "start": 0.01, "end": 5.3, "pid": 2}
    assert expired_replays(short_ttl()) == expired_replays(short_ttl(stop)) == 1


def test_a_stop_of_the_owner_s_worker_keeps_the_record_past_its_ttl() -> None:
    """Found by a SQLite soak: an owner's worker stopped 5.2 s under a 6 s TTL renewed as it
    resumed, and its record was replayed 7.5 s after its run."""
    stop = {"kind": "worker-stop", "duration": 5.2, "start": 0.01, "end": 5.2, "pid": 1}
    assert expired_replays(short_ttl(stop)) == 0


def test_on_sqlite_a_stop_of_any_worker_keeps_the_record_past_its_ttl() -> None:
    stop = {"kind": "worker-stop", "duration": 5.2, "start": 0.01, "end": 5.2, "pid": 2}
    limits = checker.Limits(lock=3, ttl={"short-ttl": 6}, worker_faults_global=True)
    violations = checker.check(short_ttl(stop), limits).violations
    assert not [v for v in violations if v["invariant"] == 5]
