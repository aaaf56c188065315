"""Lock renewal in one process, against the real database (SQLite and PostgreSQL): views, DRF
handlers and ``idempotent_function``, sync and async.

The renewer is a real thread on its own connection; the attempts are real calls of
``idempotent_function`` (sync, and async on an event loop). ``lock_timeout`` is 0.6 s, so a lock
is renewed every 0.2 s and a test lasts about a second.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import (
    Claim,
    IdempotencyInProgress,
    IdempotencyKey,
    LockLost,
    idempotent,
    idempotent_function,
    late_result_refused,
    lock_lost,
)
from django_idempotency._call import heartbeat
from django_idempotency._conf.options import Options
from django_idempotency.rest_framework import IdempotencyMixin
from tests.conftest import executions, on_postgresql
from tests.held import assert_held_off
from tests.testapp.models import Execution
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

LOCK = 1.0  # the shortest lock (durations.MIN_LOCK_TIMEOUT)
INTERVAL = LOCK / heartbeat.RENEWALS_PER_LOCK_TIMEOUT


@idempotent_function(
    key="message_id", payload=lambda message_id, *_, **__: message_id, lock_timeout=LOCK
)
def slow(message_id: str, seconds: float = 0.0, *, idempotency: Claim) -> int:
    time.sleep(seconds)
    Execution.objects.create(label="slow")
    return idempotency.attempt


@idempotent_function(
    key="message_id",
    payload=lambda message_id, *_, **__: message_id,
    lock_timeout=LOCK,
    heartbeat=False,
)
def slow_unrenewed(message_id: str, seconds: float = 0.0, *, idempotency: Claim) -> int:
    time.sleep(seconds)
    Execution.objects.create(label="slow")
    return idempotency.attempt


@idempotent_function(key="message_id", lock_timeout=LOCK)
async def slow_async(message_id: str, seconds: float) -> str:
    await asyncio.sleep(seconds)
    return message_id


#: How to name, and to end, a server connection on each database (SQLite has neither).
BACKEND_ID = {"postgresql": "SELECT pg_backend_pid()", "mysql": "SELECT CONNECTION_ID()"}
TERMINATE = {"postgresql": "SELECT pg_terminate_backend(%s)", "mysql": "KILL %s"}


@dataclass
class Renewals:
    """The renewer thread's connections and the statements it sent through them."""

    connections: list[BaseDatabaseWrapper] = field(default_factory=list)
    statements: list[str] = field(default_factory=list)
    backend_pids: list[int] = field(default_factory=list)
    #: The server connections that sent a renewal: a connection the renewer opened is not
    #: always one it renews through (MySQLdb's wrapper may open one for a moment to read the
    #: server's version, and close it).
    renewing_pids: list[int] = field(default_factory=list)
    #: Statements the database refused: on SQLite an owner's write that met another writer's
    #: lock is sent again in a transaction begun ``IMMEDIATE`` (``SQLiteStore.owner_write``),
    #: one renewal in two statements.
    refused: list[str] = field(default_factory=list)

    def updates(self) -> int:
        """Renewal statements the database carried out (a refused try is not a renewal)."""
        done = [sql for sql in self.statements if sql.startswith("UPDATE")]
        return len(done) - sum(sql.startswith("UPDATE") for sql in self.refused)


