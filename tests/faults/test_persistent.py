"""Persistent connections (``CONN_MAX_AGE`` 60 s, with and without ``CONN_HEALTH_CHECKS``) across
a restart: every worker thread keeps a connection that died, and the first request on it must
neither fail with a ``500`` nor run twice (issue 25 item 4)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.faults import app as apps
from tests.faults.catalogue import server_fault
from tests.faults.conftest import serving
from tests.faults.storm import check, run

pytestmark = pytest.mark.faults

PERSISTENT = {"IDEMPOTENCY_FAULT_CONN_MAX_AGE": "60"}


@pytest.fixture(scope="module", params=["health-checks", "no-health-checks"])
def postgresql_persistent_app(
    request: pytest.FixtureRequest, postgresql: Any
) -> Iterator[apps.App]:
    health = "1" if request.param == "health-checks" else "0"
    app = apps.app(postgresql.url(), **PERSISTENT, IDEMPOTENCY_FAULT_HEALTH_CHECKS=health)
    app.variant = request.param
    yield from serving(request, app)


@pytest.fixture(scope="module", params=["health-checks", "no-health-checks"])
def mariadb_persistent_app(request: pytest.FixtureRequest, mariadb: Any) -> Iterator[apps.App]:
    health = "1" if request.param == "health-checks" else "0"
    app = apps.app(mariadb.url(), **PERSISTENT, IDEMPOTENCY_FAULT_HEALTH_CHECKS=health)
    app.variant = request.param
    yield from serving(request, app)


@pytest.mark.parametrize("mode", ["two-phase", "atomic"])
def test_postgresql(
    mode: str, postgresql: Any, postgresql_persistent_app: Any, postgresql_store: Any
) -> None:
    app = postgresql_persistent_app
    database = f"postgresql, persistent ({app.variant})"
    check(run(app, postgresql_store, database, server_fault("restart", postgresql), mode), app)


@pytest.mark.parametrize("mode", ["two-phase", "atomic"])
def test_mariadb(mode: str, mariadb: Any, mariadb_persistent_app: Any, mariadb_store: Any) -> None:
    app = mariadb_persistent_app
    database = f"mariadb, persistent ({app.variant})"
    check(run(app, mariadb_store, database, server_fault("restart", mariadb), mode), app)
