"""What run.py says on stderr: a broker that does not answer stops the run at once (it hung,
after saying both "outbox not drained" and "outbox drained"), and each reported violation is
named there, not only counted."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from tests.redis_servers import free_port
from tests.verification import run


def test_a_broker_that_does_not_answer_stops_the_run_with_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(run, "AMQP_URL", f"amqp://guest:secret@127.0.0.1:{free_port()}//")
    assert run.main(["--seconds", "5", "--seed", "1"]) == 1
    out, err = capsys.readouterr()
    assert out == ""  # no JSON
    assert "the outbox's broker does not answer" in err and "secret" not in err


def test_an_outbox_not_drained_is_never_called_drained(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state = {"undelivered": {"pending": 1}, "consumed": [], "sent": ["m"]}
    monkeypatch.setattr(run, "DRAIN", 0)
    monkeypatch.setattr(run.httpx, "get", lambda *a, **k: httpx.Response(200, json=state))
    monkeypatch.setattr(run, "deliveries", lambda folder: [])
    servers: Any = SimpleNamespace(url="http://verify", folder=None, queued=lambda: None)
    run.Run(servers, [], [], seconds=1.0, seed=1).drain()
    err = capsys.readouterr().err
    assert "outbox not drained after 0 s" in err
    assert "outbox drained" not in err


def test_each_reported_violation_is_one_line_naming_it() -> None:
    violation = {"invariant": 2, "principal": "alice", "key": "k-7", "what": "ran twice\nmore"}
    assert run.said(violation) == "violation of invariant 2: principal alice, key k-7: ran twice"
    assert len(run.said({**violation, "what": "x" * 500})) < 260
