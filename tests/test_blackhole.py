"""The app's own statements on a blackholed connection end within their bound (issue 39).

A proxy (:class:`tests.faults.proxy.FaultProxy`) stands between this process and the suite's
database server and silences its connections: they stay open, and nothing either side sends
arrives, as after a failover that moved an IP or a dropped NAT entry. The claim, the result
write and the renewals the app sends on such a connection are cut when they outlast their
bound (:mod:`django_idempotency._store.deadlines`) and made again on a new connection; without
the bound each would wait for the kernel's retransmissions, about fifteen minutes.

Each request runs in a thread of its own, joined with a limit: a request blocked for good
fails the test instead of hanging it (the proxy's end frees it).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connections
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client, override_settings
from django.urls import path

from django_idempotency import idempotent
from django_idempotency._base.keys import hash_key
from django_idempotency._store import deadlines
from django_idempotency.models import IdempotencyKey
from tests import ports
from tests.faults.proxy import FaultProxy
from tests.proxying import proxied_alias
from tests.waiting import wait_for

ALIAS = "blackholed"
#: The views' lock: each of the app's statements is bounded by a second (deadlines.LEAST).
LOCK = 6
#: How long a request may take before the test gives up on it: the lock, and slack for a
#: loaded machine. Without the bound a request waits for good.
GIVE_UP = LOCK + 20

pytestmark = [
    pytest.mark.server_db,
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls(__name__),
]

EFFECTS: Counter[str] = Counter()
DURING_VIEW: list[Callable[[], None]] = []


def _effect(request: HttpRequest) -> HttpResponse:
    key = request.headers["Idempotency-Key"]
    EFFECTS[key] += 1
    for fault in DURING_VIEW:
        fault()
    return JsonResponse({"key": key}, status=201)


def _renewed(request: HttpRequest) -> HttpResponse:
    """Outlasts its lock twice over: only renewals keep it."""
    response = _effect(request)
    time.sleep(LOCK * 2)
    return response


urlpatterns = [
    path("two-phase/", idempotent(lock_timeout=LOCK)(_effect)),
    path("atomic/", idempotent(atomic=True, lock_timeout=LOCK)(_effect)),
    path("renewed/", idempotent(lock_timeout=LOCK)(_renewed)),
]


@pytest.fixture(scope="module")
def proxy(django_db_setup: Any, django_db_blocker: Any) -> Iterator[FaultProxy]:
    """A proxy to the test database's server, and an alias through it. Django's pool
    (IDEMPOTENCY_TEST_POOL) is left out: a kept connection here is CONN_MAX_AGE's, which a
    pool refuses; tests/faults/test_pool.py blackholes a pool."""
    port = ports.free(1, ports.below_ephemeral())[0]
    # connect_timeout: what a deployment sets, so that a silent server's connect ends.
    with proxied_alias(ALIAS, port, django_db_blocker, connect_timeout=3) as proxy:
        yield proxy


@pytest.fixture
def store(proxy: FaultProxy, django_db_blocker: Any) -> Iterator[FaultProxy]:
    EFFECTS.clear()
    DURING_VIEW.clear()
    with django_db_blocker.unblock(), override_settings(IDEMPOTENCY={"DATABASE_ALIAS": ALIAS}):
        try:
            yield proxy
        finally:
            DURING_VIEW.clear()
            proxy.restore()
            connections[ALIAS].close()


def post(view: str, key: str) -> Any:
    """POST from a thread of its own (its own connections, as a server's request thread);
    ``None`` when it did not answer in :data:`GIVE_UP` seconds."""
    answers: list[Any] = []

    def send() -> None:
        try:
            answers.append(
                Client(raise_request_exception=False).post(
                    view, {}, content_type="application/json", headers={"Idempotency-Key": key}
                )
            )
        finally:
            connections.close_all()  # the request's end, as a server's handler does

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    thread.join(GIVE_UP)
    return answers[0] if answers else None


def status(key: str) -> str | None:
    record = IdempotencyKey.objects.using("default").filter(key_hash=hash_key(key)).first()
    return None if record is None else record.status


def silence_the_open_connections(proxy: FaultProxy, after: float = 0.0) -> Callable[[], None]:
    """What a view does to silence the connections open now (``after`` seconds from now)."""
    return lambda: threading.Timer(after, proxy.blackhole, kwargs={"new": False}).start()


def post_on_a_kept_connection(view: str, key: str, silence: Callable[[], int]) -> Any:
    """POST from a thread whose connection was opened, then silenced (``silence()``), before
    the request: a connection Django kept across requests (``CONN_MAX_AGE``, a pool's).
    ``None`` when it did not answer in :data:`GIVE_UP` seconds."""
    connections.settings[ALIAS]["CONN_MAX_AGE"] = 60
    try:
        opened = threading.Event()
        silenced = threading.Event()
        answers: list[Any] = []

        def send() -> None:
            connections[ALIAS].ensure_connection()
            opened.set()
            silenced.wait(30)
            try:
                answers.append(
                    Client(raise_request_exception=False).post(
                        view, {}, content_type="application/json", headers={"Idempotency-Key": key}
                    )
                )
            finally:
                connections.close_all()

        thread = threading.Thread(target=send, daemon=True)
        thread.start()
        assert opened.wait(30)
        assert silence() >= 1
        silenced.set()
        thread.join(GIVE_UP)
    finally:
        connections.settings[ALIAS]["CONN_MAX_AGE"] = 0
    return answers[0] if answers else None


@pytest.mark.parametrize("view", ["/two-phase/", "/atomic/"])
def test_a_claim_on_a_silenced_connection_is_made_on_a_new_one(
    store: FaultProxy, view: str
) -> None:
    key = str(uuid.uuid4())
    response = post_on_a_kept_connection(view, key, lambda: store.blackhole(new=False))
    assert response is not None, f"no answer within {GIVE_UP} s: the claim waited"
    assert response.status_code == 201, response.content
    assert EFFECTS[key] == 1
    assert status(key) == "completed"


def test_a_result_write_on_a_silenced_connection_is_made_on_a_new_one(store: FaultProxy) -> None:
    key = str(uuid.uuid4())
    DURING_VIEW.append(lambda: store.blackhole(new=False))
    response = post("/two-phase/", key)
    assert response is not None, f"no answer within {GIVE_UP} s: the result write waited"
    assert response.status_code == 201, response.content
    assert EFFECTS[key] == 1
    assert status(key) == "completed"


def test_renewals_on_a_silenced_connection_resume_on_a_new_one(store: FaultProxy) -> None:
    """The renewer's connection goes silent while the view runs past its lock: its renewal
    is cut and made again, so a duplicate sent after the lock would have lapsed is refused."""
    key = str(uuid.uuid4())
    DURING_VIEW.append(silence_the_open_connections(store, after=LOCK / 2))
    first: list[Any] = []
    thread = threading.Thread(target=lambda: first.append(post("/renewed/", key)), daemon=True)
    thread.start()
    # Past the lock the claim took, counted from the view's start (after the claim): only
    # renewals hold it now. 1.5 locks from the thread's start held only for a claim in 3 s.
    wait_for(lambda: EFFECTS[key], "the first request's view", GIVE_UP)
    time.sleep(LOCK)
    duplicate = post("/renewed/", key)
    thread.join(GIVE_UP + LOCK * 2)
    assert duplicate is not None and duplicate.status_code == 409, duplicate
    assert first and first[0] is not None and first[0].status_code == 201
    assert EFFECTS[key] == 1
    assert status(key) == "completed"


def test_a_store_silent_for_good_answers_503(store: FaultProxy) -> None:
    """New connections are silent too: the claim is cut, connecting again times out; the
    request ends, with a 503, instead of holding its worker for good."""
    key = str(uuid.uuid4())
    response = post_on_a_kept_connection("/two-phase/", key, store.blackhole)
    assert response is not None, f"no answer within {GIVE_UP} s: the claim waited"
    assert response.status_code == 503, response.content
    assert EFFECTS[key] == 0
    assert deadlines.watchdog.watching() == 0


@pytest.mark.django_db(transaction=True)
def test_connecting_within_the_bound_keeps_the_connections_own_get_new_connection() -> None:
    """The setup statements' bound overrides the wrapper's ``get_new_connection`` for one
    connect; one the wrapper had of its own (a project's or a tool's, on the instance) is put
    back after it, not deleted."""
    connection = connections["default"].copy()
    made = connection.get_new_connection
    calls: list[dict[str, Any]] = []

    def own(params: dict[str, Any]) -> Any:
        calls.append(params)
        return made(params)

    connection.get_new_connection = own  # type: ignore[method-assign]
    try:
        deadlines.connect(connection, 5.0)
        assert connection.get_new_connection is own
        connection.close()
        connection.ensure_connection()
        assert len(calls) == 2
    finally:
        connection.close()
