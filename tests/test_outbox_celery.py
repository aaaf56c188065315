"""The outbox end to end on real processes (issue 41): a web worker, relays and Celery workers on
RabbitMQ; run by CI's ``celery`` leg on SQLite, PostgreSQL and MariaDB.

- A web worker SIGKILLed after ``enqueue`` and before its result is stored sends nothing; the
  retry that takes the key over sends the receipt, once.
- A relay SIGKILLed mid-batch (after handing some messages to the broker, before marking them):
  the next relay sends the batch again, and the consumer, protected by ``idempotent_function``
  keyed by the message id, has one effect per message.
- Two relays at once never send a message twice.
- The database (a server of the test's own, on ``IDEMPOTENCY_FAULT_PORTS``: PostgreSQL on the
  PostgreSQL run, MariaDB on the MariaDB run) restarted while messages are pending, and stopped
  under a running relay and an attempt that has enqueued: the relay lives on and sends every
  released message once the database is back; the unfinished attempt's message is never sent,
  its retry's is. Prints its figures (``-s`` or the leg's log).

The consumer's worker SIGKILLed mid-task is tests/test_docs_examples.py's: the consumer of
docs/outbox.rst, run from the page's text, killed at three points on RabbitMQ and Redis.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from django_idempotency.models import OutboxMessage
from tests import own_servers
from tests.test_celery import ROOT, Broker, Worker, rows, wait_for

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def rabbitmq() -> Iterator[Broker]:
    with Broker("rabbitmq") as own:
        yield own


def process(
    broker: Broker, *args: str, log: Path | None = None, **env: str
) -> subprocess.Popen[bytes]:
    output = log.open("wb") if log is not None else None
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.outbox_processes", *args],
            cwd=ROOT,
            env=broker.environment(**env),
            start_new_session=True,
            stdout=output,
            stderr=subprocess.STDOUT if output is not None else None,
        )
    finally:
        if output is not None:
            output.close()


def finished(broker: Broker, *args: str, **env: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.outbox_processes", *args],
        cwd=ROOT,
        env=broker.environment(**env),
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]


def receipts() -> list[str]:
    return sorted(rows("receipt"), key=int)


def test_a_web_worker_killed_before_its_result_sends_nothing(
    rabbitmq: Broker, tmp_path: Path
) -> None:
    worker = Worker(rabbitmq, "consumer", tmp_path, concurrency=2)
    try:
        web = process(rabbitmq, "web", "1", IDEMPOTENCY_TEST_PARK="1")
        wait_for(lambda: rows("web-parked"), "the web worker to park after enqueue", worker)
        os.killpg(web.pid, signal.SIGKILL)
        web.wait(timeout=30)
        finished(rabbitmq, "relay")
        assert OutboxMessage.objects.count() == 0
        time.sleep(2)
        assert receipts() == []
        # The client's retry takes the key over once its lock (5 s) has expired.
        time.sleep(5)
        finished(rabbitmq, "web", "1")
        wait_for(lambda: receipts() == ["1"], "the takeover's receipt", worker)
        assert OutboxMessage.objects.get().state == "sent"  # by the fast path
    finally:
        worker.stop()
    assert receipts() == ["1"]


def test_a_relay_killed_mid_batch_is_resent_and_each_receipt_happens_once(
    rabbitmq: Broker, tmp_path: Path
) -> None:
    finished(rabbitmq, "web", *map(str, range(1, 7)), IDEMPOTENCY_TEST_NO_FAST_PATH="1")
    assert set(OutboxMessage.objects.values_list("state", flat=True)) == {"pending"}
    worker = Worker(rabbitmq, "consumer", tmp_path, concurrency=2)
    try:
        relay = process(rabbitmq, "relay", "--hang-after", "3")
        wait_for(lambda: rows("relay-parked"), "the relay to park mid-batch", worker)
        os.killpg(relay.pid, signal.SIGKILL)
        relay.wait(timeout=30)
        assert set(OutboxMessage.objects.values_list("state", flat=True)) == {"pending"}
        time.sleep(2.5)  # the killed relay's lease
        finished(rabbitmq, "relay")
        ids = list(OutboxMessage.objects.values_list("message_id", flat=True))
        wait_for(
            lambda: len(rows("task-succeeded")) >= 9, "every delivery, the resent included", worker
        )
    finally:
        worker.stop()
    assert receipts() == [str(order) for order in range(1, 7)]
    delivered = rows("task-succeeded")
    assert set(delivered) == set(ids)
    assert len(delivered) == 9  # three messages delivered twice, their effect once
    assert set(OutboxMessage.objects.values_list("state", flat=True)) == {"sent"}


def test_two_relays_at_once_send_each_message_once(rabbitmq: Broker, tmp_path: Path) -> None:
    finished(rabbitmq, "web", *map(str, range(1, 31)), IDEMPOTENCY_TEST_NO_FAST_PATH="1")
    worker = Worker(rabbitmq, "consumer", tmp_path, concurrency=2)
    try:
        relays = [process(rabbitmq, "relay", "--batch-size", "3") for _ in range(2)]
        assert [relay.wait(timeout=120) for relay in relays] == [0, 0]
        wait_for(lambda: len(receipts()) >= 30, "every receipt", worker)
        time.sleep(1)
    finally:
        worker.stop()
    assert receipts() == [str(order) for order in range(1, 31)]
    delivered = rows("task-succeeded")
    assert len(delivered) == len(set(delivered)) == 30


class Own:
    """The test's own server, read with its own connections (not one of Django's: the test's
    database is the run's)."""

    def __init__(self, server: own_servers.Server) -> None:
        self.server = server

    def rows(self, label: str) -> list[str]:
        found = self.server.execute(
            "SELECT payload FROM testapp_execution WHERE label = %s", [label]
        )
        return [str(row[0]) for row in found]

    def receipts(self) -> list[str]:
        return sorted(self.rows("receipt"), key=int)

    def states(self) -> list[str]:
        found = self.server.execute("SELECT state FROM django_idempotency_outboxmessage")
        return sorted(str(row[0]) for row in found)


