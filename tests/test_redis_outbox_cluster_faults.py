"""The Redis Cluster outbox against one node's faults: a primary frozen (``SIGSTOP``) holds back
no other primary's scripts nor every releasing write, a slot migrating aborts no other slot's
marks, and a slot kept full starves no other. Needs ``redis-server`` (a private cluster)."""

from __future__ import annotations

import itertools
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis

from django_idempotency._base.keys import hash_key
from django_idempotency._conf.values import store_alias
from django_idempotency._store import using
from django_idempotency._store.redis import outbox_slots
from django_idempotency._store.redis.clients import SOCKET_TIMEOUT, cluster_client
from django_idempotency._store.redis.keyspace import record_key, scope_index
from tests.redis_servers import private_cluster
from tests.test_redis_outbox_resharding import (  # noqa: F401 (fixtures)
    LEASE,
    _cluster,
    cluster,
    cluster_url,
)
from tests.test_redis_store import _releasing

pytestmark = pytest.mark.redis


@contextmanager
def _frozen(cluster: private_cluster, port: int) -> Iterator[None]:
    """The primary on ``port`` stopped (``SIGSTOP``: its socket open, nothing answered)."""
    process = cluster.processes[port]
    process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        process.send_signal(signal.SIGCONT)


def _port(client: Any, key: str) -> int:
    return int(client.get_node_from_key(key).port)


def _key_on(store: Any, client: Any, ports: set[int], start: str = "h") -> Iterator[str]:
    """Keys whose record (scope ``s``) is on one of the primaries ``ports``."""
    for number in itertools.count():
        key = f"{start}{number}"
        if _port(client, record_key("s", hash_key(key), store.prefix)) in ports:
            yield key


def _spare(cluster: private_cluster, store: Any, client: Any) -> int:
    """A primary holding neither the outbox's slot index nor scope ``s``'s index."""
    busy = {
        _port(client, outbox_slots.index_key(store.prefix)),
        _port(client, scope_index("s", store.prefix)),
    }
    return next(port for port in cluster.ports if port not in busy)


def test_a_node_that_lost_its_scripts_is_not_held_back_by_a_frozen_primary(
    cluster: private_cluster,
) -> None:
    """redis-py's ``Script`` loads a script a node lacks on every primary: a primary frozen
    held a healthy node's write back (its socket timeout, 5 s) once that node had lost its
    scripts (a restart, ``SCRIPT FLUSH``). The script is loaded on its key's node alone."""
    store: Any = using(store_alias(cluster.url, "default"))
    client = cluster_client(cluster.url)
    frozen = _spare(cluster, store, client)
    key = next(_key_on(store, client, set(cluster.ports) - {frozen}))
    write, _ = _releasing(store, key)
    node = _port(client, record_key("s", hash_key(key), store.prefix))
    redis.Redis(port=node).script_flush()

    with _frozen(cluster, frozen):
        started = time.monotonic()
        assert write()
        took = time.monotonic() - started

    assert took < SOCKET_TIMEOUT / 2
