"""The fault scenarios on a MariaDB server of the suite's own (:mod:`tests.faults.storm`
says what each asserts). Run with ``-s`` to see each fault's figures."""

from __future__ import annotations

from typing import Any

import pytest

from tests.faults.catalogue import PROXY_FAULTS, SERVER_FAULTS, proxy_fault, server_fault
from tests.faults.storm import check, run

pytestmark = pytest.mark.faults


@pytest.mark.parametrize("mode", ["two-phase", "atomic"])
@pytest.mark.parametrize("fault", SERVER_FAULTS)
def test_server_fault(
    fault: str, mode: str, mariadb: Any, mariadb_app: Any, mariadb_store: Any
) -> None:
    figures = run(mariadb_app, mariadb_store, "mariadb", server_fault(fault, mariadb), mode)
    check(figures, mariadb_app)


@pytest.mark.parametrize("mode", ["two-phase", "atomic"])
@pytest.mark.parametrize("fault", PROXY_FAULTS)
def test_network_fault(
    fault: str,
    mode: str,
    mariadb_proxy: Any,
    mariadb_proxied_app: Any,
    mariadb_store: Any,
) -> None:
    figures = run(
        mariadb_proxied_app,
        mariadb_store,
        "mariadb",
        proxy_fault(fault, mariadb_proxy, mode),
        mode,
    )
    check(figures, mariadb_proxied_app)
