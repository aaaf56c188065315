"""The owner's writes across the database's own faults, on a server of the test's own (issue 25).

A PostgreSQL cluster or a MariaDB server of the fault suite's own (:mod:`tests.own_servers`) is
restarted, stopped, made read-only or has its sessions ended while a protected view runs in
this process: the view counts its executions in memory and does the fault itself, after its
side effect, so the fault always falls between the claim and the result write. Each test
asserts what the client got (never a ``500``), how often the view ran, and what the record
holds.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connections
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client, override_settings
from django.urls import path

from django_idempotency import IdempotencyKey, idempotent, idempotent_function
from django_idempotency._base.keys import hash_key
from tests import own_servers

ALIAS = "own_server"

#: Selected with the fault suite (``IDEMPOTENCY_FAULTS=1``, CI's ``faults`` leg), which starts
#: servers of its own; both servers whatever database the suite's own settings name.
pytestmark = [pytest.mark.faults, pytest.mark.urls(__name__)]

#: Executions of the views, by key; and what the view does after its side effect.
EFFECTS: Counter[str] = Counter()
FAULT: list[Callable[[], None]] = []


def _effect(request: HttpRequest) -> HttpResponse:
    key = request.headers["Idempotency-Key"]
    EFFECTS[key] += 1
    for fault in FAULT:
        fault()
    return JsonResponse({"key": key, "token": str(uuid.uuid4())}, status=201)


def _scope_from_the_store(request: HttpRequest) -> str:
    """A scope read from the store's database, as the default one reads ``request.user``."""
    with connections[ALIAS].cursor() as cursor:
        cursor.execute("SELECT 1")
    return "reader"


async def _async_effect(request: HttpRequest) -> HttpResponse:
    return _effect(request)  # the fault blocks the loop: this test's only request


@idempotent_function(key="message_id", lock_timeout=20)
def handle(message_id: str) -> str:
    EFFECTS[message_id] += 1
    for fault in FAULT:
        fault()
    return f"handled {message_id}"


def _outlasting(request: HttpRequest) -> HttpResponse:
    """Its fault takes the server down; it returns only after the lock it had at the fault
    would have lapsed, and a duplicate sent then must find the lock still held."""
    response = _effect(request)
    time.sleep(max(0.0, OUTLAST_UNTIL[0] - time.monotonic()))
    return response


OUTLAST_UNTIL = [0.0]
two_phase = idempotent(lock_timeout=20)(_effect)
renewed = idempotent(lock_timeout=9)(_outlasting)
asynchronous = idempotent(lock_timeout=20)(_async_effect)
atomic = idempotent(atomic=True, lock_timeout=20)(_effect)
scoped = idempotent(lock_timeout=20, scope=_scope_from_the_store)(_effect)

urlpatterns = [
    path("two-phase/", two_phase),
    path("renewed/", renewed),
    path("async/", asynchronous),
    path("atomic/", atomic),
    path("scoped/", scoped),
]


# Ids that are not vendor markers' names (a test's keywords include its ids).
@pytest.fixture(scope="module", params=["postgresql", "mysql"], ids=["pg-cluster", "mariadb"])
def server(request: pytest.FixtureRequest, django_db_blocker: Any) -> Iterator[own_servers.Server]:
    with django_db_blocker.unblock():
        made = own_servers.make(request.param)
        try:
            own_servers.register(ALIAS, made)
            yield made
        finally:
            own_servers.unregister(ALIAS)
            made.destroy()


@pytest.fixture
def store(server: own_servers.Server, django_db_blocker: Any) -> Iterator[own_servers.Server]:
    """The server, the idempotency store of this test's requests."""
    EFFECTS.clear()
    FAULT.clear()
    with django_db_blocker.unblock(), override_settings(IDEMPOTENCY={"DATABASE_ALIAS": ALIAS}):
        try:
            yield server
        finally:
            FAULT.clear()
            connections[ALIAS].close()


