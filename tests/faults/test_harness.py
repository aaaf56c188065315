"""The harness does what the scenarios rely on: each fault happens, on the server it names.

A scenario that passes because its fault never struck would prove nothing: here each fault is
seen from a plain client (psycopg, MySQLdb, sqlite3), and each server listens in the range.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.conftest import NEEDS_MYSQLCLIENT
from tests.faults.databases import APP_PASSWORD, APP_USER, DATABASE, port_range
from tests.faults.proxy import COMMIT, RESULT_WRITE, FaultProxy

MySQLdb = pytest.importorskip("MySQLdb", reason=NEEDS_MYSQLCLIENT)

pytestmark = pytest.mark.faults


def _pg(port: int) -> Any:
    return psycopg.connect(
        host="127.0.0.1", port=port, user="postgres", dbname=DATABASE, autocommit=True
    )


@pytest.fixture(scope="module")
def marks(postgresql: Any) -> Iterator[str]:
    """A table whose column is named as the result write's: the proxy's trigger."""
    table = f"marks_{uuid.uuid4().hex[:8]}"
    postgresql.execute(f"CREATE TABLE {table} (response_body text)")
    yield table
    postgresql.execute(f"DROP TABLE {table}")


def _marked(postgresql: Any, table: str, mark: str) -> bool:
    rows = postgresql.execute(f"SELECT 1 FROM {table} WHERE response_body = %s", [mark])
    return bool(rows)


def test_servers_listen_in_the_range(postgresql: Any, mariadb: Any) -> None:
    assert postgresql.port in port_range()
    assert mariadb.port in port_range()
    assert {postgresql.port, mariadb.port}.isdisjoint({5432, 3306})


@pytest.mark.parametrize(("cut", "executed"), [("request", False), ("reply", True)])
def test_proxy_cuts_the_result_write(
    postgresql: Any, postgresql_proxy: FaultProxy, marks: str, cut: str, executed: bool
) -> None:
    """Dropping the request: the server never ran it. Dropping the reply: it ran and committed,
    and the client cannot know."""
    mark = uuid.uuid4().hex
    trigger = postgresql_proxy.arm(cut, RESULT_WRITE, count=1)
    with _pg(postgresql_proxy.port) as conn:
        conn.execute("SELECT 1")  # the connection itself passes
        with pytest.raises(psycopg.OperationalError):
            conn.execute(f"INSERT INTO {marks} (response_body) VALUES (%s)", [mark])
    assert trigger.fired == 1 and postgresql_proxy.disarm() == 1
    assert _marked(postgresql, marks, mark) is executed
    with _pg(postgresql_proxy.port) as conn:  # disarmed: writes pass again
        conn.execute(f"INSERT INTO {marks} (response_body) VALUES (%s)", ["after"])


@pytest.mark.parametrize(("cut", "executed"), [("request", False), ("reply", True)])
def test_proxy_cuts_the_commit_after_the_result_write(
    postgresql: Any, postgresql_proxy: FaultProxy, marks: str, cut: str, executed: bool
) -> None:
    mark = uuid.uuid4().hex
    postgresql_proxy.arm(cut, COMMIT, after=RESULT_WRITE, count=1)
    with _pg(postgresql_proxy.port) as conn:
        conn.execute("BEGIN")
        conn.execute("COMMIT")  # no result write before it: not cut
        conn.execute("BEGIN")
        conn.execute(f"INSERT INTO {marks} (response_body) VALUES (%s)", [mark])
        with pytest.raises(psycopg.OperationalError):
            conn.execute("COMMIT")
    assert postgresql_proxy.disarm() == 1
    assert _marked(postgresql, marks, mark) is executed


def test_postgresql_faults(postgresql: Any) -> None:
    for fault in (postgresql.restart, postgresql.terminate_backends):
        conn = _pg(postgresql.port)
        fault()
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
        conn.close()
    postgresql.read_only(True)
    try:
        with _pg(postgresql.port) as conn, pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("CREATE TABLE refused (i int)")
    finally:
        postgresql.read_only(False)
    with _pg(postgresql.port) as conn:
        conn.execute("CREATE TABLE accepted (i int)")
        conn.execute("DROP TABLE accepted")
    pid = postgresql.pid
    postgresql.stop()
    with pytest.raises(psycopg.OperationalError):
        _pg(postgresql.port)
    postgresql.start()
    assert postgresql.pid != pid


def _maria(port: int) -> Any:
    return MySQLdb.connect(
        host="127.0.0.1", port=port, user=APP_USER, password=APP_PASSWORD, database=DATABASE,
        autocommit=True, connect_timeout=5,
    )  # fmt: skip


def test_mariadb_faults(mariadb: Any) -> None:
    for fault in (mariadb.restart, mariadb.terminate_backends):
        conn = _maria(mariadb.port)
        fault()
        with pytest.raises(MySQLdb.OperationalError):
            conn.cursor().execute("SELECT 1")
        conn.close()
    conn = _maria(mariadb.port)
    conn.cursor().execute("CREATE TABLE IF NOT EXISTS marks (i int)")
    mariadb.read_only(True)
    try:
        with pytest.raises(MySQLdb.OperationalError, match="read-only"):
            conn.cursor().execute("INSERT INTO marks VALUES (1)")
    finally:
        mariadb.read_only(False)
    conn.cursor().execute("INSERT INTO marks VALUES (1)")
    conn.close()


def test_sqlite_exclusive_lock(sqlite: Any) -> None:
    sqlite.lock()
    try:
        conn = sqlite3.connect(sqlite.path, timeout=0.2)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            conn.execute("SELECT count(*) FROM testapp_execution").fetchall()
        conn.close()
    finally:
        sqlite.unlock()
    assert sqlite.execute("SELECT count(*) FROM testapp_execution") is not None
