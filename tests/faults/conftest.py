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
from django.test import override_settings

from tests import own_servers
from tests.faults import app as apps
from tests.faults.databases import MariaDBServer, PostgresCluster, SQLiteFile
from tests.faults.proxy import FaultProxy
from tests.faults.storm import Store
from tests.proxying import proxying
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


@pytest.fixture(scope="session")
def postgresql_proxy(postgresql: PostgresCluster) -> Iterator[FaultProxy]:
    with proxying(postgresql.port) as proxy:
        yield proxy


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


#: The database alias of :func:`proxied_store`.
PROXIED = "proxied"


@pytest.fixture(scope="module")
def proxy(server: PostgresCluster | MariaDBServer) -> Iterator[FaultProxy]:
    """A proxy in front of the module's server."""
    with proxying(server.port) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def proxied_app(
    request: pytest.FixtureRequest, server: PostgresCluster | MariaDBServer, proxy: FaultProxy
) -> Iterator[apps.App]:
    """The app served on the module's server through its proxy, with the module's
    ``APP_ENVIRONMENT`` (more of the app's environment: Django's pool) if it has one."""
    extra: dict[str, str] = getattr(request.module, "APP_ENVIRONMENT", {})
    yield from serving(request, apps.app(server.url(proxy.port), **extra))


@pytest.fixture
def proxied_store(
    server: PostgresCluster | MariaDBServer, proxy: FaultProxy, django_db_blocker: Any
) -> Iterator[FaultProxy]:
    """The module's server, through its proxy, as this process's idempotency store (the alias
    :data:`PROXIED`), for a view or function run in the test's process (issue 39). A module
    using it names its servers' parameters apart from the vendor markers: a test's keywords
    include its ids, and ``postgresql`` alone would skip it on the suite's SQLite."""
    with django_db_blocker.unblock():
        own_servers.register(PROXIED, server, proxy.port)
        try:
            with override_settings(IDEMPOTENCY={"DATABASE_ALIAS": PROXIED}):
                yield proxy
        finally:
            proxy.disarm()
            proxy.admit()
            own_servers.unregister(PROXIED)
