"""An owner's fenced writes under another writer's lock, on every database (issue 32).

Another connection holds the record's row (PostgreSQL, MariaDB) or the database's write lock
(SQLite) while the owner stores its result or releases its claim, and the owner's connection
waits only briefly for a lock. The owner's first write fails on the lock; it must write again
once the lock is gone, not give its result up (the record would stay ``processing`` until a
retry took it over and ran the function a second time).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from django.db import connection, connections, transaction
from django.db.models import F

from django_idempotency import Claim, IdempotencyKey, idempotent_function
from django_idempotency._call import outbox
from django_idempotency.models import OutboxMessage
from tests.conftest import executions
from tests.testapp.models import Execution
from tests.testapp.outbox_tasks import receipt

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


class Reader:
    """Another connection reading SQLite's file in a transaction (a thread of its own, the
    driver's connection): it holds a shared lock, which a writer's commit waits for."""

    def __init__(self) -> None:
        self.reading = threading.Event()
        self.errors: list[BaseException] = []
        self.thread: threading.Thread | None = None

    def read(self, seconds: float) -> None:
        self.thread = threading.Thread(target=self._run, args=(seconds,))
        self.thread.start()
        assert self.reading.wait(10), "the reader never read"

    def _run(self, seconds: float) -> None:
        try:
            raw = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
            try:
                raw.execute("BEGIN")
                raw.execute(f"SELECT count(*) FROM {IdempotencyKey._meta.db_table}").fetchone()
                self.reading.set()
                time.sleep(seconds)
                raw.execute("COMMIT")
            finally:
                raw.close()
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)
            self.reading.set()

    def join(self) -> None:
        assert self.thread is not None
        self.thread.join(30)
        assert not self.errors, self.errors


@idempotent_function(
    key="order_id",
    payload=lambda order_id, *_, **__: order_id,
    name="tests.contention.ship",
    lock_timeout=30,
    heartbeat=False,
)
def ship(order_id: str, reader: Reader, *, idempotency: Claim) -> str:
    message = idempotency.enqueue(receipt, order_id)
    reader.read(HOLD["sqlite"])  # from now until after the result's first commit
    return message


def _committed(sql: str) -> list[tuple[object, ...]]:
    """What another connection reads: only what was committed."""
    raw = sqlite3.connect(connection.settings_dict["NAME"])
    try:
        return raw.execute(sql).fetchall()
    finally:
        raw.close()


@pytest.mark.sqlite
def test_a_release_whose_commit_waits_for_a_reader_is_stored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An owner's result with the outbox's messages is one transaction (the fenced write and
    the insert). On SQLite its commit waits for the readers of the file, and the owner's
    first try waits 10 ms: its commit was refused while another connection read, and so was
    the return to autocommit, which commits first. The transaction stayed open, holding the
    write lock (and, pending, keeping every new reader out) until the request's end closed the
    connection; the owner's next try wrote inside it, found its own uncommitted result (the
    fence matched nothing) and called its result refused; the close rolled it back. The record
    stayed ``processing``, and a retry after the lock lapsed ran the function again. A refused
    commit now rolls back, and the owner writes again holding the lock."""
    key = str(uuid.uuid4())
    reader = Reader()
    with caplog.at_level(logging.INFO, logger="django_idempotency"):
        message = ship(key, reader)
    reader.join()
    assert outbox.sender.settle(), "the fast path's thread is stuck"
    assert _retried(caplog) >= 1, "the write never met the reader: the test proves nothing"
    assert not [r for r in caplog.records if "refused" in r.getMessage()], caplog.text
    assert connection.get_autocommit() and not connection.connection.in_transaction
    table, outbox_table = IdempotencyKey._meta.db_table, OutboxMessage._meta.db_table
    assert _committed(f"SELECT status FROM {table}") == [("completed",)]
    assert _committed(f"SELECT message_id FROM {outbox_table}") == [(message,)]
    assert ship(key, Reader()) == message  # the replay: the function ran once
