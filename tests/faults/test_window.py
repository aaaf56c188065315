"""The window that remains (docs/failure-modes.rst): a two-phase owner whose outage outlasts its
lock. Measured on PostgreSQL: a 15 s stop under a 10 s lock. Each key may run twice; what is
asserted is the rest (no ``500``, identical replays, every key settled, no restarted worker)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.faults import app as apps
from tests.faults.catalogue import server_fault
from tests.faults.storm import Store, check, run
from tests.test_servers_postgresql import serving

pytestmark = pytest.mark.faults


@pytest.fixture(scope="module")
def app(request: pytest.FixtureRequest, postgresql: Any) -> Iterator[apps.App]:
    yield from serving(request, apps.app(postgresql.url()))


def test_outage_longer_than_the_lock(postgresql: Any, app: Any) -> None:
    fault = server_fault("stop-15s-lock-10s", postgresql)
    check(run(app, Store(postgresql.execute), postgresql.NAME, fault, "two-phase"), app)