@pytest.mark.parametrize(
    "vendor",
    [
        pytest.param("postgresql", marks=pytest.mark.postgresql),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ],
)
def test_the_database_restarted_under_pending_messages_and_a_running_relay(
    rabbitmq: Broker, tmp_path: Path, vendor: str, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    server = own_servers.make(vendor)
    own = Own(server)
    relay: subprocess.Popen[bytes] | None = None
    worker: Worker | None = None
    relay_log = tmp_path / "relay.log"
    try:
        env = {"DATABASE_URL": server.url(), "IDEMPOTENCY_TEST_NO_FAST_PATH": "1"}
        migrated = subprocess.run(
            [sys.executable, "-m", "django", "migrate", "--noinput", "-v", "0"],
            cwd=ROOT,
            env=rabbitmq.environment(**env),
            capture_output=True,
            timeout=300,
        )
        assert migrated.returncode == 0, migrated.stderr.decode()[-3000:]
        worker = Worker(rabbitmq, "consumer", tmp_path, concurrency=2, **env)

        # 1. Released messages pending while the database restarts: none lost.
        finished(rabbitmq, "web", *map(str, range(1, 6)), **env)
        server.restart()
        assert own.states() == ["pending"] * 5
        relay = process(rabbitmq, "relay", "--forever", log=relay_log, **env)
        wait_for(lambda: own.receipts() == ["1", "2", "3", "4", "5"], "orders 1 to 5", worker)

        # 2. The database stopped under the running relay and an attempt that has enqueued.
        go = tmp_path / "go"
        web = process(rabbitmq, "web", "6", IDEMPOTENCY_TEST_WAIT_FILE=str(go), **env)
        wait_for(lambda: own.rows("web-waiting"), "order 6 to enqueue", worker)
        server.stop()
        stopped = time.monotonic()
        go.touch()  # its result write meets the stopped server
        web.wait(timeout=60)  # its result unstored (the call raises, or returns unprotected)
        # A relay run from cron (--once) meanwhile exits, saying why; the next run picks up.
        cron = subprocess.run(
            [sys.executable, "-m", "tests.outbox_processes", "relay"],
            cwd=ROOT,
            env=rabbitmq.environment(**env),
            capture_output=True,
            timeout=120,
        )
        assert cron.returncode != 0
        assert "OperationalError" in cron.stderr.decode(), cron.stderr.decode()[-3000:]
        time.sleep(max(0.0, 3 - (time.monotonic() - stopped)))  # the relay's passes fail
        assert relay.poll() is None, relay_log.read_text()[-3000:]
        server.start()
        back = time.monotonic()
        finished(rabbitmq, "web", "7", "8", "9", **env)
        wait_for(
            lambda: own.receipts() == [str(order) for order in (1, 2, 3, 4, 5, 7, 8, 9)],
            "orders 7 to 9 through the relay that lived through the outage",
            worker,
        )
        recovered = time.monotonic() - back
        assert relay.poll() is None, relay_log.read_text()[-3000:]
        assert len(own.states()) == 8  # nothing of order 6's unfinished attempt was released
        assert own.receipts().count("6") == 0

        # 3. The client's retry of order 6, once its lock (5 s, from its claim) has passed.
        time.sleep(max(0.0, 6 - (time.monotonic() - stopped)))
        finished(rabbitmq, "web", "6", **env)
        wait_for(lambda: "6" in own.receipts(), "order 6's retry", worker)
        time.sleep(1)
        relay.send_signal(signal.SIGTERM)
        assert relay.wait(timeout=30) == 0
    finally:
        if relay is not None and relay.poll() is None:
            os.killpg(relay.pid, signal.SIGKILL)
            relay.wait(timeout=30)
        if worker is not None:
            worker.stop()
        try:
            effects = own.receipts()
            delivered = own.rows("task-succeeded")
            states = own.states()
        except Exception:
            effects, delivered, states = [], [], []
        server.destroy()
    log = relay_log.read_text()
    assert "the store failed" in log  # said so, and went on
    assert effects == [str(order) for order in range(1, 10)]  # each order's receipt once
    assert len(delivered) == len(set(delivered)) == 9
    assert states == ["sent"] * 9
    with capsys.disabled():  # the leg's log shows the figures
        print(
            f"\noutbox, {vendor} restarted and stopped for 3 s under a relay: 9 orders, receipts "
            f"per order {sorted(set(effects.count(str(o)) for o in range(1, 10)))}, "
            f"deliveries {len(delivered)}, the unfinished attempt's messages sent 0, relay "
            f"warnings {log.count('the store failed')}, orders 7 to 9 delivered "
            f"{recovered:.1f} s after the server's start, {time.monotonic() - started:.0f} s in all"
        )
