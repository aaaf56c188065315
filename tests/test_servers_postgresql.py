"""Real servers, real processes, a real database server: what in-process tests cannot show.

gunicorn (4 sync workers) and uvicorn serve ``tests/servers`` against this run's test database;
httpx drives them. Workers are SIGKILLed mid-request, a database backend is terminated under a
view, and the figures (storm outcomes, a waiter's statements per second) are printed: run with
``-s`` to see them.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connection, connections
from django.utils import timezone

from django_idempotency import IdempotencyKey
from django_idempotency._base.keys import hash_key
from tests.conftest import executions
from tests.servers import harness
from tests.testapp.models import Execution
from tests.vendors import IN_TRANSACTION, TERMINATE
from tests.waiting import wait_for

pytestmark = [pytest.mark.server_db, pytest.mark.django_db(transaction=True)]

TIMEOUT = 30.0
Response = httpx.Response


@pytest.fixture(scope="module")
def server_database(django_db_setup: None, django_db_blocker: Any) -> str:
    with django_db_blocker.unblock():
        assert connection.vendor != "sqlite"
        return str(connections["default"].settings_dict["NAME"])


def serving(request: pytest.FixtureRequest, server: harness.Server) -> Iterator[harness.Server]:
    server.start()
    failed_before = request.session.testsfailed
    try:
        yield server
    finally:
        server.stop()
        if request.session.testsfailed > failed_before:
            # Past pytest's capture: a module fixture's teardown output is shown for no test.
            reporter = request.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_line(f"\n----- {server.name} log -----\n{server.log()}")
        server.discard_log()


@pytest.fixture(scope="module")
def wsgi(request: pytest.FixtureRequest, server_database: str) -> Iterator[harness.Server]:
    yield from serving(request, harness.gunicorn(server_database, workers=4))


@pytest.fixture(scope="module")
def asgi(request: pytest.FixtureRequest, server_database: str) -> Iterator[harness.Server]:
    yield from serving(request, harness.uvicorn(server_database))


def post(server: harness.Server, path: str, key: str, body: Any = None, **headers: str) -> Response:
    return httpx.post(
        server.url + path,
        json={"amount": 4200} if body is None else body,
        headers={"Idempotency-Key": key, **{k.replace("_", "-"): v for k, v in headers.items()}},
        timeout=TIMEOUT,
    )


def post_dying(server: harness.Server, path: str, key: str, **headers: str) -> None:
    """A request whose worker is SIGKILLed: the connection drops with no response."""
    with pytest.raises(httpx.TransportError):
        post(server, path, key, **headers)


def in_background(call: Callable[[], Response]) -> Callable[[], Response]:
    """Start ``call`` in a thread; the returned function joins it (bounded) for its response."""
    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(call)
    pool.shutdown(wait=False)
    return lambda: future.result(timeout=TIMEOUT)


def storm(
    count: int, server: harness.Server, path: str, key: Callable[[int], str], **headers: str
) -> list[Response]:
    """``count`` POSTs from ``count`` threads, released together by a barrier."""
    barrier = threading.Barrier(count)
    clients = [httpx.Client(timeout=TIMEOUT) for _ in range(count)]

    def send(index: int) -> Response:
        barrier.wait(timeout=TIMEOUT)
        return clients[index].post(
            server.url + path,
            json={"amount": 4200},
            headers={"Idempotency-Key": key(index), **headers},
        )

    try:
        with ThreadPoolExecutor(max_workers=count) as pool:
            return list(pool.map(send, range(count), timeout=2 * TIMEOUT))
    finally:
        for client in clients:
            client.close()


def outcome(response: Response) -> str:
    assert response.status_code in (201, 409), response.text
    if response.status_code == 409:
        assert response.headers["Retry-After"]
        assert problem_slug(response) == "request-in-progress"
        return "409"
    return "replay" if response.headers.get("Idempotent-Replayed") == "true" else "executed"


def problem_slug(response: Response) -> str:
    assert response.headers["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == response.status_code
    return str(body["type"].rsplit("#", 1)[1])


def record(key: str) -> IdempotencyKey:
    return IdempotencyKey.objects.get(key_hash=hash_key(key))


def wait_for_claim(key: str) -> None:
    """Until the key's record is committed: a request sent in the background has claimed it."""
    wait_for(IdempotencyKey.objects.filter(key_hash=hash_key(key)).exists, f"the claim of {key}")


