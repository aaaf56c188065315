"""The fault suite's fixtures: its own database servers, a proxy, and the app served on them.

Every database server (and proxy) is started once per session, the app processes once per test
module; each is ended by its pid when done, failed or not (and at exit, whatever happened:
:mod:`tests.faults.databases`). The ports come from ``IDEMPOTENCY_FAULT_PORTS``; the suite runs
only with ``IDEMPOTENCY_FAULTS=1`` (CI's ``.ci/leg-faults``), and is not selected otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.faults import app as apps
from tests.faults.databases import MariaDBServer, PostgresCluster, SQLiteFile, free_port
from tests.faults.proxy import FaultProxy
from tests.faults.storm import Store


def serving(request: pytest.FixtureRequest, app: apps.App) -> Iterator[apps.App]:
    """Start ``app``; stop it at the end, and print its log if a test of the module failed."""
    app.start()
    failed_before = request.session.testsfailed
    try:
        yield app
    finally:
        app.stop()
        if request.session.testsfailed > failed_before:
            print(f"\n----- {app.name} log (end) -----\n{app.log()[-20000:]}")
        app.discard_log()


@pytest.fixture(scope="session")
def postgresql() -> Iterator[PostgresCluster]:
    cluster = PostgresCluster()
    try:
        cluster.create()
        apps.migrate(cluster.url())
        yield cluster
    except BaseException:
        print(f"\n----- postgresql log -----\n{cluster.log_tail()}")
        raise
    finally:
        cluster.destroy()


@pytest.fixture(scope="session")
def mariadb() -> Iterator[MariaDBServer]:
    server = MariaDBServer()
    try:
        server.create()
        apps.migrate(server.url())
        yield server
    except BaseException:
        print(f"\n----- mariadb log -----\n{server.log_tail()}")
        raise
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def sqlite() -> Iterator[SQLiteFile]:
    database = SQLiteFile()
    try:
        apps.migrate(database.url())
        yield database
    finally:
        database.destroy()


def _proxy(upstream: int) -> Iterator[FaultProxy]:
    proxy = FaultProxy(free_port(), upstream).start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture(scope="session")
def postgresql_proxy(postgresql: PostgresCluster) -> Iterator[FaultProxy]:
    yield from _proxy(postgresql.port)


@pytest.fixture(scope="session")
def mariadb_proxy(mariadb: MariaDBServer) -> Iterator[FaultProxy]:
    yield from _proxy(mariadb.port)


@pytest.fixture(scope="module")
def postgresql_app(request: pytest.FixtureRequest, postgresql: PostgresCluster) -> Iterator[Any]:
    yield from serving(request, apps.app(postgresql.url()))


@pytest.fixture(scope="module")
def postgresql_proxied_app(
    request: pytest.FixtureRequest, postgresql: PostgresCluster, postgresql_proxy: FaultProxy
) -> Iterator[Any]:
    yield from serving(request, apps.app(postgresql.url(postgresql_proxy.port)))


@pytest.fixture(scope="module")
def mariadb_app(request: pytest.FixtureRequest, mariadb: MariaDBServer) -> Iterator[Any]:
    yield from serving(request, apps.app(mariadb.url()))


@pytest.fixture(scope="module")
def mariadb_proxied_app(
    request: pytest.FixtureRequest, mariadb: MariaDBServer, mariadb_proxy: FaultProxy
) -> Iterator[Any]:
    yield from serving(request, apps.app(mariadb.url(mariadb_proxy.port)))


@pytest.fixture(scope="module")
def sqlite_app(request: pytest.FixtureRequest, sqlite: SQLiteFile) -> Iterator[Any]:
    yield from serving(request, apps.app(sqlite.url()))


@pytest.fixture(scope="session")
def postgresql_store(postgresql: PostgresCluster) -> Store:
    return Store(postgresql.execute)


@pytest.fixture(scope="session")
def mariadb_store(mariadb: MariaDBServer) -> Store:
    return Store(mariadb.execute)


@pytest.fixture(scope="session")
def sqlite_store(sqlite: SQLiteFile) -> Store:
    return Store(sqlite.execute, marker="?")
