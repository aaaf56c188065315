"""The outbox (issue 41, SPEC 4b): messages staged with ``claim.enqueue`` leave exactly when the
attempt's result is kept, with ids stable across takeovers; the fast path and the relay deliver
them, with retries, a failed state, and batches no two relays share."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_idempotency import Claim, IdempotencyKey, idempotent_function
from django_idempotency._call import outbox
from django_idempotency._ops.listener import Listener
from django_idempotency._ops.relay import Relay, backlog
from django_idempotency._store import outbox as store
from django_idempotency._store import using
from django_idempotency.models import OutboxMessage
from django_idempotency.testing import outbox_sent
from tests.relaying import relay_here, relay_thread
from tests.testapp.outbox_tasks import receipt
from tests.waiting import wait_for

pytestmark = [pytest.mark.urls("tests.outbox_urls"), pytest.mark.django_db(transaction=True)]

Post = Callable[..., Any]
NO_FAST_PATH = {"OUTBOX_FAST_PATH": False}


@pytest.fixture
def post(client: Client) -> Post:
    """POST to an order view, ``spec`` (how the attempt ends) in its ``X-Spec`` header: a
    retry that ends otherwise is the same request."""

    def send(path: str, spec: dict[str, Any] | None = None, *, key: str, **extra: Any) -> Any:
        headers = {"Idempotency-Key": key, "X-Spec": json.dumps(spec or {})}
        try:
            return client.post(path, {}, content_type="application/json", headers=headers)
        finally:  # the fast path sends on its own thread
            assert outbox.sender.settle(), "the fast path's thread is stuck"

    return send


@pytest.fixture(autouse=True)
def _fresh_recorder() -> Iterator[None]:
    receipt.reset()
    yield
    receipt.reset()


def sent_ids() -> list[str]:
    outbox_sent()
    return [task_id for task_id, _, _ in receipt.sent]


def states() -> dict[str, str]:
    return dict(OutboxMessage.objects.values_list("message_id", "state"))


@pytest.mark.parametrize("path", ["/order/", "/atomic/"])
def test_messages_are_released_with_the_result_and_sent_after_commit(
    post: Post, key: str, path: str
) -> None:
    response = post(path, {"order": "1"}, key=key)
    assert response.status_code == 201
    ids = response.json()["messages"]
    assert sent_ids() == ids
    assert [kwargs["kind"] for _, _, kwargs in receipt.sent] == ["first", "second"]
    assert states() == dict.fromkeys(ids, "sent")
    assert set(OutboxMessage.objects.values_list("record_id", flat=True)) == {
        IdempotencyKey.objects.get().pk
    }
    # A replay sends nothing again.
    assert post(path, {"order": "1"}, key=key).json()["messages"] == ids
    assert sent_ids() == ids


@pytest.mark.parametrize("path", ["/order/", "/atomic/"])
@pytest.mark.parametrize(
    "ending",
    [
        {"status": 500},
        {"status": 503},
        {"status": 429},
        {"status": 408},
        {"raise": True},
        {"no_store": True},
        {"steal": True},
    ],
    ids=["500", "503", "429", "408", "raised", "no_store", "lock_lost"],
)
def test_an_attempt_whose_result_is_not_kept_releases_nothing(
    post: Post, key: str, path: str, ending: dict[str, Any]
) -> None:
    try:
        post(path, {"order": "1", **ending}, key=key)
    except RuntimeError:
        assert ending.get("raise")
    assert OutboxMessage.objects.count() == 0
    assert receipt.sent == []


def test_a_deterministic_4xx_is_stored_and_releases_its_messages(post: Post, key: str) -> None:
    response = post("/order/", {"status": 409}, key=key)
    assert response.status_code == 409
    assert sent_ids() == response.json()["messages"]


def test_the_result_write_failing_releases_nothing(
    post: Post, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A result the database refuses to store (the fence's statement fails) inserts nothing:
    the messages go in the same statement or transaction as the result. The log says the
    database refused it, not that it "did not answer" (an error tried once: issue 48)."""
    with connection.execute_wrapper(_fail_result_write):
        response = post("/order/", {"order": "1"}, key=key)
    assert response.status_code == 201  # the client gets its answer; the record stays processing
    assert IdempotencyKey.objects.get().status == IdempotencyKey.Status.PROCESSING
    assert OutboxMessage.objects.count() == 0
    assert receipt.sent == []
    assert "the database refused the write (IntegrityError: refused for the test)" in caplog.text
    assert "did not answer" not in caplog.text


