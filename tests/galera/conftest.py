"""The cluster fixtures: one three-node Galera cluster for the whole session.

Starting it takes seconds to minutes (three ``mariadbd`` and two state transfers), so it runs only
when ``IDEMPOTENCY_GALERA=1``; CI (``.ci/leg-galera``) sets it and fails on any skip.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from contextlib import closing
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # the harness needs mysqlclient: its tests skip without it, saying so
    from tests.galera.harness import Cluster


@pytest.fixture(scope="session")
def galera() -> Iterator[Cluster]:
    if os.environ.get("IDEMPOTENCY_GALERA") != "1":
        pytest.skip("needs IDEMPOTENCY_GALERA=1: starts a three-node MariaDB Galera cluster")
    from tests.galera.harness import running_cluster

    started = time.monotonic()
    with running_cluster() as cluster:
        print(f"\nGalera cluster of 3 Synced in {time.monotonic() - started:.1f} s (cold start)")
        yield cluster


@pytest.fixture
def galera_database(galera: Cluster) -> Iterator[str]:
    """A database of its own on the cluster (created through node 1, replicated to all)."""
    name = f"idem_galera_{uuid.uuid4().hex[:8]}"
    galera.create_database(name)
    yield name
    for node in galera.nodes:  # the first node still in the cluster drops it for all
        if node.running():
            with closing(node.connect()) as conn, conn.cursor() as cursor:
                cursor.execute(f"DROP DATABASE IF EXISTS {name}")
            break
