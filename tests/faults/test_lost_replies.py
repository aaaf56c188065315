"""What the log says when the result write's reply is lost (issue 39 item 5), on PostgreSQL and
MariaDB of the suite's own, the store reached through the suite's proxy.

The write was applied; the owner finds it so by its lock token, and the result counts as stored.
The log says that (``INFO``: stored, the reply lost, confirmed by the token), after the
``WARNING`` of the retry, and no ``ERROR``: that is kept for a result really lost. Two cases:
the reply reset at once (the write tried again on a new connection matches nothing and reads
the record back), and the reply silent for longer than the lock had left before it was reset
(the one read back made after the last try; before, ``Could not store the result`` at
``ERROR`` for a result that was stored).

And an owner whose renewal found its record taken over, whose result write then meets a fault
until its lock could lapse: its result is refused (``late_result_refused``), as the fence would
refuse it, not reported as a result the database did not take.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

import django_idempotency as signals
from django_idempotency import Claim, idempotent_function
from django_idempotency._base.keys import hash_key
from django_idempotency.models import IdempotencyKey
from tests.faults.conftest import PROXIED
from tests.faults.proxied import proxied_server  # noqa: F401 (the fixture ``server``)
from tests.faults.proxy import RESULT_WRITE, FaultProxy

pytestmark = pytest.mark.faults

LOCK = 2.0
RUNS: Counter[str] = Counter()
#: What the function does after its claim (arms the proxy: the claim's statement names the
#: result's columns too).
THEN: list[Callable[[], Any]] = []


@idempotent_function(key="message_id", lock_timeout=LOCK)
def handle(message_id: str) -> str:
    RUNS[message_id] += 1
    for then in THEN:
        then()
    return f"handled {message_id}"


@pytest.mark.parametrize("silent", [0.0, LOCK + 1], ids=["reset-at-once", "silent-past-the-lock"])
def test_a_result_whose_reply_was_lost_is_logged_as_stored(
    proxied_store: FaultProxy, caplog: pytest.LogCaptureFixture, silent: float
) -> None:
    key = str(uuid.uuid4())
    armed: list[Any] = []
    THEN[:] = [lambda: armed.append(proxied_store.arm("reply", RESULT_WRITE, count=1, hold=silent))]
    try:
        with caplog.at_level(logging.DEBUG, logger="django_idempotency"):
            assert handle(key) == f"handled {key}"
    finally:
        THEN.clear()
    assert armed[0].fired == 1
    said = [
        (record.levelno, record.getMessage())
        for record in caplog.records
        if record.name == "django_idempotency"
    ]
    assert [message for level, message in said if level >= logging.ERROR] == []
    stored = [message for level, message in said if "Stored the result" in message]
    assert [level for level, message in said if "Stored the result" in message] == [logging.INFO]
    assert len(stored) == 1
    assert "the reply to its write was lost" in stored[0]
    assert "confirms it" in stored[0]
    row = IdempotencyKey.objects.using(PROXIED).get(key_hash=hash_key(key))
    assert row.status == IdempotencyKey.Status.COMPLETED
    assert handle(key) == f"handled {key}"  # the stored result
    assert RUNS[key] == 1


@idempotent_function(key="message_id", lock_timeout=1.0)
def overtaken(message_id: str, *, idempotency: Claim) -> str:
    """The first run's lock is made stale and a second call takes the key over and finishes;
    once renewal has found that, the first run's result write meets a cut connection until its
    lock could lapse."""
    RUNS[message_id] += 1
    run = RUNS[message_id]
    if run == 1:
        IdempotencyKey.objects.using(PROXIED).filter(pk=idempotency.pk).update(
            unlock_at=timezone.now() - timedelta(seconds=1)
        )
        other = threading.Thread(target=_overtake, args=(message_id,))
        other.start()
        other.join(30)
        deadline = time.monotonic() + 10
        while not idempotency.lock_lost and time.monotonic() < deadline:
            time.sleep(0.02)
        assert idempotency.lock_lost
        for then in THEN:
            then()
    return f"run {run}"


def _overtake(message_id: str) -> None:
    try:
        overtaken(message_id)
    finally:
        connections.close_all()  # this thread's


def test_a_late_result_that_meets_a_fault_is_refused_not_lost(
    proxied_store: FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    key = str(uuid.uuid4())
    refused: list[dict[str, Any]] = []

    def receive(sender: Any, **sent: Any) -> None:
        refused.append(sent)

    THEN[:] = [lambda: proxied_store.arm("request", RESULT_WRITE, count=1000)]
    signals.late_result_refused.connect(receive)
    try:
        with caplog.at_level(logging.INFO, logger="django_idempotency"):
            assert overtaken(key) == "run 1"
    finally:
        THEN.clear()
        signals.late_result_refused.disconnect(receive)
    said = [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]
    assert not [message for message in said if "Could not store" in message]
    assert [message for message in said if "its result was refused" in message]
    assert len(refused) == 1
    proxied_store.disarm()
    assert overtaken(key) == "run 2"  # the new owner's, stored
