"""An unreachable store answers 503 and the view does not run: a real failed connection."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connections
from django.http import HttpRequest
from django.test import override_settings

from tests.conftest import executions, problem_slug, unreachable
from tests.vendors import BACKEND_ID, TERMINATE

pytestmark = pytest.mark.django_db(databases=["default", "unreachable"])

Post = Callable[..., Any]


@pytest.fixture
def unreachable_store() -> Iterator[None]:
    """Make the unreachable alias the idempotency store."""
    with unreachable(), override_settings(IDEMPOTENCY={"DATABASE_ALIAS": "unreachable"}):
        yield


@pytest.mark.parametrize("path", ["/create/", "/async/", "/atomic/", "/drf/", "/drf-atomic/"])
def test_unreachable_store_is_503_and_the_view_does_not_run(
    post: Post, key: str, path: str, unreachable_store: None
) -> None:
    response = post(path, {"a": 1}, key=key)
    assert response.status_code == 503
    assert problem_slug(response) == "idempotency-unavailable"
    assert executions() == 0


@pytest.mark.parametrize("path", ["/create/", "/async/", "/drf/"])
def test_a_redis_outage_is_one_log_line_per_refused_request(
    post: Post, key: str, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing listens on port 1. A 3 s outage logged 790 chained tracebacks at ERROR, each
    starting with ``IndexError: pop from empty list`` (the store's idle list, empty, in whose
    handler the connection was made): now each refused request is one ERROR line, without a
    traceback, saying why; the claim's retry is a DEBUG line."""
    import logging

    caplog.set_level(logging.DEBUG, logger="django_idempotency")
    with override_settings(IDEMPOTENCY={"STORE": "redis://127.0.0.1:1/0"}):
        for _ in range(3):
            response = post(path, {"a": 1}, key=key)
            assert response.status_code == 503
    assert executions() == 0
    ours = [record for record in caplog.records if record.name == "django_idempotency"]
    errors = [record for record in ours if record.levelno >= logging.WARNING]
    assert len(errors) == 3
    for record in errors:
        assert record.levelno == logging.ERROR and not record.exc_info
        assert "unavailable (" in record.getMessage() and "127.0.0.1:1" in record.getMessage()
    assert "IndexError" not in caplog.text and "Traceback" not in caplog.text


#: Calls of the project's scope and fingerprint functions (issue 27: once per request).
CALLS: Counter[str] = Counter()
_CALLS_LOCK = threading.Lock()


def counted_scope(request: HttpRequest) -> str:
    with _CALLS_LOCK:
        CALLS["scope"] += 1
    return "anonymous"


def counted_fingerprint(request: HttpRequest, scope: str) -> str:
    with _CALLS_LOCK:
        CALLS["fingerprint"] += 1
    return "f" * 64


COUNTED = {
    "SCOPE_FUNCTION": "tests.test_unavailable.counted_scope",
    "FINGERPRINT_FUNCTION": "tests.test_unavailable.counted_fingerprint",
}


@pytest.mark.parametrize("path", ["/create/", "/async/", "/atomic/", "/drf/", "/drf-atomic/"])
def test_a_refused_claim_runs_the_scope_and_fingerprint_once(
    post: Post, key: str, path: str, unreachable_store: None
) -> None:
    CALLS.clear()
    with override_settings(IDEMPOTENCY={"DATABASE_ALIAS": "unreachable", **COUNTED}):
        assert post(path, {"a": 1}, key=key).status_code == 503
    assert CALLS == {"scope": 1, "fingerprint": 1}


def test_requests_without_a_key_do_not_touch_the_store(post: Post, unreachable_store: None) -> None:
    assert post("/create/", key=None).status_code == 201


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True, databases=["default", "idempotency"])
def test_a_store_connection_the_server_ended_is_claimed_on_anew(post: Post, key: str) -> None:
    """The server went away under a live connection (a restart, a failover, a killed session,
    a persistent connection's server restarted between requests): the claim is its first
    statement, so it is made again on a new connection and the view runs once (issue 25)."""
    store_connection = connections["idempotency"]
    vendor = store_connection.vendor
    try:
        with store_connection.cursor() as cursor:
            cursor.execute(BACKEND_ID[vendor])
            (backend,) = cursor.fetchone()
        with connections["default"].cursor() as cursor:
            cursor.execute(TERMINATE[vendor], [backend])
        with override_settings(IDEMPOTENCY={"DATABASE_ALIAS": "idempotency"}):
            response = post("/create/", {"a": 1}, key=key)
            assert post("/create/", {"a": 1}, key=key).content == response.content
    finally:
        store_connection.close()
    assert response.status_code == 201
    assert executions() == 1


def test_a_database_without_a_store_is_503(
    post: Post, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Check E030 refuses it at start-up; a request that reaches it anyway is a 503, not the
    statements of another database."""
    monkeypatch.setattr(connections["default"], "vendor", "oracle")
    response = post("/create/", {"a": 1}, key=key)
    assert response.status_code == 503
    assert problem_slug(response) == "idempotency-unavailable"
    assert executions() == 0