def wait_until_stale(key: str) -> None:
    """Sleep until the record's ``unlock_at`` has passed (by the database's clock too)."""
    unlock_at = record(key).unlock_at
    assert unlock_at is not None
    time.sleep(max(0.0, (unlock_at - timezone.now()).total_seconds()) + 0.1)


def assert_409(response: Response) -> None:
    assert response.status_code == 409, response.text
    assert problem_slug(response) == "request-in-progress"
    assert int(response.headers["Retry-After"]) >= 1


def assert_replay_of(response: Response, original: Response) -> None:
    assert response.status_code == original.status_code, response.text
    assert response.headers["Idempotent-Replayed"] == "true"
    assert response.content == original.content


# 1. Storm ----------------------------------------------------------------------------------


def report_storm(name: str, counts: Counter[str]) -> None:
    print(
        f"\n[storm {name}] executions={counts['executed']} replays={counts['replay']} "
        f"409s={counts['409']}"
    )


def assert_storm_executes_once(server: harness.Server, path: str, label: str) -> list[Any]:
    """50 identical requests at once: one execution; the rest replay it or answer 409."""
    name = path.strip("/")
    key = str(uuid.uuid4())
    responses = storm(50, server, path, lambda _: key, **{"X-Sleep": "0.5"})
    counts = Counter(outcome(response) for response in responses)
    report_storm(label, counts)
    assert executions(name) == 1
    assert counts["executed"] == 1
    assert counts["replay"] + counts["409"] == 49
    executed = next(r for r in responses if outcome(r) == "executed")
    for response in responses:
        if outcome(response) == "replay":
            assert_replay_of(response, executed)
    for response in storm(10, server, path, lambda _: key):
        assert_replay_of(response, executed)
    assert executions(name) == 1
    return responses


def test_storm_on_gunicorn_executes_once(wsgi: harness.Server) -> None:
    responses = assert_storm_executes_once(wsgi, "/slow/", "gunicorn, 4 sync workers, 50 identical")
    # Several worker processes answered, not one.
    assert len({r.headers["X-Worker-Pid"] for r in responses}) > 1


def test_storm_on_uvicorn_with_an_async_view_executes_once(asgi: harness.Server) -> None:
    assert_storm_executes_once(asgi, "/async-slow/", "uvicorn, async view, 50 identical")


# 2. No false conflicts ---------------------------------------------------------------------


def test_a_nul_in_a_tenant_s_url_through_gunicorn_is_refused(wsgi: harness.Server) -> None:
    """gunicorn hands ``/t/a%00zz/`` to Django as the tenant ``a\x00zz``. PostgreSQL's libpq
    cut the scope at the NUL: the second tenant was replayed the first's response (issue 48).
    Now a ``400`` before any claim, as on every database and store."""
    key = str(uuid.uuid4())
    first = post(wsgi, "/t/a/orders/", key)
    assert (first.status_code, first.json()) == (201, {"tenant": "a"})
    joined = post(wsgi, "/t/a%00zz/orders/", key)
    assert joined.status_code == 400, joined.text
    assert problem_slug(joined) == "invalid-scope"
    assert "NUL" in joined.json()["detail"]
    assert list(
        Execution.objects.filter(label="tenant-order").values_list("payload", flat=True)
    ) == ["a"]
    assert list(IdempotencyKey.objects.values_list("scope", flat=True)) == ["tenant:a"]


