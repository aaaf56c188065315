"""The example project on PostgreSQL, under runserver (a thread per request): concurrent refunds
of one charge never refund more than it, and no database connection is left open behind a
request (issue 20)."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest

from tests.test_example_project import serve

T = TypeVar("T")

pytestmark = pytest.mark.postgresql


@dataclass
class PgExample:
    url: str
    database_url: str
    name: str

    def scalar(self, sql: str, *, database_url: str | None = None) -> int:
        with psycopg.connect(database_url or self.database_url, autocommit=True) as connection:
            (value,) = connection.execute(sql, {"name": self.name}).fetchone()  # type: ignore[misc]
            return int(value)


@pytest.fixture(scope="module")
def pg_example(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgExample]:
    admin_url = os.environ["DATABASE_URL"]
    name = (os.environ.get("IDEMPOTENCY_TEST_DB") or "test_idempotency") + "_example"
    parts = urlsplit(admin_url)
    with psycopg.connect(admin_url, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')
    database_url = urlunsplit(parts._replace(path=f"/{name}"))
    log = tmp_path_factory.mktemp("example-pg-log") / "runserver.log"
    try:
        with serve(database_url, log) as (url, _env):
            yield PgExample(url, database_url, name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _post(example: PgExample, path: str, json: object) -> httpx.Response:
    return httpx.post(
        example.url + path, json=json, headers={"Idempotency-Key": str(uuid.uuid4())}, timeout=30
    )


def _concurrently(count: int, call: Callable[[T], int], args: list[T]) -> list[int]:
    """``call(arg)`` for each of ``args``, all at once from real threads."""
    barrier = threading.Barrier(count)
    results: list[int] = []
    errors: list[str] = []

    def run(arg: T) -> None:
        barrier.wait()
        try:
            results.append(call(arg))
        except httpx.TransportError as exc:  # shown in the assertion, not lost in a thread
            results.append(-1)
            errors.append(repr(exc))

    threads = [threading.Thread(target=run, args=(arg,)) for arg in args]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return results


def test_concurrent_refunds_never_exceed_the_charge(pg_example: PgExample) -> None:
    """Ten refunds of the whole amount at once, each with its own key, on each of five charges
    in turn: one succeeds per charge (without the row lock, two or more did).

    Ten at a time: runserver's listen backlog resets connections beyond that.
    """
    for _ in range(5):
        charge = _post(pg_example, "/api/charges/", {"amount": 100, "currency": "usd"})
        assert charge.status_code == 201, charge.text
        path = f"/api/charges/{int(charge.json()['id'])}/refunds/"
        statuses = _concurrently(
            10, lambda path: _post(pg_example, path, {"amount": 100}).status_code, [path] * 10
        )
        assert sorted(statuses) == [201] + [400] * 9
    over_refunded = pg_example.scalar(
        "SELECT COUNT(*) FROM (SELECT charge_id FROM payments_refund GROUP BY charge_id"
        " HAVING SUM(amount) > 100) AS over_refunded"
    )
    assert over_refunded == 0


def test_no_connection_is_left_open_after_the_requests(pg_example: PgExample) -> None:
    body = {"amount": 500, "currency": "eur"}
    for _ in range(3):
        statuses = _concurrently(
            10, lambda path: _post(pg_example, path, body).status_code, ["/payouts/"] * 10
        )
        assert statuses == [201] * 10
    sql = "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = %(name)s"
    admin_url = os.environ["DATABASE_URL"]
    deadline = time.monotonic() + 5
    while (left := pg_example.scalar(sql, database_url=admin_url)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == 0
