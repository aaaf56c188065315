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
from tests.test_servers_postgresql import serving


def _created(server: PostgresCluster | MariaDBServer) -> Iterator[Any]:
    try:
        server.create()
        apps.migrate(server.url())
        yield server
    except BaseException:
        print(f"\n----- {type(server).__name__} log -----\n{server.log_tail()}")
        raise
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def postgresql() -> Iterator[PostgresCluster]:
    yield from _created(PostgresCluster())


@pytest.fixture(scope="session")
def mariadb() -> Iterator[MariaDBServer]:
    yield from _created(MariaDBServer())


@pytest.fixture(scope="session")
def sqlite() -> Iterator[SQLiteFile]:
    database = SQLiteFile()
    try:
        apps.migrate(database.url())
        yield database
    finally:
        database.destroy()


def proxying(upstream: int) -> Iterator[FaultProxy]:
    proxy = FaultProxy(free_port(), upstream).start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture(scope="session")
def postgresql_proxy(postgresql: PostgresCluster) -> Iterator[FaultProxy]:
    yield from proxying(postgresql.port)


@pytest.fixture(scope="module", params=["postgresql", "mariadb"])
def server(request: pytest.FixtureRequest) -> PostgresCluster | MariaDBServer:
    """Each server in turn: a module's tests run on one, then on the other."""
    found: PostgresCluster | MariaDBServer = request.getfixturevalue(request.param)
    return found


@pytest.fixture(scope="module")
def store(server: PostgresCluster | MariaDBServer) -> Store:
    return Store(server.execute)


@pytest.fixture(scope="module")
def sqlite_app(request: pytest.FixtureRequest, sqlite: SQLiteFile) -> Iterator[Any]:
    yield from serving(request, apps.app(sqlite.url()))


@pytest.fixture(scope="session")
def sqlite_store(sqlite: SQLiteFile) -> Store:
    return Store(sqlite.execute, marker="?")