def post(path: str, key: str) -> Any:
    """POST as a server would: Django's handler closes a connection that failed (or is too
    old) as each request starts and ends; the test client leaves that out."""
    request_boundary()
    try:
        return Client(raise_request_exception=False).post(
            path, {}, content_type="application/json", headers={"Idempotency-Key": key}
        )
    finally:
        request_boundary()


def request_boundary() -> None:
    connections[ALIAS].close_if_unusable_or_obsolete()


def record(key: str) -> IdempotencyKey | None:
    return IdempotencyKey.objects.using(ALIAS).filter(key_hash=hash_key(key)).first()


def _assert_stored_once(key: str, first: Any, view: str = "/two-phase/") -> None:
    """The first client got the view's response; the record holds it; a retry replays it."""
    assert first.status_code == 201, first.content
    assert EFFECTS[key] == 1
    held = record(key)
    assert held is not None and held.status == IdempotencyKey.Status.COMPLETED
    again = post(view, key)
    assert (again.status_code, again.content) == (201, first.content)
    assert again["Idempotent-Replayed"] == "true"
    assert EFFECTS[key] == 1


@pytest.mark.parametrize("view", ["/two-phase/", "/async/"])
def test_a_restart_between_the_view_and_its_result_write(
    store: own_servers.Server, view: str
) -> None:
    """``pg_ctl restart -m fast`` (MariaDB: stopped and started): the request's connection is
    dead when the result is written; the owner writes it on a new connection."""
    key = str(uuid.uuid4())
    FAULT.append(store.restart)
    _assert_stored_once(key, post(view, key), view)


def test_a_restart_between_a_function_and_its_result_write(store: own_servers.Server) -> None:
    message_id = str(uuid.uuid4())
    FAULT.append(store.restart)
    assert handle(message_id) == f"handled {message_id}"
    FAULT.clear()
    request_boundary()
    assert handle(message_id) == f"handled {message_id}"  # the stored result
    assert EFFECTS[message_id] == 1


def test_an_outage_shorter_than_the_lock_is_outlasted(store: own_servers.Server) -> None:
    """The server is down for 3 s after the view ran, under a 20 s lock: the owner keeps
    writing until it answers, and the client gets the view's response, not a 503."""
    key = str(uuid.uuid4())
    outages: list[threading.Thread] = []

    def outage() -> None:
        store.stop()
        thread = threading.Thread(target=lambda: (time.sleep(3), store.start()))
        thread.start()
        outages.append(thread)

    FAULT.append(outage)
    first = post("/two-phase/", key)
    outages[0].join(own_servers.START_TIMEOUT)
    FAULT.clear()
    _assert_stored_once(key, first)


def test_renewals_keep_the_lock_across_an_outage_shorter_than_it(
    store: own_servers.Server,
) -> None:
    """A 9 s lock renewed every 3 s; the server goes down for 3 s at the view's start, so the
    first renewal fails. The renewer keeps trying and renews once the server is back: a
    duplicate sent 11 s after the claim, when the claim's own lock would have lapsed, finds
    the key held (``409``), and the view ran once."""
    key = str(uuid.uuid4())
    outages: list[threading.Thread] = []
    duplicate: list[Any] = []

    def outage() -> None:
        FAULT.clear()  # once: not again in the duplicate's view if it ran
        OUTLAST_UNTIL[0] = time.monotonic() + 12
        store.stop()
        thread = threading.Thread(target=lambda: (time.sleep(3), store.start()))
        thread.start()
        outages.append(thread)
        sender = threading.Thread(target=lambda: (time.sleep(11), duplicate.append(_dup(key))))
        sender.start()
        outages.append(sender)

    FAULT.append(outage)
    first = post("/renewed/", key)
    for thread in outages:
        thread.join(own_servers.START_TIMEOUT)
    FAULT.clear()
    assert first.status_code == 201, first.content
    assert duplicate[0].status_code == 409, duplicate[0].content
    assert EFFECTS[key] == 1
    assert post("/renewed/", key).content == first.content


def _dup(key: str) -> Any:
    try:
        return post("/renewed/", key)
    finally:
        connections.close_all()  # this thread's


