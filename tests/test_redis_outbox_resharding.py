"""The Redis Cluster outbox while a slot moves to another primary (``redis-cli --cluster
reshard`` moves a slot's keys one ``MIGRATE`` at a time, in any order): a relay's take never
drops a queued message it cannot see yet. Needs ``redis-server`` (a private cluster)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis

from django_idempotency._conf.values import store_alias
from django_idempotency._store import using
from django_idempotency._store.redis.clients import cluster_client
from django_idempotency._store.redis.outbox import queues
from tests.redis_servers import private_cluster
from tests.test_redis_store import _released_in_slots

pytestmark = pytest.mark.redis

LEASE = timedelta(seconds=30)


@pytest.fixture
def cluster_url(tmp_path: Any) -> Iterator[str]:
    with private_cluster(tmp_path) as url:
        yield url


def _node(client: Any, key: str) -> redis.Redis:
    node = client.get_node_from_key(key)
    return redis.Redis(host=node.host, port=node.port)


def _migrating(client: Any, key: str) -> tuple[redis.Redis, redis.Redis, int, str, int]:
    """Start moving ``key``'s slot from its primary to another, as ``redis-cli --cluster
    reshard`` does before its first ``MIGRATE``: the source, the target, the slot, the
    target's id and port."""
    source = _node(client, key)
    target = next(
        redis.Redis(host=node.host, port=node.port)
        for node in client.get_primaries()
        if node.port != source.connection_pool.connection_kwargs["port"]
    )
    slot = client.keyslot(key)
    source_id, target_id = (n.execute_command("CLUSTER", "MYID").decode() for n in (source, target))
    target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
    source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
    return source, target, slot, target_id, int(target.connection_pool.connection_kwargs["port"])


def test_a_take_during_a_slot_s_migration_keeps_the_message_it_cannot_see(
    cluster_url: str,
) -> None:
    """The slot's queues moved to the new primary before its message: the relay's take there
    (an ``ASK`` redirection) read the message as gone and dropped it from the due queue, and
    once the message arrived no relay ever took it (a message lost for good)."""
    store: Any = using(store_alias(cluster_url, "default"))
    (message,) = _released_in_slots(store, 1)
    client = cluster_client(cluster_url)
    source, target, slot, target_id, port = _migrating(client, message)
    due, left, _ = queues(store.prefix, message, True)
    source.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", due, left)

    assert store.take(10, LEASE) == []  # its message is still on the source

    rest = [key.decode() for key in source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)]
    source.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", *rest)
    for node in client.get_primaries():
        raw = redis.Redis(host=node.host, port=node.port)
        raw.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
    client.nodes_manager.initialize()
    store.client.nodes_manager.initialize()
    assert target.zscore(due, message) is not None  # still queued, due within a lease
    target.zadd(due, {message: 0})  # the lease passed
    assert [taken.key for taken in store.take(10, LEASE)] == [message]


def test_a_slot_whose_message_left_first_holds_back_no_other_slot(cluster_url: str) -> None:
    """The message moved to the new primary before its queue: the take on the old one reads a
    key it no longer holds, which the server refuses (the script stops). That refusal failed the
    whole batch, every other slot's messages taken with it held a lease unsent, batch after
    batch, as long as the slot moved: now the other slots' messages are sent."""
    store: Any = using(store_alias(cluster_url, "default"))
    moving, other = _released_in_slots(store, 2)
    source, _, _, _, port = _migrating(cluster_client(cluster_url), moving)
    source.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", moving)

    assert [taken.key for taken in store.take(10, LEASE)] == [other]