@pytest.fixture
def renewals(monkeypatch: pytest.MonkeyPatch) -> Iterator[Renewals]:
    """Counts the renewer's statements; afterwards, checks it stopped and closed its connection."""
    monkeypatch.setattr(heartbeat, "LINGER", 0.2)
    seen = Renewals()
    current: dict[int, int] = {}  # each wrapper's latest server connection

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.statements.append(sql)
        try:
            result = execute(sql, params, many, context)
        except Exception:
            seen.refused.append(sql)
            raise
        pid = current.get(id(context["connection"]))
        if sql.startswith("UPDATE") and pid is not None:
            seen.renewing_pids.append(pid)
        return result

    def created(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
        # The renewer's own thread, or one connecting for it (``_store.connecting``).
        if not threading.current_thread().name.startswith(heartbeat.THREAD_NAME):
            return
        seen.connections.append(connection)
        if connection.vendor in BACKEND_ID:
            with connection.cursor() as cursor:
                cursor.execute(BACKEND_ID[connection.vendor])
                seen.backend_pids.append(cursor.fetchone()[0])
                current[id(connection)] = seen.backend_pids[-1]
        # A reconnection of the same wrapper signals again: count its statements once.
        if count not in connection.execute_wrappers:
            connection.execute_wrappers.append(count)

    backends = server_connections()
    connection_created.connect(created, dispatch_uid="test-heartbeat")
    try:
        yield seen
    finally:
        connection_created.disconnect(dispatch_uid="test-heartbeat")
    assert heartbeat.renewer.live() == 0
    wait_for(lambda: not renewer_threads(), "the renewer thread to exit", 5)
    wait_for(lambda: server_connections() <= backends, "the connections to close", 5)
    # (Django never closes an in-memory SQLite database's connection: it would lose the data.)
    open_ = [c for c in seen.connections if c.connection is not None and not in_memory(c)]
    assert open_ == []


def in_memory(connection: BaseDatabaseWrapper) -> bool:
    return bool(getattr(connection, "is_in_memory_db", lambda: False)())


def server_connections() -> int:
    """The server's connections to this database that no pool holds idle (PostgreSQL; 0
    elsewhere): a connection given back to Django's pool stays open, and is no leak."""
    if not on_postgresql():
        return 0
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        count = int(cursor.fetchone()[0])
    # Django's own (5.1+): the pools made so far, one per pooled alias. Not ``.pool``, which
    # would make one.
    pools = getattr(connections["default"], "_connection_pools", {}).values()
    return count - sum(pool.get_stats().get("pool_available", 0) for pool in pools)


def renewer_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == heartbeat.THREAD_NAME]


def in_thread(call: Callable[[], Any]) -> Callable[[], Any]:
    """Run ``call`` in a thread (closing its connections after); returns its join."""
    pool = ThreadPoolExecutor(max_workers=1)

    def run() -> Any:
        try:
            return call()
        finally:
            connections.close_all()

    future = pool.submit(run)
    pool.shutdown(wait=False)
    return lambda: future.result(timeout=30)


@pytest.mark.parametrize("renewed", [True, False])
def test_an_attempt_slower_than_its_lock_timeout_keeps_its_key_while_renewed(
    renewals: Renewals, renewed: bool
) -> None:
    """Retries every 0.2 s for 3x lock_timeout: none runs while the lock is renewed, and the
    control without renewal is taken over (so this test can fail)."""
    key = str(uuid.uuid4())
    protected = slow if renewed else slow_unrenewed
    first = in_thread(lambda: protected(key, 3 * LOCK))
    wait_for(IdempotencyKey.objects.exists, "the first attempt's claim", 5)
    retries: list[Any] = []
    deadline = time.monotonic() + 2.5 * LOCK
    while time.monotonic() < deadline:
        time.sleep(INTERVAL)
        try:
            retries.append(protected(key))
        except IdempotencyInProgress as exc:
            retries.append(exc)
    if renewed:
        # The loop may run past the owner's store on a loaded machine: a replay then.
        assert_held_off(retries, 1)
        assert first() == 1
        assert executions("slow") == 1
        assert protected(key) == 1  # the stored result
        assert renewals.updates() >= 3
    else:
        assert 2 in retries  # taken over after lock_timeout: the view ran twice
        first()
        assert executions("slow") == 2
        assert renewals.updates() == 0


def test_an_async_attempt_is_renewed_too(renewals: Renewals) -> None:
    key = str(uuid.uuid4())
    done = in_thread(lambda: async_to_sync(slow_async)(key, 3 * LOCK))
    wait_for(IdempotencyKey.objects.exists, "the attempt's claim", 5)
    claimed = IdempotencyKey.objects.get()
    assert claimed.unlock_at is not None
    time.sleep(2 * LOCK)
    renewed = IdempotencyKey.objects.get()
    assert renewed.status == IdempotencyKey.Status.PROCESSING
    assert renewed.unlock_at is not None and renewed.unlock_at > claimed.unlock_at
    assert done() == key
    assert IdempotencyKey.objects.get().status == IdempotencyKey.Status.COMPLETED


