"""The Celery recipe of docs/consumers.rst on real workers and brokers: each order is invoiced and
mailed once, though its task is sent twice and the worker running it is killed mid-task.

A worker starts, takes the first task and parks in the mailer after committing the invoice and
its recovery point (the moment when the two-phase shape without a recovery point invoiced
twice); the test then publishes the other orders' tasks, each twice, and SIGKILLs the worker
(``worker``: its whole process group; ``pool process``: only the child running the task). The
broker hands the unacknowledged task to the next worker (RabbitMQ when the connection drops,
Redis after ``visibility_timeout``), which takes the record over once its lock expires.

Each test waits for events, not for time: the parked task's row, and one ``task-succeeded`` row
per message (tests/celery_app.py), within a generous deadline. Run by CI's ``celery`` leg on
SQLite, PostgreSQL and MariaDB; elsewhere deselected unless ``IDEMPOTENCY_TEST_CELERY=1``
(Celery from the ``celery`` extra).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from django_idempotency import IdempotencyKey
from tests.conftest import worker_environment
from tests.testapp.models import Execution

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parent.parent
TASK = "tests.testapp.celery_tasks.invoice_order"
BROKERS = {
    "rabbitmq": os.environ.get("IDEMPOTENCY_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//"),
    "redis": os.environ.get("IDEMPOTENCY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"),
}
WORKER = [
    *(sys.executable, "-m", "celery", "--app=tests.celery_app", "worker", "--pool=prefork"),
    *("--loglevel=INFO", "--without-gossip", "--without-mingle", "--without-heartbeat"),
]
#: How long the whole run may take: far above what it takes (about 15 s), so only a lost task
#: or a stuck worker reaches it.
DEADLINE = 180


class Broker:
    """One test's own queue (and, on Redis, key prefix) on a shared broker, removed after."""

    def __init__(self, name: str) -> None:
        run = uuid.uuid4().hex[:12]
        self.name = name
        self.url = BROKERS[name]
        self.queue = f"idem-celery-{run}"
        self.prefix = f"idem-celery-{run}:" if name == "redis" else ""
        # Imported here: collecting this module needs no Celery (elsewhere its tests are not
        # selected, and a module-level skip would count as a skip on every server leg).
        from celery import Celery

        self.app = Celery("publisher", broker=self.url, set_as_current=False)
        self.app.conf.update(
            broker_connection_retry_on_startup=True,
            broker_transport_options={"global_keyprefix": self.prefix} if self.prefix else {},
        )

    def environment(self, **extra: str) -> dict[str, str]:
        """A worker's environment: the test database, this broker and queue."""
        return {
            **worker_environment(),
            "DJANGO_SETTINGS_MODULE": "tests.celery_settings",
            "IDEMPOTENCY_TEST_BROKER_URL": self.url,
            "IDEMPOTENCY_TEST_CELERY_QUEUE": self.queue,
            "IDEMPOTENCY_TEST_REDIS_PREFIX": self.prefix,
            **extra,
        }

    def publish(self, order_id: int) -> str:
        result = self.app.send_task(TASK, kwargs={"order_id": order_id}, queue=self.queue)
        return str(result.id)

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()

    def remove(self) -> None:
        if self.name == "redis":
            import redis

            client = redis.Redis.from_url(self.url)
            keys = list(client.scan_iter(match=f"{self.prefix}*"))
            if keys:
                client.delete(*keys)
        else:
            with self.app.connection_for_write() as connection:
                connection.default_channel.queue_delete(self.queue)
        self.app.close()


class Worker:
    """A ``celery worker`` process in a session of its own, its log in a file."""

    def __init__(self, broker: Broker, name: str, tmp_path: Path, *, concurrency: int, **env: str):
        self.log = tmp_path / f"{name}.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    *WORKER,
                    f"--concurrency={concurrency}",
                    f"--hostname={name}-{broker.queue}@%h",
                    f"--queues={broker.queue}",
                ],
                cwd=ROOT,
                env=broker.environment(**env),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self) -> None:
        assert self.process.poll() is None, f"the worker died:\n{self.log.read_text()[-3000:]}"

    def kill(self) -> None:
        """SIGKILL the worker and its pool processes, as a lost host or the OOM killer would."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(params=sorted(BROKERS))
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    with Broker(request.param) as own:
        yield own


def wait_for(condition: object, what: str, *workers: Worker) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():  # type: ignore[operator]
        for worker in workers:
            worker.alive()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def rows(label: str) -> list[str]:
    return list(Execution.objects.filter(label=label).values_list("payload", flat=True))


@pytest.mark.parametrize("killed", ["worker", "pool process"])
def test_each_order_is_invoiced_and_mailed_once_though_sent_twice_and_killed_mid_task(
    broker: Broker, killed: str, tmp_path: Path
) -> None:
    sent = [broker.publish(1)]  # the task the first worker is killed in: sent once
    first = Worker(broker, "first", tmp_path, concurrency=1, IDEMPOTENCY_TEST_HANG_IN_MAILER="1")
    workers = [first]
    try:
        wait_for(lambda: rows("hanging"), "the first worker to park in the mailer", first)
        assert rows("invoice") == ["1"]  # committed, with its recovery point
        for order_id in (2, 3, 4):
            sent += [broker.publish(order_id), broker.publish(order_id)]

        if killed == "worker":
            first.kill()
            workers.append(Worker(broker, "second", tmp_path, concurrency=2))
        else:  # the worker lives on, and its next pool process takes the task again
            os.kill(int(rows("hanging")[0]), signal.SIGKILL)
        wait_for(
            lambda: set(rows("task-succeeded")) >= set(sent),
            "every task to succeed",
            *workers[1:] if killed == "worker" else workers,
        )
    finally:
        for worker in workers:
            worker.stop()

    assert sorted(rows("invoice")) == ["1", "2", "3", "4"]
    assert len(rows("email")) == len(set(rows("email"))) == 4  # one per order: its derived key
    records = IdempotencyKey.objects.order_by("path")
    assert [(r.status, r.recovery_point) for r in records] == [("completed", "invoiced")] * 4
    assert sorted(r.attempt for r in records) == [1, 1, 1, 2]  # the killed one's taken over