@pytest.mark.parametrize("server_name,path", [("wsgi", "/slow/"), ("asgi", "/async-slow/")])
def test_fifty_distinct_keys_give_fifty_executions(
    request: pytest.FixtureRequest, server_name: str, path: str
) -> None:
    server = request.getfixturevalue(server_name)
    prefix = str(uuid.uuid4())
    responses = storm(50, server, path, lambda index: f"{prefix}-{index}", **{"X-Sleep": "0.1"})
    assert [response.status_code for response in responses] == [201] * 50
    assert not any(r.headers.get("Idempotent-Replayed") for r in responses)
    assert Execution.objects.count() == 50
    assert IdempotencyKey.objects.filter(status="completed").count() == 50


# 3. Crash ----------------------------------------------------------------------------------


def test_killed_worker_is_taken_over_by_exactly_one_retry_after_unlock_at(
    wsgi: harness.Server,
) -> None:
    key = str(uuid.uuid4())
    post_dying(wsgi, "/crash/", key, X_Kill="1")
    dead = record(key)
    assert dead.status == "processing"
    assert executions("crash") == 1
    # Until unlock_at the dead attempt's record is owned: retries get 409, nothing runs.
    retries_before = 0
    while timezone.now() < dead.unlock_at - timedelta(seconds=0.7):
        assert_409(post(wsgi, "/crash/", key))
        retries_before += 1
        time.sleep(0.1)
    assert retries_before >= 1
    assert executions("crash") == 1
    wait_until_stale(key)
    # A burst of retries after unlock_at: exactly one takes the record over.
    responses = storm(8, wsgi, "/crash/", lambda _: key)
    counts = Counter(outcome(response) for response in responses)
    assert counts["executed"] == 1, counts
    taker = next(r for r in responses if outcome(r) == "executed")
    assert taker.json()["attempt"] == 2
    assert executions("crash") == 2
    assert record(key).status == "completed"
    for response in responses:
        if outcome(response) == "replay":
            assert_replay_of(response, taker)
    assert_replay_of(post(wsgi, "/crash/", key), taker)
    assert "Took over stale idempotency record" in wsgi.log()


# 4. Late owner -----------------------------------------------------------------------------


def test_late_owner_result_is_refused_and_the_new_owner_result_stays(
    wsgi: harness.Server,
) -> None:
    key = str(uuid.uuid4())
    first = in_background(lambda: post(wsgi, "/late/", key, X_Sleep="2.5"))
    wait_for_claim(key)
    wait_until_stale(key)
    # The retry takes the record over and is still running when the late owner finishes, so
    # only the lock token (not the status) tells the two apart.
    second = in_background(lambda: post(wsgi, "/late/", key, X_Sleep="2.5"))
    wait_for(lambda: record(key).attempt == 2, "the takeover")
    late = first()
    # The late owner's own client still gets what its view returned...
    assert late.status_code == 201 and late.json()["attempt"] == 1
    # ...but its result was refused: logged, and the signal sent in the worker (its receiver
    # wrote this row). The record still belongs to the running new owner.
    assert Execution.objects.get(label="late-refused").payload == "1"
    assert "finished after its lock was taken over" in wsgi.log()
    taken = record(key)
    assert taken.status == "processing" and taken.response_body is None
    new_owner = second()
    assert outcome(new_owner) == "executed"
    assert new_owner.json()["attempt"] == 2
    # The stored response is the new owner's: it is what every retry is replayed.
    stored = record(key)
    assert stored.status == "completed"
    assert bytes(stored.response_body) == new_owner.content
    assert_replay_of(post(wsgi, "/late/", key), new_owner)
    assert executions("late") == 2


# 5. Wait mode ------------------------------------------------------------------------------


