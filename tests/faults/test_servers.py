"""The fault scenarios on a PostgreSQL 15 cluster and a MariaDB server of the suite's own, one
after the other (:mod:`tests.faults.storm` says what each asserts). Run with ``-s`` to see each
fault's figures."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.faults import app as apps
from tests.faults.catalogue import PROXY_FAULTS, SERVER_FAULTS, proxy_fault, server_fault
from tests.faults.proxy import FaultProxy
from tests.faults.storm import check, run
from tests.test_servers_postgresql import serving

pytestmark = pytest.mark.faults


@pytest.fixture(scope="module")
def app(request: pytest.FixtureRequest, server: Any) -> Iterator[apps.App]:
    yield from serving(request, apps.app(server.url()))


@pytest.mark.parametrize("mode", ["two-phase", "atomic"])
@pytest.mark.parametrize("fault", SERVER_FAULTS)
def test_server_fault(fault: str, mode: str, server: Any, app: Any, store: Any) -> None:
    check(run(app, store, server.NAME, server_fault(fault, server), mode), app)


@pytest.mark.parametrize("mode", ["two-phase", "atomic"])
@pytest.mark.parametrize("fault", PROXY_FAULTS)
def test_network_fault(
    fault: str, mode: str, server: Any, proxy: FaultProxy, proxied_app: Any, store: Any
) -> None:
    figures = run(proxied_app, store, server.NAME, proxy_fault(fault, proxy, mode), mode)
    check(figures, proxied_app)
