"""Blackholes (issue 39): a proxy silences every connection between the app and its database,
open and with no reply, for 1 s, 5 s and 15 s, under the views' 10 s lock, on PostgreSQL and
MariaDB. The connections silenced stay silent after the fault, as after a failover that moved
an IP; new ones pass again. The app's own statements are cut at their bound and made again on
new connections: no worker is held past the lock, no key shorter than its lock runs twice,
no ``500`` (:mod:`tests.faults.storm` says what each scenario asserts)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.faults.catalogue import blackhole_fault
from tests.faults.proxy import FaultProxy
from tests.faults.storm import check, run

pytestmark = pytest.mark.faults


@pytest.mark.parametrize(
    ("fault", "mode"),
    [
        ("blackhole-1s", "two-phase"),
        ("blackhole-5s", "two-phase"),
        ("blackhole-5s", "atomic"),
        ("blackhole-15s", "two-phase"),
    ],
)
def test_blackhole(
    fault: str, mode: str, server: Any, proxy: FaultProxy, proxied_app: Any, store: Any
) -> None:
    figures = run(proxied_app, store, server.NAME, blackhole_fault(fault, proxy), mode)
    check(figures, proxied_app)
