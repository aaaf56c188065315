"""Django's connection pool (issue 39): the app's processes pool their PostgreSQL connections
(``"pool": {"min_size": 2, "max_size": 8}``, ``CONN_HEALTH_CHECKS`` off, Django's default), and
the server is restarted, stopped for 10 s, has its backends ended, or the network to it is
blackholed for 5 s. Each pool then holds connections the fault killed or silenced; the app's
claims, renewals and writes meet them, drop them and drain the pool, in atomic mode too
(:mod:`tests.faults.storm` says what each scenario asserts). PostgreSQL only: Django pools no
other database."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.faults import app as apps
from tests.faults.catalogue import blackhole_fault, server_fault
from tests.faults.proxy import FaultProxy
from tests.faults.storm import Store, check, run
from tests.test_servers_postgresql import serving

pytestmark = pytest.mark.faults

DATABASE = "postgresql, pool"


#: The app's processes pool their connections (``proxied_app`` reads it too).
APP_ENVIRONMENT = {"IDEMPOTENCY_FAULT_POOL": "1"}


@pytest.fixture(scope="module")
def server(postgresql: Any) -> Any:
    """PostgreSQL alone (the suite's ``proxy`` and ``proxied_app`` stand in front of it)."""
    return postgresql


@pytest.fixture(scope="module")
def app(request: pytest.FixtureRequest, postgresql: Any) -> Iterator[apps.App]:
    yield from serving(request, apps.app(postgresql.url(), **APP_ENVIRONMENT))


@pytest.mark.parametrize("mode", ["two-phase", "atomic"])
@pytest.mark.parametrize("fault", ["restart", "stop-10s", "terminate"])
def test_server_fault(fault: str, mode: str, postgresql: Any, app: Any) -> None:
    app.warm()  # every worker's pool holds connections, which the fault kills
    store = Store(postgresql.execute)
    check(run(app, store, DATABASE, server_fault(fault, postgresql), mode), app)


@pytest.mark.parametrize("mode", ["two-phase", "atomic"])
def test_blackhole(mode: str, postgresql: Any, proxy: FaultProxy, proxied_app: Any) -> None:
    proxied_app.warm()
    store = Store(postgresql.execute)
    fault = blackhole_fault("blackhole-5s", proxy, pooled=True)
    check(run(proxied_app, store, DATABASE, fault, mode), proxied_app)
