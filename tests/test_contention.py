"""An owner's fenced writes under another writer's lock, on every database (issue 32).

Another connection holds the record's row (PostgreSQL, MariaDB) or the database's write lock
(SQLite) while the owner stores its result or releases its claim, and the owner's connection
waits only briefly for a lock. The owner's first write fails on the lock; it must write again
once the lock is gone, not give its result up (the record would stay ``processing`` until a
retry took it over and ran the function a second time).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from django.db import connection, connections, transaction
from django.db.models import F

from django_idempotency import Claim, IdempotencyKey, idempotent_function
from tests.conftest import executions
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

#: How long the other writer holds its lock, and how briefly the owner's connection waits for
#: one (MariaDB's shortest lock wait is 1 s).
HOLD = {"sqlite": 0.5, "postgresql": 1.0, "mysql": 1.6}
LOCK_WAIT = {
    "sqlite": "PRAGMA busy_timeout = 50",
    "postgresql": "SET lock_timeout = '100ms'",
    "mysql": "SET innodb_lock_wait_timeout = 1",
}
RESET = {
    "sqlite": "PRAGMA busy_timeout = 5000",  # Python's default, which Django keeps
    "postgresql": "RESET lock_timeout",
    "mysql": "SET innodb_lock_wait_timeout = DEFAULT",
}


class Holder:
    """Another connection (a thread of its own) holding a write lock on a record for a while."""

    def __init__(self) -> None:
        self.holding = threading.Event()
        self.errors: list[BaseException] = []
        self.thread: threading.Thread | None = None

    def hold(self, pk: int) -> None:
        self.thread = threading.Thread(target=self._run, args=(pk, HOLD[connection.vendor]))
        self.thread.start()
        assert self.holding.wait(10), "the other writer never took its lock"

    def _run(self, pk: int, seconds: float) -> None:
        try:
            with transaction.atomic():
                IdempotencyKey.objects.filter(pk=pk).update(updated_at=F("updated_at"))
                self.holding.set()
                time.sleep(seconds)
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)
            self.holding.set()
        finally:
            connections.close_all()

    def join(self) -> None:
        assert self.thread is not None
        self.thread.join(30)
        assert not self.errors, self.errors


@pytest.fixture
def holder() -> Iterator[Holder]:
    vendor = connection.vendor
    with connection.cursor() as cursor:
        cursor.execute(LOCK_WAIT[vendor])
    try:
        yield Holder()
    finally:
        with connection.cursor() as cursor:
            cursor.execute(RESET[vendor])


@idempotent_function(
    key="message_id",
    payload=lambda message_id, *_, **__: message_id,
    lock_timeout=30,
    heartbeat=False,
)
def contended(message_id: str, fail: bool, holder: Holder, *, idempotency: Claim) -> str:
    Execution.objects.create(label="contended")
    holder.hold(idempotency.pk)  # the record's lock, held while this call stores or releases
    if fail:
        raise RuntimeError("the function failed")
    return "stored"


def _retried(caplog: pytest.LogCaptureFixture) -> int:
    return sum("busy; writing again" in record.getMessage() for record in caplog.records)


def test_the_result_is_stored_once_the_lock_is_gone(
    holder: Holder, caplog: pytest.LogCaptureFixture
) -> None:
    key = str(uuid.uuid4())
    with caplog.at_level(logging.INFO, logger="django_idempotency"):
        assert contended(key, False, holder) == "stored"
    holder.join()
    assert IdempotencyKey.objects.get().status == IdempotencyKey.Status.COMPLETED
    assert _retried(caplog) >= 1, "the write never met the lock: the test proves nothing"
    assert executions("contended") == 1
    assert contended(key, False, Holder()) == "stored"  # the replay: the function ran once
    assert executions("contended") == 1


def test_a_release_is_written_once_the_lock_is_gone(
    holder: Holder, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="django_idempotency"), pytest.raises(RuntimeError):
        contended(str(uuid.uuid4()), True, holder)
    holder.join()
    assert not IdempotencyKey.objects.exists()  # released: a retry runs the function again
    assert _retried(caplog) >= 1, "the release never met the lock: the test proves nothing"
