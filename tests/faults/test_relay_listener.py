"""The relay's ``LISTEN`` through faults (PostgreSQL's alone: no other store notifies).

Its listener is a connection of its own. Its ``LISTEN`` went unbounded: a server silent to it
held the relay there, before its first pass. And a blackholed listener fails nothing
(``notifies()`` returns nothing, as when nothing is released): kept, it woke the relay for no
release again, each one sent at the next poll. A pass that finds work no notification
announced is the evidence that it missed one: the relay listens again on a new connection.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connections

from django_idempotency._ops import relay as relays
from django_idempotency._store import outbox as store
from tests.faults.conftest import PROXIED
from tests.faults.databases import DATABASE, PostgresCluster
from tests.faults.proxy import FaultProxy
from tests.faults.test_relay import _release
from tests.relaying import relay_thread
from tests.testapp.outbox_tasks import receipt

pytestmark = pytest.mark.faults

#: The relay's statement bound in these tests (seconds).
BOUND = 1.0


@pytest.fixture(scope="module", name="server")
def pg_cluster(postgresql: PostgresCluster) -> PostgresCluster:
    """The suite's PostgreSQL cluster: the only server whose store notifies."""
    return postgresql


@contextmanager
def relaying(monkeypatch: pytest.MonkeyPatch, interval: float) -> Iterator[threading.Event]:
    """A relay run on a thread of its own, polling every ``interval`` seconds: the event is
    set as it first waits (its first pass done, on a connection made)."""
    monkeypatch.setattr(relays, "STATEMENT_BOUND", BOUND)
    receipt.reset()
    relay = relays.Relay(PROXIED, interval=interval)
    waiting = threading.Event()
    wait = relay._wait

    def waits(*args: Any) -> Any:
        waiting.set()
        return wait(*args)

    relay._wait = waits  # type: ignore[method-assign]
    try:
        with relay_thread(relay, 60):
            yield waiting
    finally:
        connections[PROXIED].close()


def _notified() -> str:
    """A message released and due, and the relays notified, as a release does."""
    message_id = _release()
    with connections[PROXIED].cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, '')", [store.CHANNEL])
    return message_id


def _listeners(server: PostgresCluster) -> set[int]:
    """The backends whose last statement is a ``LISTEN`` (the relay's listener)."""
    rows = server.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND query LIKE %s",
        [DATABASE, "LISTEN%"],
        database="postgres",
    )
    return {pid for (pid,) in rows}


def _within(condition: Callable[[], Any], seconds: float) -> Any:
    """``condition()``'s first true value within ``seconds``, else the last (false) one."""
    deadline = time.monotonic() + seconds
    while not (value := condition()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def _sent(message_id: str) -> bool:
    return message_id in {task_id for task_id, _, _ in receipt.sent}


def test_a_silenced_listen_does_not_hold_the_relay(
    proxied_store: FaultProxy, server: PostgresCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relay's first ``LISTEN`` is silenced (60 s): it is cut at the bound, and made
    again on a new connection; a release is sent at once (the poll is 60 s away)."""
    silenced = proxied_store.arm("request", rb"LISTEN", count=1, hold=60.0)
    with relaying(monkeypatch, interval=60.0):
        assert silenced.done.wait(15), "the relay sent no LISTEN"
        listening = _within(lambda: _listeners(server), 15)  # none without the bound
        message_id = _notified()
        assert _within(lambda: _sent(message_id), 10), (
            f"not sent within 10 s of its release (listening: {bool(listening)})"
        )


#: The poll interval of the blackhole's test (seconds): far longer than a woken relay takes.
INTERVAL = 12.0


def test_a_blackholed_listener_is_replaced_once_a_pass_finds_what_it_missed(
    proxied_store: FaultProxy, server: PostgresCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blackhole silences the listener: the release after it is sent at a poll, which
    replaces the listener, and the next release is sent at once (not at the next poll)."""
    with relaying(monkeypatch, interval=INTERVAL) as waiting:
        # Its pass's connection and its listener both made: neither is silenced as it logs in.
        assert waiting.wait(15), "the relay never waited"
        first = _listeners(server)
        assert first, "the relay never listened"
        assert proxied_store.blackhole(new=False) >= 1  # its open connections only
        try:
            missed = _notified()
            # A poll, whose pass is cut on the silenced connection; the next one sends it.
            assert _within(lambda: _sent(missed), 2 * INTERVAL + 10), "never sent"
            listening = _within(lambda: _listeners(server) - first, 4)  # none without the fix
            prompt = _notified()
            assert _within(lambda: _sent(prompt), 4), (
                f"not sent within 4 s of its release (listening again: {bool(listening)})"
            )
        finally:
            proxied_store.restore()
