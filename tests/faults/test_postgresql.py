"""The fault scenarios on a PostgreSQL 15 cluster of the suite's own (:mod:`tests.faults.storm`
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
    fault: str, mode: str, postgresql: Any, postgresql_app: Any, postgresql_store: Any
) -> None:
    figures = run(
        postgresql_app, postgresql_store, "postgresql", server_fault(fault, postgresql), mode
    )
    check(figures, postgresql_app)


@pytest.mark.parametrize("mode", ["two-phase", "atomic"])
@pytest.mark.parametrize("fault", PROXY_FAULTS)
def test_network_fault(
    fault: str,
    mode: str,
    postgresql_proxy: Any,
    postgresql_proxied_app: Any,
    postgresql_store: Any,
) -> None:
    figures = run(
        postgresql_proxied_app,
        postgresql_store,
        "postgresql",
        proxy_fault(fault, postgresql_proxy, mode),
        mode,
    )
    check(figures, postgresql_proxied_app)


def test_outage_longer_than_the_lock(
    postgresql: Any, postgresql_app: Any, postgresql_store: Any
) -> None:
    """The window that remains (docs/failure-modes.rst): a two-phase owner down for longer than
    its lock may see its key run again; still no 500, and every key settles."""
    fault = server_fault("stop-15s-lock-10s", postgresql)
    check(run(postgresql_app, postgresql_store, "postgresql", fault, "two-phase"), postgresql_app)
