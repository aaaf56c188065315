"""Behind PgBouncer in transaction mode, nothing of one client's request reaches the next client.

PgBouncer lends a server connection for one transaction, then gives it to another client as it
is: a session-level ``SET``, a statement prepared by name or an advisory lock taken outside a
transaction would stay on it. Run by ``.ci/leg-pgbouncer`` (which starts the PgBouncer and sets
``IDEMPOTENCY_TEST_PGBOUNCER_POOL_SIZE``): after each protected path, as many clients as the pool
has server connections each hold a transaction at once, so together they sit on every server
connection of the pool, and each reports what its server connection carries.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from io import StringIO
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection, connections
from django.test import Client
from django.utils import timezone

from django_idempotency import IdempotencyKey
from tests.factories import IdempotencyKeyFactory
from tests.held import owner_then_duplicate, waiting_threads

pytestmark = [
    pytest.mark.postgresql,
    pytest.mark.pgbouncer,
    pytest.mark.django_db(transaction=True),
]

Post = Callable[..., Any]

#: Startup parameters PgBouncer itself records per client and sets again on the server
#: connection it lends (Django's time zone among them): not a leak.
TRACKED_BY_PGBOUNCER = {
    "client_encoding",
    "datestyle",
    "intervalstyle",
    "standard_conforming_strings",
    "timezone",
    "application_name",
}


@contextmanager
def pool_clients() -> Iterator[list[psycopg.Connection[Any]]]:
    """As many clients of the PgBouncer as its pool has server connections."""
    settings = connection.settings_dict
    with ExitStack() as stack:
        yield [
            stack.enter_context(
                psycopg.connect(
                    host=settings["HOST"],
                    port=settings["PORT"],
                    user=settings["USER"],
                    dbname=settings["NAME"],
                    prepare_threshold=None,
                    connect_timeout=10,
                )
            )
            for _ in range(int(os.environ["IDEMPOTENCY_TEST_PGBOUNCER_POOL_SIZE"]))
        ]


def leftovers() -> set[str]:
    """What the pool's server connections carry from earlier transactions, one line per item."""
    found: set[str] = set()
    backends: set[int] = set()
    with pool_clients() as clients:
        for client in clients:  # each one's transaction stays open: the next gets another server
            backend = client.execute("SELECT pg_backend_pid()").fetchone()
            assert backend is not None
            backends.add(backend[0])
            for (name,) in client.execute("SELECT name FROM pg_settings WHERE source = 'session'"):
                if name.lower() not in TRACKED_BY_PGBOUNCER:
                    found.add(f"session setting {name}")
            for (name,) in client.execute("SELECT name FROM pg_prepared_statements"):
                found.add(f"prepared statement {name}")
            advisory = "SELECT objid FROM pg_locks WHERE locktype = 'advisory' AND pid = %s"
            for (objid,) in client.execute(advisory, backend):
                found.add(f"advisory lock {objid}")
        for client in clients:
            client.rollback()
        size = len(clients)
    assert len(backends) == size, "the clients did not cover every server connection of the pool"
    return found


@pytest.fixture
def clean_pool() -> Iterator[None]:
    """The test starts on a clean pool, and leaves one (whatever it left, the next is spared)."""
    assert leftovers() == set()
    yield
    connections.close_all()
    if leftovers():
        forget_everything()


def forget_everything() -> None:
    with pool_clients() as clients:
        for client in clients:
            client.execute("SELECT pg_advisory_unlock_all()")
            client.execute("DEALLOCATE ALL")
            client.execute("RESET ALL")
        for client in clients:
            client.commit()


def post(path: str, key: str) -> Any:
    return Client().post(
        path, {"amount": 1}, content_type="application/json", headers={"Idempotency-Key": key}
    )


def test_the_check_sees_what_a_client_leaves_behind(clean_pool: None) -> None:
    with connection.cursor() as cursor:  # autocommit: each one outlives its transaction
        cursor.execute("SET lock_timeout = '1234ms'")
        cursor.execute("PREPARE leaked AS SELECT 1")
        cursor.execute("SELECT pg_advisory_lock(4242)")

    assert leftovers() == {
        "session setting lock_timeout",
        "prepared statement leaked",
        "advisory lock 4242",
    }


@pytest.mark.parametrize("path", ["/create/", "/atomic/", "/drf-atomic/"])
def test_a_first_execution_and_its_replay_leave_nothing(clean_pool: None, path: str) -> None:
    key = str(uuid.uuid4())

    first, replay = post(path, key), post(path, key)

    assert first.status_code == replay.status_code < 300
    assert replay["Idempotent-Replayed"] == "true"
    assert leftovers() == set()


def test_an_atomic_view_that_fails_leaves_nothing(clean_pool: None) -> None:
    with pytest.raises(RuntimeError):
        post("/atomic/?fail=1", str(uuid.uuid4()))

    assert leftovers() == set()


def test_an_atomic_duplicate_refused_at_its_lock_wait_bound_leaves_nothing(
    clean_pool: None,
) -> None:
    key = str(uuid.uuid4())

    owner, duplicate = owner_then_duplicate(
        lambda: post("/atomic-short-wait/", key),
        lambda: post("/atomic-short-wait/", key),
        hold=True,
    )

    assert owner.status_code == 200
    assert duplicate.status_code == 409  # its claim gave up waiting on the owner's row lock
    assert leftovers() == set()


def test_a_waiting_duplicate_leaves_nothing(
    clean_pool: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner is held at its claim until the duplicate waits for it (a fixed 0.8 s run let a
    late duplicate replay without having waited)."""
    key = str(uuid.uuid4())
    waiting = waiting_threads(monkeypatch)

    owner, waiter = owner_then_duplicate(
        lambda: post("/wait/", key),
        lambda: post("/wait/", key),
        until=(lambda: waiting, "the duplicate to wait for the owner"),
    )

    assert owner.status_code == waiter.status_code == 200
    assert waiter["Idempotent-Replayed"] == "true"
    assert leftovers() == set()


def test_cleanup_leaves_nothing(clean_pool: None) -> None:
    IdempotencyKeyFactory.create_batch(5, completed=True, expired=True)

    call_command("idempotency_cleanup", stdout=StringIO())

    assert not IdempotencyKey.objects.exists()
    assert leftovers() == set()


@pytest.mark.parametrize("action", ["--release", "--fail"])
def test_recover_leaves_nothing(clean_pool: None, action: str) -> None:
    IdempotencyKeyFactory.create_batch(
        3, status=IdempotencyKey.Status.PROCESSING, unlock_at=timezone.now() - timedelta(hours=1)
    )

    call_command("idempotency_recover", action, stdout=StringIO())

    assert not IdempotencyKey.objects.filter(status=IdempotencyKey.Status.PROCESSING).exists()
    assert leftovers() == set()