def _fail_result_write(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
    # The result write: an UPDATE, or with messages a CTE that updates first (not a new
    # session's plain claim, ``WITH inserted AS (INSERT``).
    if "response_body" in sql and sql.lstrip().upper().startswith(("UPDATE", "WITH FENCED")):
        from django.db import IntegrityError

        raise IntegrityError("refused for the test")
    return execute(sql, params, many, context)


def test_a_recovery_point_releases_what_was_staged_before_it(post: Post, key: str) -> None:
    """The first message leaves with the point; the second, staged after it by an attempt
    that then raises, never does; the takeover resumes, stages the second again under the
    same id, and releases it with its result."""
    with pytest.raises(RuntimeError):
        post("/order/", {"point": True, "raise": True}, key=key)
    [first] = sent_ids()
    assert states() == {first: "sent"}
    record = IdempotencyKey.objects.get()
    assert record.recovery_point == "charged"
    response = post("/order/", {"point": True}, key=key)
    assert response.status_code == 201
    [second] = response.json()["messages"]
    assert sent_ids() == [first, second]
    assert IdempotencyKey.objects.get().attempt == 2


def test_a_takeover_staging_a_released_message_again_inserts_nothing(post: Post, key: str) -> None:
    """Named messages keep their id whatever the attempt: the takeover's copy of the one its
    predecessor released at the recovery point is not inserted or sent again."""
    with pytest.raises(RuntimeError):
        post("/order/", {"point": True, "raise": True, "name": "receipt", "always": 1}, key=key)
    [first] = sent_ids()
    response = post("/order/", {"point": True, "name": "receipt", "always": 1}, key=key)
    ids = response.json()["messages"]
    assert ids[0] == first
    assert sent_ids() == [first, ids[1]]
    assert OutboxMessage.objects.count() == 2


def test_message_ids_are_stable_for_the_record_and_differ_between_records(
    post: Post, key: str
) -> None:
    with pytest.raises(RuntimeError):
        post("/order/", {"raise": True, "point": True}, key=key)
    dead = IdempotencyKey.objects.get()
    first = post("/order/", {"point": True}, key=key).json()["messages"]
    other = post("/order/", {"point": True}, key=str(uuid.uuid4())).json()["messages"]
    assert len(set(first) | set(other)) == 3  # resumed: only the second message is new
    assert IdempotencyKey.objects.get(pk=dead.pk).attempt == 2


def test_drf_views_enqueue(post: Post, key: str) -> None:
    response = post("/drf/", key=key)
    assert sent_ids() == [response.json()["message"]]


def test_a_functions_claim_enqueues() -> None:
    @idempotent_function(key="order_id", name="tests.outbox.ship")
    def ship(order_id: int, *, idempotency: Claim) -> str:
        return idempotency.enqueue(receipt, order_id)

    message = ship(order_id=5)
    assert ship(order_id=5) == message
    assert sent_ids() == [message]


def test_enqueue_refuses_what_cannot_be_sent(post: Post, key: str) -> None:
    cases = {1: (print, 1), 2: (receipt, timezone.now())}

    @idempotent_function(key="order_id", name="tests.outbox.refuse")
    def refuse(order_id: int, *, idempotency: Claim) -> None:
        idempotency.enqueue(*cases[order_id])

    with pytest.raises(TypeError, match="takes a Celery task"):
        refuse(order_id=1)
    with pytest.raises(TypeError, match="serialise to JSON"):
        refuse(order_id=2)
    assert OutboxMessage.objects.count() == 0


def test_a_name_is_staged_once_per_attempt() -> None:
    @idempotent_function(key="order_id", name="tests.outbox.twice")
    def twice(order_id: int, *, idempotency: Claim) -> None:
        idempotency.enqueue(receipt, 1, name="a")
        idempotency.enqueue(receipt, 2, name="a")

    with pytest.raises(ValueError, match="already staged"):
        twice(order_id=1)
    assert OutboxMessage.objects.count() == 0


@pytest.mark.parametrize(
    ("ending", "orders"),
    [({"status": 503}, 0), ({"status": 429}, 0), ({"status": 500}, 0), ({"no_store": True}, 1)],
    ids=["503", "429", "500", "no_store"],
)
def test_an_atomic_view_answering_a_retryable_status_rolls_its_writes_back(
    post: Post, key: str, ending: dict[str, Any], orders: int
) -> None:
    """Atomic mode: a response that says "try again" rolls back what the view wrote with its
    claim and its messages, so the retry charges once and sends the receipt (the charge was
    committed and its message dropped); ``no_store`` keeps the view's work (the client may
    use the response), and sends nothing."""
    from tests.testapp.models import Execution

    first = post("/atomic/", {"order": "1", **ending}, key=key)
    assert first.status_code == ending.get("status", 201)
    assert Execution.objects.filter(label="order").count() == orders
    assert IdempotencyKey.objects.count() == 0
    assert OutboxMessage.objects.count() == 0 and receipt.sent == []
    retry = post("/atomic/", {"order": "1"}, key=key)
    assert retry.status_code == 201
    assert Execution.objects.filter(label="order").count() == orders + 1
    assert sent_ids() == retry.json()["messages"]


@override_settings(IDEMPOTENCY=NO_FAST_PATH)
def test_without_the_fast_path_the_relay_delivers(post: Post, key: str) -> None:
    ids = post("/order/", {"order": "1"}, key=key).json()["messages"]
    assert receipt.sent == []
    assert states() == dict.fromkeys(ids, "pending")
    call_command("idempotency_relay", "--once", verbosity=0)
    assert sent_ids() == ids
    assert states() == dict.fromkeys(ids, "sent")
    assert list(OutboxMessage.objects.values_list("attempts", flat=True)) == [1, 1]


def test_the_relay_leaves_the_fast_paths_messages_to_it_until_the_lease_passes(
    post: Post, key: str
) -> None:
    receipt.failing = 2  # the fast path's sends fail: the messages wait for their backoff
    post("/order/", {"order": "1"}, key=key)
    assert receipt.sent == []
    row = OutboxMessage.objects.first()
    assert row is not None and row.state == "pending" and row.attempts == 1
    assert "broker unreachable" in row.last_error
    assert row.available_at > timezone.now()
    call_command("idempotency_relay", "--once", verbosity=0)
    assert receipt.sent == []  # not due yet
    OutboxMessage.objects.update(available_at=timezone.now())
    call_command("idempotency_relay", "--once", verbosity=0)
    assert len(receipt.sent) == 2


@override_settings(IDEMPOTENCY={**NO_FAST_PATH, "OUTBOX_MAX_ATTEMPTS": 3, "OUTBOX_RETRY_DELAY": 10})
def test_failed_sends_back_off_then_end_failed_with_the_last_error(post: Post, key: str) -> None:
    post("/drf/", key=key)
    receipt.failing = 100
    delays = []
    for _ in range(3):
        before = timezone.now()
        call_command("idempotency_relay", "--once", verbosity=0)
        row = OutboxMessage.objects.get()
        delays.append(row.available_at - before)
        OutboxMessage.objects.update(available_at=timezone.now())
    row = OutboxMessage.objects.get()
    assert (row.state, row.attempts) == ("failed", 3)
    assert row.last_error == "ConnectionError: broker unreachable"
    assert timedelta(seconds=10) <= delays[0] < timedelta(seconds=11)
    assert timedelta(seconds=20) <= delays[1] < timedelta(seconds=21)
    call_command("idempotency_relay", "--once", verbosity=0)
    assert OutboxMessage.objects.get().attempts == 3  # failed for good: not taken again
    receipt.failing = 0
    store.resend(connection, [row.pk])  # the admin's re-send
    call_command("idempotency_relay", "--once", verbosity=0)
    assert OutboxMessage.objects.get().state == "sent"
    assert len(receipt.sent) == 1


def _released(count: int) -> list[str]:
    """``count`` messages released and due, as a relay finds them."""
    record = IdempotencyKey.objects.create(
        scope="s",
        key_hash=uuid.uuid4().hex,
        method="POST",
        path="/",
        request_hash="h",
        status="completed",
        expires_at=timezone.now() + timedelta(hours=1),
    )
    now = timezone.now()
    rows = [_message(record, available_at=now) for _ in range(count)]
    OutboxMessage.objects.bulk_create(rows)
    return [row.message_id for row in rows]


def _message(record: IdempotencyKey, **fields: Any) -> OutboxMessage:
    """A message of ``record`` for the receipt task (not saved), with ``fields``."""
    return OutboxMessage(
        record=record,
        message_id=str(uuid.uuid4()),
        engine="celery",
        task=receipt.name,
        arguments='{"args":[],"kwargs":{}}',
        **fields,
    )


def test_a_batch_is_leased_to_its_relay() -> None:
    ids = _released(5)
    database = using("default")
    taken = store.take(database, connection, 3, timedelta(minutes=1))
    assert [message.message_id for message in taken] == ids[:3]
    rest = store.take(database, connection, 10, timedelta(minutes=1))
    assert [message.message_id for message in rest] == ids[3:]
    assert store.take(database, connection, 10, timedelta(minutes=1)) == []


@pytest.mark.server_db
def test_concurrent_relays_never_share_a_batch() -> None:
    """Relays on threads of their own (each its own connection) take batches at once: every
    message is taken exactly once."""
    ids = _released(300)
    taken: list[list[str]] = [[] for _ in range(4)]
    start = threading.Barrier(4)
    database = using("default")

    def relay(index: int) -> None:
        try:
            start.wait()
            while batch := store.take(database, connections["default"], 7, timedelta(minutes=1)):
                taken[index] += [message.message_id for message in batch]
        finally:
            connections["default"].close()

    threads = [threading.Thread(target=relay, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [message for batch in taken for message in batch]
    assert sorted(every) == sorted(ids)
    assert sum(1 for batch in taken if batch) >= 2, "one relay took every batch"


@pytest.mark.server_db
def test_two_relays_send_each_message_once() -> None:
    ids = _released(200)
    relays = [Relay("default", batch_size=5, interval=0.1) for _ in range(2)]

    def run(relay: Relay) -> None:
        try:
            relay.run(once=True)
        finally:
            connections["default"].close()

    threads = [threading.Thread(target=run, args=(relay,)) for relay in relays]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(sent_ids()) == sorted(ids)


@pytest.mark.postgresql
@override_settings(IDEMPOTENCY=NO_FAST_PATH)
def test_a_release_notifies_the_relay_on_postgresql(post: Post, key: str) -> None:
    """The relay's listener wakes at a release's ``NOTIFY``. Its connection is its own, never
    one of Django's pool (the pool leg), which it would hold for the relay's life."""
    listener = Listener("default")
    try:
        assert listener.listen(5)
        assert getattr(listener._connection, "pool", None) is None
        assert not listener.wait(0.2)
        post("/order/", {"order": "1"}, key=key)
        assert listener.wait(5)
    finally:
        listener.drop()
    wait_for(lambda: not _listeners(), "the listener's session to end", 5)


def _listeners() -> set[int]:
    """The backends listening on the test's database (the last statement of a listener's is
    its ``LISTEN``)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND query LIKE %s AND pid <> pg_backend_pid()",
            ["LISTEN%"],
        )
        return {row[0] for row in cursor.fetchall()}


@pytest.mark.postgresql
@override_settings(IDEMPOTENCY=NO_FAST_PATH)
def test_a_relay_whose_listener_was_terminated_listens_again(post: Post, key: str) -> None:
    """The listener's backend terminated (a restart, ``pg_terminate_backend``), the relay
    listens on a new connection: a release is sent at once, not at the next poll (60 s). It
    listened again on the dead connection, which failed for good, and only polled."""
    with relay_thread(Relay("default", interval=60), 30) as thread:
        first = wait_for(_listeners, "the relay's listener", 10)
        assert len(first) == 1, first
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [next(iter(first))])
        wait_for(lambda: _listeners() - first, "the relay to listen again", 10)
        ids = post("/order/", {"order": "1"}, key=key).json()["messages"]
        wait_for(
            lambda: set(ids) <= {task_id for task_id, _, _ in receipt.sent},
            "the release's messages sent (not at the next poll, 60 s on)",
            10,
        )
    assert not thread.is_alive()


def _backlog_rows(record: IdempotencyKey, state: str, count: int, hours: float) -> None:
    """``count`` messages of ``record`` in ``state``, released ``hours`` ago."""
    released = timezone.now() - timedelta(hours=hours)
    rows = [
        _message(record, state=state, released_at=released, available_at=released)
        for _ in range(count)
    ]
    OutboxMessage.objects.bulk_create(rows, batch_size=1000)


def _record() -> IdempotencyKey:
    return IdempotencyKey.objects.create(
        scope="s",
        key_hash=uuid.uuid4().hex,
        method="POST",
        path="/",
        request_hash="h",
        status="completed",
        expires_at=timezone.now() + timedelta(hours=1),
    )


def test_the_backlog_counts_the_undelivered_messages_by_state() -> None:
    """``idempotency_stats``' figures and the relay's gauges: the pending and failed messages
    and the oldest one's age; sent ones, older still, count for nothing."""
    record = _record()
    _backlog_rows(record, "sent", 3, hours=5)
    _backlog_rows(record, "pending", 2, hours=1)
    _backlog_rows(record, "failed", 1, hours=3)
    figures = backlog("default")
    assert (figures["outbox_pending"], figures["outbox_failed"]) == (2, 1)
    assert 3 * 3600 <= figures["outbox_oldest_undelivered_age_seconds"] < 3 * 3600 + 60
    OutboxMessage.objects.exclude(state="sent").update(state="sent")
    assert backlog("default") == {
        "outbox_pending": 0,
        "outbox_failed": 0,
        "outbox_oldest_undelivered_age_seconds": None,
    }


def _plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _plan_nodes(child)


@pytest.mark.postgresql
def test_the_backlog_is_read_by_the_index_on_postgresql() -> None:
    """Read after every pass (the relay's gauges) and by ``idempotency_stats``, the backlog
    seeks the undelivered states in the ``(state, available_at)`` index. ``state <> 'sent'``
    could not: it read every sent message, millions on a large outbox."""
    record = _record()
    _backlog_rows(record, "sent", 5000, hours=2)
    _backlog_rows(record, "pending", 2, hours=1)
    _backlog_rows(record, "failed", 1, hours=1)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {OutboxMessage._meta.db_table}")
    with CaptureQueriesContext(connection) as queries:
        left = store.backlog(connection)
    assert (left.pending, left.failed) == (2, 1)
    [query] = [query["sql"] for query in queries if "GROUP BY" in query["sql"]]
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {query}")
        explained = cursor.fetchone()[0]
    [plan] = json.loads(explained) if isinstance(explained, str) else explained
    seeks = [
        node
        for node in _plan_nodes(plan["Plan"])
        if node.get("Index Name") == "django_idempotency_outbox"
        and re.search(r"\bstate\b", node.get("Index Cond", ""))
    ]
    assert seeks, json.dumps(plan, indent=1)


@pytest.mark.postgresql
def test_the_result_and_its_messages_are_one_statement_on_postgresql(post: Post, key: str) -> None:
    post("/order/", {"bare": True}, key=str(uuid.uuid4()))  # the process's first claim
    with CaptureQueriesContext(connection) as plain:
        post("/order/", {"bare": True}, key=key)
    with CaptureQueriesContext(connection) as staged:
        post("/order/", {"order": "2"}, key=str(uuid.uuid4()))
    writes = [
        query["sql"]
        for query in staged
        if query["sql"].startswith(("UPDATE", "WITH")) and "response_body" in query["sql"]
    ]
    assert len(writes) == 1 and writes[0].startswith("WITH fenced AS (UPDATE")
    # No more round trips: the fast path's mark is its own thread's. The record's life (its
    # message ids' part) is the claim's own time, not read back.
    assert len(staged) == len(plain)
    marks = 'UPDATE "django_idempotency_outboxmessage"'
    assert not any(query["sql"].startswith(marks) for query in staged)
    assert not any('"created_at"' in query["sql"] for query in staged[len(plain) :])


def test_a_request_staging_nothing_runs_no_more_statements(post: Post, key: str) -> None:
    with CaptureQueriesContext(connection) as queries:
        post("/order/", {"order": "1", "bare": True}, key=key)
    assert not any("outbox" in query["sql"] for query in queries)


def test_the_relay_stops_on_sigterm_while_it_waits_for_work() -> None:
    """Stopped once its first pass is done and it waits for work (60 s): it ends long before
    the interval's end. Stopped after a fixed 0.3 s, a loaded machine's relay could still be
    in its first pass, and the wait went untested."""
    relay = Relay("default", interval=60)
    waiting = threading.Event()
    wait = relay._wait

    def waits(*args: Any) -> Any:
        waiting.set()
        return wait(*args)

    relay._wait = waits  # type: ignore[method-assign]
    stopped: list[float] = []

    def stop() -> None:
        if waiting.wait(30):
            stopped.append(time.monotonic())
        relay.stop()

    stopper = threading.Thread(target=stop)
    stopper.start()
    with relay_here():
        relay.run()
    ended = time.monotonic()
    stopper.join()
    assert stopped, "the relay never waited for work"
    # Prompt: long before the interval's end (a loaded machine may take seconds to get there).
    assert ended - stopped[0] < 15


def test_the_relay_process_ends_cleanly_on_sigterm(post: Post, key: str) -> None:
    """A relay started as operators start it (``manage.py idempotency_relay``) exits with
    status 0 and its summary soon after ``SIGTERM``, sent as soon as it says the signals are
    handled: in its pass or its wait, either ends the same (the wait's stop is the test
    above)."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from tests.conftest import worker_environment

    relay = subprocess.Popen(
        [sys.executable, "-m", "django", "idempotency_relay", "--interval", "60", "-v", "2"],
        cwd=Path(__file__).resolve().parent.parent,
        env={**worker_environment(), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    output = b""
    try:
        assert relay.stdout is not None
        # Its cue that the signals are handled (a fixed sleep lost the race under load).
        while b"Relaying;" not in output:
            line = relay.stdout.readline()
            assert line, f"the relay ended before relaying: {output!r}"
            output += line
        assert relay.poll() is None
        started = time.monotonic()
        relay.send_signal(signal.SIGTERM)
        assert relay.wait(timeout=30) == 0
        assert time.monotonic() - started < 15  # long before the interval's end
    finally:
        if relay.poll() is None:
            relay.kill()
    assert b"Sent 0 message(s)" in output + (relay.stdout.read() if relay.stdout else b"")


def test_async_views_enqueue(post: Post, key: str) -> None:
    response = post("/async/", {"order": "1"}, key=key)
    assert response.status_code == 201
    assert sent_ids() == response.json()["messages"]


def test_stats_and_cleanup(post: Post, key: str) -> None:
    post("/order/", {"order": "1"}, key=key)
    out = json.loads(_stats())
    assert out["outbox_pending"] == 0
    with override_settings(IDEMPOTENCY=NO_FAST_PATH):
        post("/order/", {"order": "2"}, key=str(uuid.uuid4()))
    out = json.loads(_stats())
    assert out["outbox_pending"] == 2
    assert out["outbox_oldest_undelivered_age_seconds"] >= 0
    IdempotencyKey.objects.all().delete()  # expired and cleaned up
    call_command("idempotency_cleanup", verbosity=0)
    # The delivered messages went with their record; the undelivered ones wait for the relay.
    assert sorted(OutboxMessage.objects.values_list("state", flat=True)) == ["pending", "pending"]


def _stats() -> str:
    from io import StringIO

    out = StringIO()
    call_command("idempotency_stats", "--json", stdout=out)
    return out.getvalue()


def test_the_admin_shows_a_records_messages_and_re_sends_them(
    post: Post, key: str, admin_client: Client
) -> None:
    receipt.failing = 2
    post("/order/", {"order": "1"}, key=key)
    record = IdempotencyKey.objects.get()
    page = admin_client.get(f"/admin/django_idempotency/idempotencykey/{record.pk}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    for message in OutboxMessage.objects.all():
        assert message.message_id in text
    assert "ConnectionError: broker unreachable" in text
    # The list: a read-only title, and each message's last error in a column.
    listing = admin_client.get("/admin/django_idempotency/outboxmessage/").content.decode()
    assert "<title>Outbox messages |" in listing and "to change" not in listing
    assert '<th scope="col" class="column-error">' in listing
    assert listing.count('title="ConnectionError: broker unreachable"') == 2
    response = admin_client.post(
        "/admin/django_idempotency/outboxmessage/",
        {
            "action": "resend",
            "_selected_action": list(OutboxMessage.objects.values_list("pk", flat=True)),
        },
    )
    assert response.status_code == 302
    assert all(row.available_at <= timezone.now() for row in OutboxMessage.objects.all())
    call_command("idempotency_relay", "--once", verbosity=0)
    assert len(receipt.sent) == 2
    assert set(OutboxMessage.objects.values_list("state", flat=True)) == {"sent"}


def test_a_configured_outbox_with_nothing_to_deliver_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django_idempotency._ops import checks

    with override_settings(IDEMPOTENCY={"OUTBOX_BATCH_SIZE": 10}):
        monkeypatch.setattr(checks, "_outbox_deliverable", lambda: True)  # Celery, or TASKS
        assert checks.e056_outbox_undeliverable({"OUTBOX_BATCH_SIZE": 10}) == []
        monkeypatch.setattr(checks, "_outbox_deliverable", lambda: False)
        [error] = checks.check_settings()
        assert error.id == "django_idempotency.E056"
    assert checks.e056_outbox_undeliverable({}) == []


def test_an_expired_key_used_again_sends_its_new_messages(post: Post, key: str) -> None:
    """An expired record claimed again keeps its primary key but starts a new life (attempt 1):
    its messages are new ones, with new ids, and are sent."""
    first = post("/order/", {"order": "1"}, key=key).json()["messages"]
    IdempotencyKey.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    again = post("/order/", {"order": "1"}, key=key)
    assert again.status_code == 201 and "Idempotent-Replayed" not in again
    second = again.json()["messages"]
    assert IdempotencyKey.objects.get().attempt == 1
    assert not set(first) & set(second)
    assert sent_ids() == first + second


def test_erasing_a_scope_deletes_its_delivered_messages(post: Post, key: str) -> None:
    post("/order/", {"order": "1"}, key=key)
    scope = IdempotencyKey.objects.get().scope
    assert OutboxMessage.objects.count() == 2
    call_command("idempotency_cleanup", "--scope", scope, verbosity=0)
    assert IdempotencyKey.objects.count() == 0
    assert OutboxMessage.objects.count() == 0


def test_a_web_process_dead_after_the_commit_leaves_its_messages_to_the_relay(
    post: Post, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast path never ran (the process died between the commit and the send): the
    messages are leased to it, so the relay leaves them until the lease has passed, then sends
    them."""
    from django_idempotency._call import outbox

    handed: list[str] = []

    def died(store: Any, keyed: Any) -> None:  # the process gone before it sent them
        handed.extend(message.message_id for _, message in keyed)

    monkeypatch.setattr(outbox, "deliver", died)
    ids = post("/order/", {"order": "1"}, key=key).json()["messages"]
    assert handed == ids  # the fast path's one way, cut: nothing else sent them
    assert states() == dict.fromkeys(ids, "pending")
    call_command("idempotency_relay", "--once", verbosity=0)
    assert receipt.sent == []
    OutboxMessage.objects.update(available_at=timezone.now())  # the lease has passed
    call_command("idempotency_relay", "--once", verbosity=0)
    assert sorted(sent_ids()) == sorted(ids)


@pytest.fixture
def dead_broker() -> Iterator[str]:
    """A broker address that accepts connections (the kernel completes the handshake of a
    listening socket) and never answers: Celery waits out its connect timeout (4 s)."""
    import socket

    pytest.importorskip("celery")
    from tests.testapp import broker_tasks

    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    port = listener.getsockname()[1]
    broker_tasks.use_broker(f"amqp://guest:guest@127.0.0.1:{port}//")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        broker_tasks.use_broker("memory://")
        listener.close()


@pytest.mark.celery  # a real Celery app: CI's celery leg, where Celery is installed
def test_a_dead_broker_never_holds_the_response(
    client: Client, key: str, dead_broker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast path sends on its own thread after the commit: a broker that never answers
    costs that thread its connect timeout, not the request (it was 4.1 s per request); the
    message, left pending with its error, is the relay's once a broker works."""
    from tests.testapp.broker_tasks import app

    response = _answered_before_the_send(client, monkeypatch, {"Idempotency-Key": key})
    message_id = response.json()["message"]
    row = OutboxMessage.objects.get()
    assert (row.message_id, row.state) == (message_id, "pending")
    assert row.last_error  # the broker's timeout, recorded
    # A broker that works: the relay delivers it once its backoff has passed.
    from tests.testapp.broker_tasks import use_broker

    use_broker("memory://")
    OutboxMessage.objects.update(available_at=timezone.now())
    call_command("idempotency_relay", "--once", verbosity=0)
    assert OutboxMessage.objects.get().state == "sent"
    with app.connection_for_read() as broker:
        queue = broker.SimpleQueue("celery")
        try:
            delivered = queue.get(timeout=1)
            assert delivered.headers["id"] == message_id
            delivered.ack()
        finally:
            queue.close()


@pytest.mark.celery  # a real Celery app: CI's celery leg, where Celery is installed
def test_a_dead_broker_never_holds_a_keyless_response(
    client: Client, dead_broker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request without a key sends what its view staged on the fast path's thread too
    (issue 49: it sent in the request's thread, before the response, 4 s per request on AMQP
    and for good on a Redis broker); the message is lost, with a log line."""
    _answered_before_the_send(client, monkeypatch, {})
    assert OutboxMessage.objects.count() == 0  # no record: nothing kept


def _answered_before_the_send(
    client: Client, monkeypatch: pytest.MonkeyPatch, headers: dict[str, str]
) -> Any:
    """POST ``/notify/`` (it stages a message) to a dead broker: the ``201`` comes in well
    under the broker's timeout (generous: the request takes milliseconds, the timeout 4 s),
    and the send, once the sender thread settles, was not the request's thread's (the
    deterministic part)."""
    senders: list[int] = []
    send = outbox.send

    def recorded(*args: Any) -> None:
        senders.append(threading.get_ident())
        send(*args)

    monkeypatch.setattr(outbox, "send", recorded)
    started = time.monotonic()
    response = client.post("/notify/", headers=headers)
    elapsed = time.monotonic() - started
    assert response.status_code == 201
    assert elapsed < 1.5, f"the response waited {elapsed:.2f} s"
    assert outbox.sender.settle(60), "the fast path's thread is stuck"
    assert senders and threading.get_ident() not in senders
    return response


@override_settings(IDEMPOTENCY={**NO_FAST_PATH, "OUTBOX_MAX_ATTEMPTS": 1})
def test_the_relay_lists_and_re_sends_failed_messages(post: Post, key: str) -> None:
    """Cron and runbooks: ``--failed`` lists the failed messages with their last error,
    ``--retry-failed --dry-run`` says what it would send again and changes nothing,
    ``--retry-failed --once`` sends them."""
    from io import StringIO

    from django.core.management import CommandError

    def relay(*args: str) -> str:
        out = StringIO()
        call_command("idempotency_relay", *args, stdout=out)
        return out.getvalue()

    ids = post("/order/", {"order": "1"}, key=key).json()["messages"]
    receipt.failing = 2
    relay("--once")
    assert states() == dict.fromkeys(ids, "failed")
    listed = relay("--failed").splitlines()
    assert [entry.split()[0] for entry in listed[:-1]] == ids
    assert all("ConnectionError: broker unreachable" in entry for entry in listed[:-1])
    assert listed[-1] == "2 message(s) failed."
    dry = relay("--retry-failed", "--dry-run").splitlines()
    assert dry[-1] == "2 message(s) would be sent again."
    assert states() == dict.fromkeys(ids, "failed") and receipt.sent == []
    out = relay("--retry-failed", "--once")
    assert "2 failed message(s) made pending again." in out
    assert sorted(sent_ids()) == sorted(ids)
    assert states() == dict.fromkeys(ids, "sent")
    assert relay("--failed").splitlines() == ["0 message(s) failed."]
    with pytest.raises(CommandError, match="--dry-run goes with --retry-failed"):
        relay("--dry-run")


@pytest.mark.parametrize("debug", [False, True], ids=["production", "debug"])
def test_an_error_text_no_column_keeps_is_written_escaped(debug: bool) -> None:
    """A send's exception text is the project's: a NUL in it (PostgreSQL's text refuses one:
    the relay's write failed) or a lone surrogate is written escaped, on every database."""
    (message_id,) = _released(1)
    with override_settings(DEBUG=debug):
        assert store.mark_failed(connection, message_id, "bad\x00id \udc80", None, counted=False)
    assert OutboxMessage.objects.get().last_error == "bad\\x00id \\udc80"


def test_a_recovery_point_set_again_under_its_name_keeps_each_message() -> None:
    """A loop that stages a message per item and marks each item done with the same point's
    name (its data saying how far): the takeover resumes at the last item done, and the
    message it stages for the next item is a new one, not the previous item's id (which was
    released already, so that message would never be sent)."""
    crash = {"at": 2}

    @idempotent_function(key="batch", name="tests.outbox.items")
    def items(batch: int, *, idempotency: Claim) -> None:
        done = (idempotency.recovery_data or {}).get("done", -1)
        for item in range(done + 1, 4):
            idempotency.enqueue(receipt, item)
            if item == crash["at"]:
                raise RuntimeError("the worker died mid-batch")
            idempotency.set_recovery_point("item", {"done": item})

    with pytest.raises(RuntimeError):
        items(batch=1)
    crash["at"] = -1
    items(batch=1)
    assert IdempotencyKey.objects.get().attempt == 2
    sent_ids()
    assert sorted(args[0] for _, args, _ in receipt.sent) == [0, 1, 2, 3]


@pytest.mark.parametrize("fails", [True, False], ids=["rolled-back", "committed"])
def test_messages_released_in_a_block_that_rolls_back_leave_with_the_result(fails: bool) -> None:
    """A recovery point written in the function's own transaction releases what was staged
    before it in that transaction; a block that then rolls back (its exception caught, the
    function goes on) takes the release with it, and the result releases those messages.
    Committed, the block's release stands, and the result sends nothing twice."""

    @idempotent_function(key="order_id", name="tests.outbox.optional_step")
    def ship(order_id: int, *, idempotency: Claim) -> list[str]:
        first = idempotency.enqueue(receipt, order_id)
        try:
            with transaction.atomic():
                idempotency.set_recovery_point("gift-wrapped")
                if fails:
                    raise RuntimeError("the optional step failed")
        except RuntimeError:
            pass
        return [first, idempotency.enqueue(receipt, order_id, name="shipped")]

    messages = ship(order_id=9)
    assert sorted(sent_ids()) == sorted(messages)
    assert states() == dict.fromkeys(messages, "sent")


def test_the_fast_path_thread_gives_its_connection_back_once_idle(post: Post, key: str) -> None:
    """The sender thread marks the messages on a connection of its own; once its queue is
    empty the store takes it back (``CONN_MAX_AGE`` 0: closed), as at a request's end. Kept, a
    web worker's sender held a connection of every process for good."""
    post("/order/", {"order": "1"}, key=key)
    assert states() and set(states().values()) == {"sent"}  # marked on the sender's connection
    closed: list[bool] = []
    outbox.sender.hand("default", lambda: closed.append(connections["default"].connection is None))
    assert outbox.sender.settle()
    assert closed == [True]


def test_messages_released_on_a_connection_closed_since_are_sent_without_connecting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The result write committed, then its connection closed (a fault met after the commit):
    the fast path sends at once; asking the closed connection whether a transaction is open
    connected to a database that was down, and the stored result was answered 500 (a soak's
    MariaDB run)."""
    from django.db.utils import OperationalError

    connections["default"].close()

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("the database is down")

    monkeypatch.setattr(connections["default"], "connect", refuse)
    sent: list[str] = []
    outbox.after_commits(using("default"), lambda: sent.append("sent"))
    assert sent == ["sent"]


def test_each_store_s_outbox_hands_the_relay_one_type_marked_by_its_key() -> None:
    """The database's outbox and the Redis store's each had a ``Taken`` of their own (the
    database's marked by ``message_id``, Redis's by ``id``): one type of the contract's now,
    its ``key`` what the store's ``mark_sent`` takes."""
    from django_idempotency._store import contract
    from django_idempotency._store.redis import outbox as redis_outbox

    assert store.Taken is redis_outbox.Taken is contract.Taken
    ids = _released(2)
    taken = store.take(using("default"), connection, 10, timedelta(minutes=1))
    assert [message.key for message in taken] == ids
    assert store.mark_sent(connection, [message.key for message in taken], counted=True) == 2