def test_sessions_ended_between_the_view_and_its_result_write(store: own_servers.Server) -> None:
    """``pg_terminate_backend`` / ``KILL CONNECTION`` of the app's sessions."""
    key = str(uuid.uuid4())
    FAULT.append(lambda: _ended(store))
    _assert_stored_once(key, post("/two-phase/", key))


def _ended(server: own_servers.Server) -> None:
    assert own_servers.terminate(server) >= 1
    deadline = time.monotonic() + 10  # until the server has let them go
    while own_servers.terminate(server) and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_read_only_spell_while_the_view_runs(store: own_servers.Server) -> None:
    """The server refuses writes when the result is due and takes them again 2 s later."""
    key = str(uuid.uuid4())
    spells: list[threading.Thread] = []

    def spell() -> None:
        store.read_only(True)
        thread = threading.Thread(target=lambda: (time.sleep(2), store.read_only(False)))
        thread.start()
        spells.append(thread)

    FAULT.append(spell)
    try:
        first = post("/two-phase/", key)
    finally:
        for thread in spells:
            thread.join(own_servers.START_TIMEOUT)
        store.read_only(False)
    FAULT.clear()
    _assert_stored_once(key, first)


def test_replays_are_served_during_a_read_only_spell(store: own_servers.Server) -> None:
    key = str(uuid.uuid4())
    first = post("/two-phase/", key)
    assert first.status_code == 201
    store.read_only(True)
    try:
        replay = post("/two-phase/", key)
        refused = post("/two-phase/", f"{key}-new")
    finally:
        store.read_only(False)
    assert (replay.status_code, replay.content) == (201, first.content)
    assert refused.status_code == 503 and refused["Retry-After"]
    assert {key: 1} == EFFECTS  # the new key's view did not run
    assert post("/two-phase/", f"{key}-new").status_code == 201


def test_atomic_mode_answers_503_when_the_server_stops_under_the_view(
    store: own_servers.Server,
) -> None:
    """The result write fails, the rollback fails and Django's reconnect is refused: the
    transaction's exit must not replace the app's 503 with a 500."""
    key = str(uuid.uuid4())
    FAULT.append(store.stop)
    try:
        response = post("/atomic/", key)
    finally:
        FAULT.clear()
        store.start()
    assert response.status_code == 503, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["type"].endswith("idempotency-unavailable")
    assert response["Retry-After"]
    assert record(key) is None  # nothing of the attempt was kept: a retry runs it
    assert post("/atomic/", key).status_code == 201


@contextmanager
def persistent(health_checks: bool) -> Iterator[None]:
    """The alias keeps its connection across requests (``CONN_MAX_AGE`` > 0)."""
    settings = connections[ALIAS].settings_dict
    before = dict(settings)
    connections[ALIAS].close()
    settings.update(CONN_MAX_AGE=600, CONN_HEALTH_CHECKS=health_checks)
    try:
        yield
    finally:
        settings.update(before)
        connections[ALIAS].close()


@pytest.mark.parametrize("health_checks", [False, True], ids=["no-health-checks", "health-checks"])
@pytest.mark.parametrize("view", ["/two-phase/", "/atomic/", "/scoped/"])
def test_the_first_request_on_a_connection_that_died_in_a_restart(
    store: own_servers.Server, health_checks: bool, view: str
) -> None:
    """Never a 500, never a second execution. With health checks Django reconnects at the
    request's first query; without, the two-phase claim is made again on a new connection,
    and so is atomic mode's transaction, opened after its read of a finished record met the
    dead connection and closed it (issue 42); a first query of the project's own (the
    scope's) gets the 503, the retry a new connection."""
    with persistent(health_checks):
        assert post(view, str(uuid.uuid4())).status_code == 201
        assert connections[ALIAS].connection is not None  # it outlived its request
        store.restart()
        key = str(uuid.uuid4())
        first = post(view, key)
        retry = post(view, key)
    served = health_checks or view in ("/two-phase/", "/atomic/")
    assert first.status_code == (201 if served else 503), first.content
    assert retry.status_code == 201, retry.content
    assert EFFECTS[key] == 1
    if served:
        assert retry.content == first.content
