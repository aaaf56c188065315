"""The outbox's relay through a blackhole: its statements are cut at their bound.

The relay (``manage.py idempotency_relay``) took batches and marked them on a connection with
no deadline: once a blackhole silenced it (a failover that moved an IP), the relay waited on
it for good and sent nothing more (a checker run's message left pending after its last
blackhole). A pass is now cut at :data:`~django_idempotency._ops.relay.STATEMENT_BOUND` and
made again on a new connection: a message released after the blackhole is sent. So is the
backlog's read for the OpenTelemetry gauges, after each pass: silenced, it held the relay.
And the new connection is raced (:mod:`django_idempotency._store.connecting`): one login made
in a blackhole held the relay the driver's ``connect_timeout`` after the network came back.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

from django_idempotency._ops import relay as relays
from django_idempotency.models import IdempotencyKey, OutboxMessage
from tests.faults.conftest import PROXIED
from tests.faults.proxied import proxied_server  # noqa: F401 (the fixture ``server``)
from tests.faults.proxy import FaultProxy
from tests.relaying import relay_thread
from tests.testapp.outbox_tasks import receipt

pytestmark = pytest.mark.faults

#: The relay's bound in this test, and how long a message may take to be sent after it.
BOUND = 1.0
SENT_WITHIN = 15.0


@pytest.fixture
def running(proxied_store: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    monkeypatch.setattr(relays, "STATEMENT_BOUND", BOUND)
    receipt.reset()
    with relay_thread(relays.Relay(PROXIED, interval=0.1), SENT_WITHIN + 30):
        yield proxied_store


def _release() -> str:
    """A message released and due, written on a new connection of this thread's."""
    connections[PROXIED].close()
    record = IdempotencyKey.objects.using(PROXIED).create(
        scope="s",
        key_hash=uuid.uuid4().hex,
        method="POST",
        path="/",
        request_hash="h",
        status="completed",
        expires_at=timezone.now() + timedelta(hours=1),
    )
    message = OutboxMessage.objects.using(PROXIED).create(
        record=record,
        message_id=str(uuid.uuid4()),
        engine="celery",
        task=receipt.name,
        arguments='{"args":[],"kwargs":{}}',
        available_at=timezone.now(),
    )
    return message.message_id


def _sent(message_id: str) -> bool:
    deadline = time.monotonic() + SENT_WITHIN
    while time.monotonic() < deadline:
        if message_id in [task_id for task_id, _, _ in receipt.sent]:
            return True
        time.sleep(0.05)
    return False


def test_a_relay_silenced_by_a_blackhole_sends_again_on_a_new_connection(
    running: FaultProxy,
) -> None:
    assert _sent(_release()), "the relay sent nothing before the fault"
    silenced = running.blackhole(new=False)  # its open connections only: new ones pass
    assert silenced >= 1
    try:
        assert _sent(_release()), "the relay sent nothing after its connection was silenced"
    finally:
        running.restore()
        connections[PROXIED].close()


#: How long the proxy keeps the backlog's statement silent before it resets the connection: far
#: longer than the message may take to be sent.
SILENT = 60.0


def test_a_relay_whose_backlog_read_is_silenced_sends_on(
    running: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the backlog's gauges on (OpenTelemetry), the relay reads the backlog after every
    pass on its own connection: that read was unbounded, and silenced, it held the relay, which
    sent nothing until the connection was reset (a blackhole's: for good)."""
    gauged: list[tuple[Any, ...]] = []
    monkeypatch.setattr(relays.telemetry, "gauging_outbox", lambda: True)
    monkeypatch.setattr(relays.telemetry, "outbox_backlog", lambda *figures: gauged.append(figures))
    assert _sent(_release()), "the relay sent nothing before the fault"
    silenced = running.arm("request", rb"(?i)GROUP BY", count=1, hold=SILENT)
    deadline = time.monotonic() + SENT_WITHIN
    while not silenced.fired and time.monotonic() < deadline:
        time.sleep(0.01)
    assert silenced.fired == 1, "the relay read no backlog"
    try:
        assert _sent(_release()), "the relay sent nothing after its backlog read was silenced"
    finally:
        running.disarm()
        connections[PROXIED].close()
    assert gauged


#: How long the network stays silent in the reconnection's test: under
#: :data:`~django_idempotency._store.connecting.CONNECT_TIMEOUT`, so none of the raced attempts
#: has failed when the network comes back.
SILENCED_LOGINS = 4.0
#: By when after the network's return the message must be sent (seconds): an attempt starts
#: within a bound (1 s) of it.
SENT_AFTER_HEAL = 4.0


def test_a_relay_reconnecting_into_a_short_blackhole_sends_once_it_heals(
    running: FaultProxy,
) -> None:
    """The relay's connection is lost and its new logins are silenced for a few seconds: the
    pass's connection was made by one login, held for the driver's ``connect_timeout``
    (psycopg's default 130 s, MySQLdb's none) after the network came back. Raced at the bound,
    a new attempt logs in within one of it, and a message released then is sent."""
    assert _sent(_release()), "the relay sent nothing before the fault"
    # New connections too: the relay's pass is cut at its bound, the next one's login silenced.
    running.blackhole()
    try:
        time.sleep(SILENCED_LOGINS)
        running.restore()
        healed = time.monotonic()
        message_id = _release()
        while time.monotonic() < healed + SENT_AFTER_HEAL:
            if message_id in [task_id for task_id, _, _ in receipt.sent]:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"not sent within {SENT_AFTER_HEAL:g} s of the network's return")
    finally:
        running.restore()
        running.cut_all()  # a login still silenced ends (MySQLdb's would wait for good)
        connections[PROXIED].close()
