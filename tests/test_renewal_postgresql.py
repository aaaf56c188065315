"""A claim's reply held by the network, on PostgreSQL (issue 50, item 1).

A proxy (:class:`tests.faults.proxy.FaultProxy`) stands between this process and the suite's
PostgreSQL server and holds the owner's claim reply, as a slow network or a commit's flush
before the reply would: the claim's lock runs from when the server set it, so the first
renewal must be counted from when the claim was sent, not from when its reply came.
``tests/test_redis_store.py`` has the same on a private redis-server.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from django.db import connections
from django.test import override_settings

from django_idempotency import IdempotencyInProgress, idempotent_function
from django_idempotency._store.postgresql import CLAIM_FUNCTION
from tests.faults.proxy import FaultProxy
from tests.held import assert_held_off, owner_and_duplicates
from tests.proxying import proxied_alias
from tests.redis_servers import free_port

ALIAS = "held"
#: The claim may take 1 s (``deadlines.bound``: a sixth of the lock, no less than 1 s), then its
#: connection is cut: a reply held longer is another claim. The first renewal counted from the
#: reply comes too late only when the reply is held longer than two thirds of the lock, so the
#: lock is the shortest allowed (1 s) and the reply held 0.8 s.
LOCK = 1.0
HELD_REPLY = 0.8
#: The lock lapses from 1 s to 1.13 s (the first renewal counted from the reply), a window a
#: duplicate every 0.1 s can miss.
DUPLICATE_EVERY = 0.02

pytestmark = [pytest.mark.postgresql, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def proxy(django_db_blocker: Any) -> Iterator[FaultProxy]:
    """A proxy to the test database's server, and an alias through it, the store's."""
    with (
        proxied_alias(ALIAS, free_port(), django_db_blocker) as proxy,
        django_db_blocker.unblock(),
        override_settings(IDEMPOTENCY={"DATABASE_ALIAS": ALIAS}),
    ):
        yield proxy


def _attempt_or_held(handle: Any, key: str) -> Any:
    try:
        return handle(key)
    except IdempotencyInProgress as exc:
        return exc
    finally:
        connections.close_all()


def test_the_first_renewal_counts_from_the_claim_not_from_its_reply_held_by_the_network(
    proxy: FaultProxy,
) -> None:
    """The owner's claim commits on the server, which sets the lock, but its reply is held
    0.8 s by the proxy under a 1 s lock; the owner then runs 1.5 s. Its first renewal is due an
    interval after the claim was sent, so as the reply comes: duplicates sent every 0.02 s from
    0.9 lock timeouts after the claim until the owner returns find the key held, and the
    function runs once. With the first renewal counted from the reply (0.8 + 0.33 s, past the
    lock's 1 s), one took the key over and ran it again."""
    runs: list[str] = []

    @idempotent_function(
        key="event_id", payload=lambda event_id, *_, **__: event_id, lock_timeout=LOCK
    )
    def handle(event_id: str, seconds: float = 0.0) -> str:
        time.sleep(seconds)
        runs.append(event_id)
        return event_id

    # A first call (another key) asks whether the claim function exists, a query naming it:
    # the held reply is then the claim's own. Each attempt's session is new (CONN_MAX_AGE 0):
    # its claim reads, then inserts with the plain statement, not the function (issue 53).
    _attempt_or_held(handle, "warm")
    runs.clear()
    insert = re.escape(f"{CLAIM_FUNCTION}(".encode()) + rb"|WITH inserted AS \(INSERT"
    held = proxy.arm("delay", insert, count=1, hold=HELD_REPLY)
    result, duplicates = owner_and_duplicates(
        partial(_attempt_or_held, lambda key: handle(key, 1.5), "k"),
        held.done,
        partial(_attempt_or_held, handle, "k"),
        0.9 * LOCK,
        DUPLICATE_EVERY,
    )
    assert result == "k", result
    assert_held_off(duplicates, "k")
    assert runs == ["k"]
