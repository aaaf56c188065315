"""docs/operations.rst's recipe on real processes (issue 43): a view starts an export through the
outbox, a Celery worker finishes it and is SIGKILLed mid-task (before or after it completes the
operation), the broker redelivers the message, and the next worker resumes: one export file, one
final response, replayed to the original request's retries and shown by the status endpoint.
Run by CI's ``celery`` leg (RabbitMQ) on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.test import Client

from django_idempotency import IdempotencyKey
from tests.test_celery import ROOT, Broker, Worker, rows, wait_for

pytestmark = [
    pytest.mark.celery,
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls("tests.operations_processes"),
]


@pytest.fixture
def rabbitmq() -> Iterator[Broker]:
    with Broker("rabbitmq") as own:
        yield own


def first_request(broker: Broker, key: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.operations_processes", key],
        cwd=ROOT,
        env=broker.environment(),
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return json.loads(done.stdout.decode().strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("park_at", ["before-complete", "after-complete"])
def test_a_worker_killed_mid_export_completes_the_operation_once(
    rabbitmq: Broker, park_at: str, tmp_path: Path, client: Client
) -> None:
    key = str(uuid.uuid4())
    first = Worker(rabbitmq, "first", tmp_path, concurrency=1, IDEMPOTENCY_TEST_PARK_AT=park_at)
    workers = [first]
    try:
        started = first_request(rabbitmq, key)
        assert started["status"] == 202
        operation_id = started["body"]["operation"]  # type: ignore[index]
        wait_for(lambda: rows("export-parked"), "the first worker to park mid-task", first)
        first.kill()
        workers.append(Worker(rabbitmq, "second", tmp_path, concurrency=2))
        wait_for(lambda: rows("task-succeeded"), "the redelivered task to succeed", *workers[1:])
    finally:
        for worker in workers:
            worker.stop()

    assert rows("export-file") == [operation_id]  # one export: the takeover resumed after it
    assert rows("already-completed") == ([operation_id] if park_at == "after-complete" else [])
    view_record = IdempotencyKey.objects.get(path="/export/")
    assert view_record.response_status == 201
    retry = client.post(
        "/export/", {}, content_type="application/json", headers={"Idempotency-Key": key}
    )
    assert retry.status_code == 201
    assert retry["Idempotent-Replayed"] == "true"
    assert json.loads(retry.content) == {"file": "orders.csv"}
    shown = json.loads(client.get(f"/idempotency/operations/{operation_id}").content)
    assert shown["state"] == "succeeded"
    assert shown["response"]["body"] == {"file": "orders.csv"}
