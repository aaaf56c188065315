"""The run's last request of a key (its probe, once every key has settled) against a server
written by hand: a probe the view ran anew is sent once more, so that a replay names what its
key kept (the checker reads invariants 6 and 7 from the replays)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import httpx

from tests.verification import run


def probed(answers: list[tuple[str, bool]]) -> list[dict[str, Any]]:
    """Probe one story against a server answering ``201`` with ``answers`` in turn (the
    execution, whether replayed): the events recorded."""
    given = iter(answers)

    def answer(request: httpx.Request) -> httpx.Response:
        execution, replayed = next(given)
        headers = {"Idempotent-Replayed": "true"} if replayed else {}
        body = {"execution": execution, "principal": "alice"}
        return httpx.Response(201, content=json.dumps(body).encode(), headers=headers)

    servers: Any = SimpleNamespace(url="http://verify")
    story = run.Story(number=1, start=0.0, entry="plain", principal="alice", key="k",
                      body=b"{}", clients=1, followups=[])  # fmt: skip
    runner = run.Run(servers, [story], [], seconds=1.0, seed=1)
    runner.http = httpx.Client(transport=httpx.MockTransport(answer))
    runner.headers = lambda story, index=0: {}  # type: ignore[method-assign]
    runner.probe(story)
    return [event for event in runner.recorder.events if event["type"] == "complete"]


def test_a_probe_the_view_ran_anew_is_sent_once_more() -> None:
    answers = probed([("x2", False), ("x2", True)])
    assert [(done["execution"], done["replayed"]) for done in answers] == [
        ("x2", False),
        ("x2", True),
    ]


def test_a_replayed_probe_is_sent_once() -> None:
    assert [done["execution"] for done in probed([("x1", True)])] == ["x1"]
