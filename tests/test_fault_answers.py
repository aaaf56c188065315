"""A database fault at any step before the view runs is a ``503`` with ``Retry-After``, and the
view does not run (issue 25): the scope function reading the user (a protected view's, and the
operation endpoints' reading the asking principal), a function's own key or scope, and SQLite
busy past its wait. Real faults: a database that refuses connections, another
process holding SQLite's lock."""

from __future__ import annotations

import logging
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection, connections
from django.test import Client, override_settings

from django_idempotency import IdempotencyKey, StoreUnavailable, idempotent_function
from tests.conftest import executions, problem_slug, unreachable
from tests.testapp.models import Execution

Post = Callable[..., Any]


def assert_unavailable(response: Any) -> None:
    assert response.status_code == 503, response.content
    assert problem_slug(response) == "idempotency-unavailable"
    assert int(response["Retry-After"]) >= 1


class SessionsUnreachable:
    """Sessions are read from a database that is down (the rest of the project's is up)."""

    def db_for_read(self, model: type, **hints: Any) -> str | None:
        return "unreachable" if model._meta.app_label == "sessions" else None


@pytest.fixture
def logged_in(client: Client) -> Iterator[Client]:
    client.force_login(User.objects.create_user("reader"))
    router = f"{__name__}.{SessionsUnreachable.__name__}"
    with unreachable(), override_settings(DATABASE_ROUTERS=[router]):
        yield client


@pytest.mark.django_db(databases=["default", "unreachable"])
@pytest.mark.parametrize("path", ["/create/", "/async/", "/atomic/", "/drf/"])
def test_a_logged_in_client_gets_503_when_the_default_scope_cannot_read_the_user(
    logged_in: Client, path: str
) -> None:
    """The default scope reads ``request.user``, whose session is in the database that is down:
    a ``503``, as the claim's own fault is, not a ``500``."""
    response = logged_in.post(
        path, {}, content_type="application/json", headers={"Idempotency-Key": str(uuid.uuid4())}
    )
    assert_unavailable(response)
    assert executions() == 0
    assert not IdempotencyKey.objects.exists()


@pytest.mark.urls("tests.operations_urls")
@pytest.mark.django_db(databases=["default", "unreachable"])
@pytest.mark.parametrize("path", ["operations/1.AAAAAAAAAAAAAAAAAAAAAA", "operations/"])
def test_the_operation_endpoints_answer_503_when_the_user_cannot_be_read(
    logged_in: Client, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The status and list endpoints read the asking principal as a protected view's scope
    does: a fault there is their documented ``503``, not Django's ``500`` (found by
    tests/verification under MariaDB's faults), logged as a view's is (an outsider's review:
    the ``503`` left no line for operators)."""
    with caplog.at_level(logging.ERROR, logger="django_idempotency"):
        assert_unavailable(logged_in.get(f"/idempotency/{path}"))
    assert [r.getMessage() for r in caplog.records if "operations endpoint" in r.getMessage()]


@pytest.mark.django_db(databases=["default", "unreachable"])
def test_an_anonymous_client_is_served_meanwhile(logged_in: Client) -> None:
    """The same fault does not touch a request that reads no session (the control)."""
    response = Client().post(
        "/create/", {}, content_type="application/json", headers={"Idempotency-Key": "k" * 36}
    )
    assert response.status_code == 201


def _scope_from_a_database_that_is_down(message_id: str) -> str:
    with connections["unreachable"].cursor() as cursor:
        cursor.execute("SELECT 1")
    return "tenant"


@idempotent_function(key="message_id", scope=_scope_from_a_database_that_is_down)
def handle(message_id: str) -> str:
    Execution.objects.create(label="handled")
    return "handled"


@pytest.mark.django_db(transaction=True, databases=["default", "unreachable"])
def test_a_function_whose_scope_meets_a_fault_raises_store_unavailable() -> None:
    """A consumer leaves the message for redelivery, as when the claim meets the fault."""
    with unreachable(), pytest.raises(StoreUnavailable):
        handle(str(uuid.uuid4()))
    assert executions("handled") == 0


# SQLite: another process holds the database's lock ----------------------------------------


@pytest.fixture
def locked_by_another_process() -> Iterator[None]:
    """Another process holds the test database's file in ``BEGIN EXCLUSIVE`` until the test
    ends; this process's connection waits only 50 ms for it."""
    path = connection.settings_dict["NAME"]
    with connection.cursor() as cursor:  # connected first: connecting runs statements too
        cursor.execute("PRAGMA busy_timeout = 50")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('BEGIN EXCLUSIVE')\n"
            "print('locked', flush=True)\n"
            "sys.stdin.read()\n",
            str(path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert holder.stdout is not None and holder.stdin is not None
    try:
        assert holder.stdout.readline().strip() == b"locked"
        yield
    finally:
        holder.stdin.close()
        holder.wait(10)
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA busy_timeout = 5000")  # Python's default, which Django keeps


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["/create/", "/atomic/"])
def test_sqlite_busy_past_its_wait_is_503_not_409(
    post: Post, path: str, locked_by_another_process: None
) -> None:
    """Nobody holds the key: a ``409 request-in-progress`` would send the client to retry a
    request that is not in progress."""
    assert_unavailable(post(path, {"a": 1}, key=str(uuid.uuid4())))
