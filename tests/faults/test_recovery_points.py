"""Recovery points under faults (issue 39 item 4): the recovery-point view of docs/recovery.rst,
on PostgreSQL and MariaDB of the suite's own.

A recovery point is a durable write like the result. Its write, cut by the suite's proxy (the
request or the reply lost, silent for a while and then reset) or met by a restart, is tried
again on a new connection while the lock holds; a write applied whose reply was lost matches
again under the attempt's lock token and counts as written. The view then ships, and its charge
ran once. Before, the view raised the driver's ``OperationalError``: its client got a ``500``,
the record was released, and the retry charged again.

In this process (a view run by the test client, the store reached through the proxy): the
write cut, a restart, and a database that does not answer before the lock could lapse, where
the view answers ``503`` (not the driver's error, a ``500``) and the retry takes the record over
at the last point the database holds. Under gunicorn: the storm of :mod:`tests.faults.storm`
with the view waiting between its charge and its ``"charged"`` point.
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
from django.test import Client
from django.urls import path

from django_idempotency import idempotent
from django_idempotency._base.keys import hash_key
from django_idempotency.models import IdempotencyKey
from tests.faults import app as apps
from tests.faults.conftest import PROXIED
from tests.faults.proxied import proxied_server  # noqa: F401 (the fixture ``server``)
from tests.faults.proxy import FaultProxy
from tests.faults.storm import KEYS, Fault, check, run

pytestmark = [pytest.mark.faults, pytest.mark.urls(__name__)]

#: The recovery point's write: the only statement that sets it first.
POINT_WRITE = rb'SET [`"]recovery_point'
#: How long a cut write stays silent before its connection is reset (the issue's case: 3 s).
SILENT = 3.0
LOCK = 20
SHORT = 2

CHARGES: Counter[str] = Counter()
#: What the view does between its charge and its "charged" point (the fault).
FAULT: list[Callable[[], None]] = []


def _refund(request: HttpRequest) -> HttpResponse:
    """docs/recovery.rst's view: reserve, charge, record "charged", ship."""
    claim = request.idempotency  # type: ignore[attr-defined]
    key = request.headers["Idempotency-Key"]
    if claim.recovery_point == "":
        claim.set_recovery_point("reserved", {"reservation": key})
    if claim.recovery_point == "reserved":
        CHARGES[key] += 1
        charge = f"ch_{CHARGES[key]}"
        for fault in FAULT:
            fault()
        claim.set_recovery_point("charged", {"charge": charge})
    return JsonResponse({"shipped": claim.recovery_data["charge"]}, status=201)


urlpatterns = [
    path("refund/", idempotent(lock_timeout=LOCK)(_refund)),
    path("refund-short/", idempotent(lock_timeout=SHORT)(_refund)),
]


@pytest.fixture
def cleared(proxied_store: FaultProxy) -> Iterator[FaultProxy]:
    """The proxied store's proxy, no charge or fault left from an earlier test."""
    CHARGES.clear()
    FAULT.clear()
    try:
        yield proxied_store
    finally:
        FAULT.clear()


def post(url: str, key: str) -> Any:
    """POST as a server would: Django closes a connection that failed as each request starts
    and ends; the test client leaves that out."""
    connections[PROXIED].close_if_unusable_or_obsolete()
    try:
        return Client(raise_request_exception=False).post(
            url, {}, content_type="application/json", headers={"Idempotency-Key": key}
        )
    finally:
        connections[PROXIED].close_if_unusable_or_obsolete()


def record(key: str) -> IdempotencyKey:
    return IdempotencyKey.objects.using(PROXIED).get(key_hash=hash_key(key))


def _shipped_once(key: str, first: Any, url: str = "/refund/") -> None:
    assert first.status_code == 201, first.content
    assert first.json() == {"shipped": "ch_1"}
    assert CHARGES[key] == 1
    row = record(key)
    assert (row.status, row.recovery_point) == ("completed", "charged")
    again = post(url, key)
    assert (again.status_code, again.content) == (201, first.content)
    assert CHARGES[key] == 1


@pytest.mark.parametrize("cut", ["request", "reply"])
def test_a_recovery_point_whose_write_is_cut_is_written_again(
    cleared: FaultProxy, cut: str
) -> None:
    """The "charged" write silent for 3 s, then reset: its request never reached the server,
    or its reply was lost after the server applied it."""
    key = str(uuid.uuid4())
    armed: list[Any] = []
    FAULT.append(lambda: armed.append(cleared.arm(cut, POINT_WRITE, count=1, hold=SILENT)))
    first = post("/refund/", key)
    assert armed[0].fired == 1
    _shipped_once(key, first)


def test_a_recovery_point_across_a_restart(cleared: FaultProxy, server: Any) -> None:
    key = str(uuid.uuid4())
    FAULT.append(server.restart)
    _shipped_once(key, post("/refund/", key))


def test_a_recovery_point_the_database_does_not_take_in_time_is_a_503(cleared: FaultProxy) -> None:
    """Connections refused for twice the 2 s lock from the charge on (renewals too): the point
    cannot be written before the lock could lapse. The view answers 503 with the app's problem,
    not the driver's error; the retry after the fault takes the record over at the last point
    the database holds ("reserved") and charges again: a fault longer than the lock."""
    key = str(uuid.uuid4())
    back: list[threading.Thread] = []

    def away() -> None:
        cleared.refuse()
        thread = threading.Thread(target=lambda: (time.sleep(2 * SHORT), cleared.admit()))
        thread.start()
        back.append(thread)

    FAULT.append(away)
    first = post("/refund-short/", key)
    FAULT.clear()
    back[0].join(30)
    assert first.status_code == 503, first.content
    assert first["Content-Type"] == "application/problem+json"
    assert first.json()["type"].endswith("idempotency-unavailable")
    deadline = time.monotonic() + 3 * SHORT
    retry = post("/refund-short/", key)
    while retry.status_code == 409 and time.monotonic() < deadline:
        time.sleep(0.2)
        retry = post("/refund-short/", key)
    assert retry.status_code == 201, retry.content
    assert record(key).attempt == 2
    assert CHARGES[key] == 2


# The storm ----------------------------------------------------------------------------------


def _restart(server: Any) -> Fault:
    return Fault("point-restart", server.restart, path="/recovery/")


def _cut(proxy: FaultProxy, cut: str) -> Fault:
    """Cut the owners' "charged" writes, each silent for 3 s and then reset."""
    armed: list[Any] = []

    def arm() -> None:
        armed.append(proxy.arm(cut, POINT_WRITE, count=KEYS, hold=SILENT))

    def disarm() -> None:
        armed[0].done.wait(SILENT + 10)
        print(f"cuts {proxy.disarm()}", end=" ")

    return Fault(f"point-drop-{cut}", arm, disarm, path="/recovery/")


@pytest.mark.parametrize("fault", ["point-restart", "point-drop-request", "point-drop-reply"])
def test_the_storm(
    fault: str, server: Any, proxy: FaultProxy, proxied_app: apps.App, store: Any
) -> None:
    cut = fault.removeprefix("point-drop-")
    made = _restart(server) if fault == "point-restart" else _cut(proxy, cut)
    check(run(proxied_app, store, server.NAME, made, "two-phase"), proxied_app)