def test_a_hundred_attempts_cost_one_statement_per_interval(renewals: Renewals) -> None:
    """100 concurrent long attempts of one process (async, on one event loop)."""

    async def hundred() -> list[str]:
        return await asyncio.gather(*(slow_async(str(uuid.uuid4()), 4 * LOCK) for _ in range(100)))

    started = time.monotonic()
    results = async_to_sync(hundred)()
    elapsed = time.monotonic() - started
    assert len(set(results)) == 100
    updates = renewals.updates()
    print(
        f"\n100 attempts for {elapsed:.2f}s: {updates} renewal statements, {INTERVAL:.2f}s apart"
        f" ({len(renewals.refused)} refused)"
    )
    assert 3 <= updates <= elapsed / INTERVAL + 1
    assert IdempotencyKey.objects.filter(status=IdempotencyKey.Status.COMPLETED).count() == 100


def test_a_lost_lock_is_reported_and_the_late_result_refused(
    renewals: Renewals, caplog: pytest.LogCaptureFixture
) -> None:
    """An operator releases the record while the attempt runs: the next renewal finds it gone."""
    lost: list[Claim] = []
    refused: list[Claim] = []
    lock_lost.connect(lambda claim, **_: lost.append(claim), weak=False, dispatch_uid="t1")
    late_result_refused.connect(
        lambda claim, **_: refused.append(claim), weak=False, dispatch_uid="t2"
    )
    raised: list[Exception] = []

    @idempotent_function(key="message_id", lock_timeout=LOCK)
    def watchful(message_id: str, *, idempotency: Claim) -> str:
        deadline = time.monotonic() + 10 * LOCK
        while not idempotency.lock_lost and time.monotonic() < deadline:
            time.sleep(0.02)
        for step in (
            lambda: idempotency.derived_key("payment"),
            lambda: idempotency.set_recovery_point("x"),
        ):
            try:
                step()
            except LockLost as exc:
                raised.append(exc)
        return "late"

    try:
        with caplog.at_level(logging.INFO, logger="django_idempotency"):
            done = in_thread(lambda: watchful(str(uuid.uuid4())))
            wait_for(IdempotencyKey.objects.exists, "the attempt's claim", 5)
            deleting = time.monotonic()
            deleted = IdempotencyKey.objects.all().delete()  # idempotency_recover --release
            took = time.monotonic() - deleting
            assert done() == "late"
    finally:
        lock_lost.disconnect(dispatch_uid="t1")
        late_result_refused.disconnect(dispatch_uid="t2")
    # What the one failure seen (MariaDB, a full run under load) did not say: where the record
    # was, how long the delete took, what the renewer logged.
    left = list(IdempotencyKey.objects.values_list("id", "status"))
    told = (deleted, f"{took:.2f}s", left, caplog.text[-3000:])
    assert len(lost) == 1 and lost[0].lock_lost, told
    assert refused == lost
    assert len(raised) == 2
    assert "lost its lock" in caplog.text
    assert not IdempotencyKey.objects.exists()


@idempotent_function(key="message_id", lock_timeout=LOCK, atomic=True)
def slow_atomic(message_id: str) -> bool:
    time.sleep(2 * INTERVAL)
    return heartbeat.renewer.running()


def test_nothing_is_renewed_in_atomic_mode_nor_in_a_callers_transaction(
    renewals: Renewals,
) -> None:
    """Their claim is invisible until it commits: no thread, no statement."""
    assert slow_atomic(str(uuid.uuid4())) is False
    with transaction.atomic():
        assert slow(str(uuid.uuid4()), 2 * INTERVAL) == 1
        assert not heartbeat.renewer.running()
    assert slow_unrenewed(str(uuid.uuid4()), 2 * INTERVAL) == 1
    assert not renewer_threads()
    assert renewals.statements == []


@pytest.mark.server_db
def test_renewal_survives_losing_its_connection(
    renewals: Renewals, caplog: pytest.LogCaptureFixture
) -> None:
    """The renewer's backend is terminated: it reconnects and retries; the attempt is unharmed."""
    key = str(uuid.uuid4())
    with caplog.at_level(logging.WARNING, logger="django_idempotency"):
        done = in_thread(lambda: slow(key, 5 * LOCK))
        wait_for(lambda: renewals.renewing_pids, "a renewal", 5)
        with connections["default"].cursor() as cursor:
            cursor.execute(TERMINATE[cursor.db.vendor], [renewals.renewing_pids[-1]])
        assert done() == 1
    assert "Could not renew idempotency locks" in caplog.text
    assert len(set(renewals.renewing_pids)) >= 2  # it renewed through a new connection
    assert executions("slow") == 1
    assert IdempotencyKey.objects.get().status == IdempotencyKey.Status.COMPLETED


