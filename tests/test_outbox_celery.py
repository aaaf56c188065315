"""The outbox end to end on real processes (issue 41): a web worker, relays and Celery workers on
RabbitMQ; run by CI's ``celery`` leg on SQLite, PostgreSQL and MariaDB.

- A web worker SIGKILLed after ``enqueue`` and before its result is stored sends nothing; the
  retry that takes the key over sends the receipt, once.
- A relay SIGKILLed mid-batch (after handing some messages to the broker, before marking them):
  the next relay sends the batch again, and the consumer, protected by ``idempotent_function``
  keyed by the message id, has one effect per message.
- Two relays at once never send a message twice.
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
from tests.test_celery import ROOT, Broker, Worker, rows, wait_for

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def rabbitmq() -> Iterator[Broker]:
    own = Broker("rabbitmq")
    try:
        yield own
    finally:
        own.remove()


def process(broker: Broker, *args: str, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.outbox_processes", *args],
        cwd=ROOT,
        env=broker.environment(**env),
        start_new_session=True,
    )


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