def test_waiters_get_the_replay_and_poll_gently(wsgi: harness.Server) -> None:
    key = str(uuid.uuid4())
    first = in_background(lambda: post(wsgi, "/wait/", key, X_Sleep="2"))
    wait_for_claim(key)
    waiters = storm(3, wsgi, "/wait/", lambda _: key)
    original = first()
    assert outcome(original) == "executed"
    for waiter in waiters:
        assert_replay_of(waiter, original)
    assert executions("wait") == 1
    rates = []
    for waiter in waiters:
        statements = int(waiter.headers["X-Db-Statements"])
        elapsed = float(waiter.headers["X-Elapsed"])
        rates.append(statements / elapsed)
        print(
            f"\n[wait mode] one waiter: {statements} statements in {elapsed:.2f}s "
            f"= {statements / elapsed:.1f} statements/s"
        )
    # Backoff, not a busy loop (which would issue hundreds per second).
    assert max(rates) < 20


def test_many_waiters_on_uvicorn_all_get_the_replay(asgi: harness.Server) -> None:
    key = str(uuid.uuid4())
    first = in_background(lambda: post(asgi, "/async-wait/", key, X_Sleep="1.5"))
    wait_for_claim(key)
    waiters = storm(20, asgi, "/async-wait/", lambda _: key)
    original = first()
    assert outcome(original) == "executed"
    for waiter in waiters:
        assert_replay_of(waiter, original)
    assert executions("async-wait") == 1


def test_a_waiter_gets_409_once_wait_timeout_passes(wsgi: harness.Server) -> None:
    key = str(uuid.uuid4())
    first = in_background(lambda: post(wsgi, "/wait-short/", key, X_Sleep="2"))
    wait_for_claim(key)
    waiter = post(wsgi, "/wait-short/", key)
    assert_409(waiter)
    assert float(waiter.headers["X-Elapsed"]) >= 0.5  # it did wait, wait_timeout=0.5
    assert outcome(first()) == "executed"
    assert executions("wait-short") == 1


# 6. Atomic mode ----------------------------------------------------------------------------


def in_transaction_backends() -> int:
    """Server backends on this database sitting in an open transaction."""
    if connection.vendor == "mysql":
        # InnoDB refreshes information_schema.innodb_trx only after 0.1 s without a read of
        # it: polled faster, it never changes.
        time.sleep(0.11)
    with connection.cursor() as cursor:
        cursor.execute(IN_TRANSACTION[connection.vendor])
        return int(cursor.fetchone()[0])


def test_atomic_duplicates_wait_for_the_commit_and_get_the_replay(wsgi: harness.Server) -> None:
    key = str(uuid.uuid4())
    first = in_background(lambda: post(wsgi, "/atomic/", key, X_Sleep="1.5"))
    wait_for(in_transaction_backends, "the first attempt's open transaction")
    # Uncommitted: the test process sees neither the record nor the side effect.
    assert not IdempotencyKey.objects.filter(key_hash=hash_key(key)).exists()
    duplicates = storm(3, wsgi, "/atomic/", lambda _: key)
    original = first()
    assert outcome(original) == "executed"
    for duplicate in duplicates:
        assert_replay_of(duplicate, original)
    assert executions("atomic") == 1


def test_atomic_duplicate_gets_409_after_a_bounded_lock_wait(wsgi: harness.Server) -> None:
    key = str(uuid.uuid4())
    first = in_background(lambda: post(wsgi, "/atomic-short/", key, X_Sleep="2"))
    wait_for(in_transaction_backends, "the first attempt's open transaction")
    duplicate = post(wsgi, "/atomic-short/", key)
    assert_409(duplicate)
    assert outcome(first()) == "executed"
    assert executions("atomic-short") == 1


def test_atomic_worker_killed_mid_transaction_leaves_no_trace(wsgi: harness.Server) -> None:
    key = str(uuid.uuid4())
    post_dying(wsgi, "/atomic/", key, X_Kill="1")
    # The immediate retry runs the view: no record, no stale lock, no side effect were left.
    retry = post(wsgi, "/atomic/", key)
    assert outcome(retry) == "executed"
    assert retry.json()["attempt"] == 1
    assert executions("atomic") == 1
    assert record(key).status == "completed"