class SlowAPIView(IdempotencyMixin, APIView):
    idempotency_lock_timeout = LOCK
    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []

    def post(self, request: Any) -> Response:
        time.sleep(float(request.headers.get("X-Sleep", 0)))
        Execution.objects.create(label="drf")
        return Response({"ok": True}, status=201)


class UnrenewedAPIView(SlowAPIView):
    idempotency_heartbeat = False


@idempotent(lock_timeout=LOCK)
def slow_view(request: HttpRequest) -> HttpResponse:
    time.sleep(float(request.headers.get("X-Sleep", 0)))
    Execution.objects.create(label="drf")
    return HttpResponse(status=201)


@pytest.mark.parametrize(
    ("view", "renewed"),
    [
        (SlowAPIView.as_view(), True),
        (UnrenewedAPIView.as_view(), False),
        (slow_view, True),
    ],
    ids=["drf", "drf-heartbeat-off", "view"],
)
def test_a_slow_view_keeps_its_key_while_renewed(
    renewals: Renewals, view: Callable[..., Any], renewed: bool
) -> None:
    factory = RequestFactory()
    key = str(uuid.uuid4())

    def send(sleep: float = 0.0) -> Any:
        request = factory.post(
            "/",
            {},
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY=key,
            HTTP_X_SLEEP=str(sleep),
        )
        response = view(request)
        if hasattr(response, "render"):
            response.render()
        return response

    first = in_thread(lambda: send(3 * LOCK))
    wait_for(IdempotencyKey.objects.exists, "the first request's claim", 5)
    time.sleep(2 * LOCK)
    retry = send()
    assert first().status_code == 201
    if renewed:
        assert retry.status_code == 409
        assert executions("drf") == 1
    else:
        assert retry.status_code == 201  # taken over: the view ran twice
        assert executions("drf") == 2


def test_the_policy_takes_heartbeat_from_the_option_then_the_setting(
    settings: Any,
) -> None:
    assert Options.build().resolve().heartbeat is True
    settings.IDEMPOTENCY = {"HEARTBEAT": False}
    assert Options.build().resolve().heartbeat is False
    assert Options.build(heartbeat=True).resolve().heartbeat is True
    assert SlowAPIView.get_idempotency_options().get("heartbeat") is None
    assert UnrenewedAPIView.get_idempotency_options().get("heartbeat") is False


def test_renewal_stops_when_the_attempt_raises_or_is_cancelled(renewals: Renewals) -> None:
    """Each attempt ends once its lock was renewed (seen renewed, not after a fixed sleep)."""

    @idempotent_function(key="message_id", lock_timeout=LOCK)
    def failing(message_id: str) -> None:
        wait_for(lambda: renewals.updates() >= 1, "a renewal of the failing attempt's lock", 5)
        assert heartbeat.renewer.live() == 1
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        failing(str(uuid.uuid4()))
    assert heartbeat.renewer.live() == 0
    assert not IdempotencyKey.objects.exists()  # released

    async def cancelled() -> None:
        task = asyncio.ensure_future(slow_async(str(uuid.uuid4()), 60))
        before = renewals.updates()
        # Polled on a thread of its own: the task's steps need this loop, and the claim's
        # thread (sync_to_async's) meanwhile.
        await asyncio.to_thread(
            wait_for,
            lambda: heartbeat.renewer.live() and renewals.updates() > before,
            "a renewal of the async attempt's lock",
            5,
        )
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async_to_sync(cancelled)()
    wait_for(lambda: heartbeat.renewer.live() == 0, "the cancelled attempt's renewal to stop", 5)


async def _cancel_once_renewed(cancelled: threading.Event | None = None) -> BaseException:
    """Start a slow protected task and cancel it once its lock is renewed: its
    ``CancelledError``. ``cancelled`` is set once the task is."""
    task = asyncio.ensure_future(slow_async(str(uuid.uuid4()), 60))
    while heartbeat.renewer.live() == 0:
        await asyncio.sleep(0.01)
    task.cancel()
    if cancelled is not None:
        cancelled.set()
    try:
        await task
    except asyncio.CancelledError as exc:
        return exc
    raise AssertionError("the task was not cancelled")


class Dying(BaseException):
    """A worker's death (``SystemExit``, say): not an ``Exception``."""


def test_renewal_stops_at_once_when_the_attempt_dies(renewals: Renewals) -> None:
    """A ``BaseException`` out of the protected code, or a cancelled task, stops renewal as it
    escapes, while the caller still holds its traceback (which holds the lifecycle). Renewal
    used to stop only when that was garbage collected: meanwhile the renewer kept a dead
    attempt's key locked, and the next test found a lease it did not start (issue 32)."""

    @idempotent_function(key="message_id", lock_timeout=LOCK)
    def dying(message_id: str) -> None:
        assert heartbeat.renewer.live() == 1
        raise Dying

    kept: list[BaseException] = []
    try:
        dying(str(uuid.uuid4()))
    except Dying as exc:
        kept.append(exc)
    assert kept[0].__traceback__ is not None
    assert heartbeat.renewer.live() == 0
    assert IdempotencyKey.objects.get().status == IdempotencyKey.Status.PROCESSING  # for a takeover

    kept.append(async_to_sync(_cancel_once_renewed)())
    assert heartbeat.renewer.live() == 0


def test_a_task_cancelled_while_it_claims_is_not_renewed(
    renewals: Renewals, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim runs in a thread, which a cancelled task does not stop: the claim it makes
    there must not be left renewed once the task is gone (the lifecycle is ended in that
    thread after the step)."""
    start = heartbeat.start
    cancelled = threading.Event()

    def slow_start(*args: Any, **kwargs: Any) -> None:
        start(*args, **kwargs)
        # Still in the claim's step when the task is cancelled (a fixed 0.3 s here let a
        # loaded machine cancel it later, in its body, and the test passed without the case).
        assert cancelled.wait(10), "the task was never cancelled"

    monkeypatch.setattr(heartbeat, "start", slow_start)

    # Its context holds the task's frames, as a caller's may.
    kept = async_to_sync(_cancel_once_renewed)(cancelled)
    assert kept.__context__ is not None
    assert heartbeat.renewer.live() == 0
    assert IdempotencyKey.objects.get().status == IdempotencyKey.Status.PROCESSING


def test_the_renewer_forgets_the_connections_it_closes() -> None:
    """Its next renewal connects with the alias's settings as they are then: a connection
    object kept across a failed renewal carried the settings of its first one (the fault
    suite points an alias at a PostgreSQL server, then at a MariaDB one)."""
    seen: list[bool] = []

    def renewer() -> None:
        try:
            kept = connections["default"]
            kept.ensure_connection()
            heartbeat._close_connections()
            seen.append(connections["default"] is kept)
        finally:
            connections.close_all()

    thread = threading.Thread(target=renewer)
    thread.start()
    thread.join(30)
    assert seen == [False]


class CountingCondition(threading.Condition):
    """The renewer's condition, counting how often an attempt wakes its thread, and telling
    when the thread first went to sleep waiting for it."""

    def __init__(self) -> None:
        super().__init__()
        self.notified = 0
        self.asleep = threading.Event()

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)

    def wait(self, timeout: float | None = None) -> bool:
        self.asleep.set()
        return super().wait(timeout)


def test_short_attempts_do_not_wake_the_renewer_thread(
    renewals: Renewals, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server answering one fast request after another pays no thread switch per request:
    once the thread waits for the group's renewal, a new attempt of the group is renewed by
    that wake-up (no later than its own first renewal), and the last one to end leaves the
    thread, which opened no connection, asleep.

    A lock_timeout of 30 s (renewals every 10 s): the attempts all end long before the first
    renewal, however slow the machine. The first attempt lasts until the new thread sleeps
    waiting for its renewal: a thread first scheduled after that attempt ended (a loaded
    machine) would find the group idle and drop it, and the next attempt would rightly wake it.
    """
    condition = CountingCondition()
    monkeypatch.setattr(heartbeat.renewer.of("default"), "_cond", condition)
    quick = idempotent_function(key="message_id", lock_timeout=30)(slow.__wrapped__)

    @idempotent_function(key="message_id", lock_timeout=30)
    def first(message_id: str) -> int:
        assert condition.asleep.wait(10), "the renewer thread never slept"
        return 1

    assert first(str(uuid.uuid4())) == 1  # starts the thread for this alias and lock_timeout
    assert heartbeat.renewer.running()
    for _ in range(20):
        assert quick(str(uuid.uuid4())) == 1
    assert condition.notified == 0
    assert renewals.statements == []
    # A group the thread does not wait for yet may be due sooner than its wake-up: woken.
    sooner = idempotent_function(key="message_id", lock_timeout=20)(slow.__wrapped__)
    assert sooner(str(uuid.uuid4())) == 1
    assert condition.notified == 1
    # Left alone, the idle thread would sleep until the group's renewal (10 s) before it
    # lingers and exits; wake it so the fixture sees it go.
    with condition:
        condition.notify()


@pytest.mark.django_db(transaction=True)
def test_a_stale_owner_and_its_taker_in_one_process_are_told_apart() -> None:
    """A stale owner and the claim that took its record over, in one process, share the
    record's id: the renewal counts a lease held only when its own (id, token) pair is on the
    row. Matched as two lists (``id IN (...) AND lock_token IN (...)``), both came back held,
    and the stale owner was never told its lock was lost (issue 50's review)."""
    from datetime import timedelta

    from django_idempotency.testing import stale_key

    @idempotent_function(key="key", lock_timeout=10)
    def hold(key: str, *, idempotency: Claim) -> str:
        taker.append(idempotency)
        renewer = heartbeat.Renewer()
        leases = [heartbeat._Lease(stale, None), heartbeat._Lease(idempotency, None)]
        renewer._leases = {id(lease.claim): lease for lease in leases}
        renewer._renew(("default", timedelta(seconds=10)), leases)
        return "done"

    taker: list[Claim] = []
    stale = stale_key("k", hold, "k")
    assert hold("k") == "done"
    assert taker[0].pk == stale.pk and taker[0].attempt == 2
    assert stale.lock_lost
    assert not taker[0].lock_lost


def test_on_sqlite_a_renewal_waits_for_the_write_lock_until_the_lock_ends() -> None:
    """Where writers take one lock in turn (SQLite), a renewal try waits for it until the
    earliest live lock ends; on a server, a share of that time, leaving room for a new try on a
    new connection. Cut to the share on SQLite, the tries' pauses were close to half the time
    left, and under a crowd of writers a live owner's lock lapsed
    (``tests/faults/test_sqlite.py``'s crowd)."""
    lock, now = timedelta(seconds=3), 100.0
    ends = [now + 2.0, now + 2.5, now - 1.0]  # a lock past its end is not waited for
    assert heartbeat.renewal_bound(lock, ends, now, one_writer=True) == pytest.approx(2.0)
    assert heartbeat.renewal_bound(lock, ends, now) == pytest.approx(2.0 * heartbeat.LOCK_SHARE)
    near = heartbeat.renewal_bound(lock, [now + 0.01], now, one_writer=True)
    assert near == heartbeat.PROBE


def test_on_sqlite_a_renewal_leaves_the_other_groups_their_share() -> None:
    """One thread renews a store's ``lock_timeout`` groups in turn: on SQLite a group's try
    waits for the write lock until its own locks' earliest end, but no longer than the share of
    another group's, whose renewal comes next (waiting until the other's end left it none)."""
    lock, now = timedelta(seconds=3), 100.0
    own, other = [now + 2.0], [now + 1.0]
    wait = heartbeat.renewal_bound(lock, own, now, one_writer=True, others_until=other)
    assert wait == pytest.approx(1.0 * heartbeat.LOCK_SHARE)
    later = [now + 9.0]  # another group's lock ending after the group's own: no cut
    assert heartbeat.renewal_bound(lock, own, now, True, later) == pytest.approx(2.0)
    past = [now - 1.0]  # the group's own locks past their end: the others' share, as on a server
    wait = heartbeat.renewal_bound(lock, past, now, one_writer=True, others_until=other)
    assert wait == pytest.approx(min(heartbeat.deadlines.bound(lock), heartbeat.LOCK_SHARE))
    served = heartbeat.renewal_bound(lock, own, now, one_writer=False, others_until=other)
    assert served == pytest.approx(1.0 * heartbeat.LOCK_SHARE)