# 7. Database faults ------------------------------------------------------------------------


def test_store_refusing_connections_is_503_and_the_view_does_not_run(
    wsgi: harness.Server,
) -> None:
    response = post(wsgi, "/refusing/", str(uuid.uuid4()))
    assert response.status_code == 503, response.text
    assert problem_slug(response) == "idempotency-unavailable"
    assert executions("refusing") == 0
    assert "unavailable; the view was not run" in wsgi.log()


def test_database_lost_before_the_result_is_stored_is_stored_on_a_new_connection(
    wsgi: harness.Server, tmp_path: Path
) -> None:
    """The worker's connection is terminated while the view runs (in its sleep, once its own
    insert has returned): the owner stores its result on a new connection (issue 25), so the
    view ran once and a retry is replayed. It used to give the result up, and a retry ran the
    view again once the lock expired."""
    key = str(uuid.uuid4())
    started = tmp_path / "started"
    headers = {"X_Sleep": "1", "X_Started_File": str(started)}
    first = in_background(lambda: post(wsgi, "/lose-db/", key, **headers))
    wait_for(started.exists, "the view's insert of its backend pid")
    noted = Execution.objects.get(label="lose-db")
    backend, attempt = noted.payload.split(":")
    assert attempt == "1"
    with connection.cursor() as cursor:
        cursor.execute(TERMINATE[connection.vendor], [int(backend)])
    answered = first()
    assert outcome(answered) == "executed"
    stored = record(key)
    assert stored.status == "completed"
    assert "again on a new connection" in wsgi.log()
    assert_replay_of(post(wsgi, "/lose-db/", key), answered)
    assert executions("lose-db") == 1


# 8. Recovery points ------------------------------------------------------------------------


def test_takeover_resumes_a_killed_three_step_view_at_the_shipping_step(
    wsgi: harness.Server,
) -> None:
    key = str(uuid.uuid4())
    post_dying(wsgi, "/three-steps/", key, X_Kill_After="charge")
    dead = record(key)
    # Committed at once, before the worker died.
    assert dead.status == "processing"
    assert dead.recovery_point == "charge"
    assert dead.recovery_data["step"] == "charge"
    killed_pid = dead.recovery_data["pid"]
    assert_409(post(wsgi, "/three-steps/", key))
    wait_until_stale(key)
    resumed = post(wsgi, "/three-steps/", key)
    assert outcome(resumed) == "executed", resumed.text
    body = resumed.json()
    assert body["attempt"] == 2
    assert body["resumed_at"] == "charge"
    assert body["resumed_data"] == {"step": "charge", "pid": killed_pid}
    assert body["ran"] == ["ship"]
    for step in ("reserve", "charge", "ship"):
        assert executions(f"step-{step}") == 1
    assert_replay_of(post(wsgi, "/three-steps/", key), resumed)
    assert executions() == 3


# 9. Derived keys ---------------------------------------------------------------------------


def test_derived_key_is_stable_across_a_crash_and_its_takeover(wsgi: harness.Server) -> None:
    key = str(uuid.uuid4())
    post_dying(wsgi, "/derived/", key, X_Kill="1")
    handed_by_the_dead_attempt = Execution.objects.get(label="derived").payload
    wait_until_stale(key)
    taker = post(wsgi, "/derived/", key)
    assert outcome(taker) == "executed"
    assert taker.json()["attempt"] == 2
    assert taker.json()["payment_key"] == handed_by_the_dead_attempt
    assert uuid.UUID(handed_by_the_dead_attempt)
    assert_replay_of(post(wsgi, "/derived/", key), taker)
    other = post(wsgi, "/derived/", str(uuid.uuid4()))
    assert other.json()["payment_key"] != handed_by_the_dead_attempt
