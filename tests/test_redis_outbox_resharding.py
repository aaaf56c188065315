"""The Redis Cluster outbox while a slot moves to another primary (``redis-cli --cluster
reshard`` moves a slot's keys one ``MIGRATE`` at a time, in any order): a relay's take never
drops a queued message it cannot see yet, and a result written meanwhile is stored. And the
relay's slot index (:mod:`.outbox_slots`): no ``SCAN`` per batch, a slot removed as a message
arrives kept, a message its writer left unindexed found by the periodic scan, a primary down
passed over. Needs ``redis-server`` (a private cluster)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis

from django_idempotency._base.keys import hash_key
from django_idempotency._conf.values import store_alias
from django_idempotency._store import _BOUND, using
from django_idempotency._store.redis import outbox_slots
from django_idempotency._store.redis.clients import cluster_client
from django_idempotency._store.redis.keyspace import record_key
from django_idempotency._store.redis.outbox import queues
from django_idempotency._store.redis.outbox_slots import key_slot
from tests.redis_servers import private_cluster
from tests.test_redis_store import _released, _released_in_slots, _releasing
from tests.waiting import wait_for

pytestmark = pytest.mark.redis

LEASE = timedelta(seconds=30)


@pytest.fixture
def cluster_url(tmp_path: Any) -> Iterator[str]:
    with _cluster(tmp_path) as url:
        yield url


@pytest.fixture
def cluster(tmp_path: Any) -> Iterator[private_cluster]:
    """A cluster whose nodes serve their slots while another is down (for the test to kill
    one of its primaries)."""
    nodes = _cluster(tmp_path, "--cluster-require-full-coverage", "no")
    with nodes:
        yield nodes


class _cluster(private_cluster):
    """A private cluster whose store (and its relay's index state) is the test's own: its
    ports, the next test's too, make the same URL, and :func:`using` keeps a store per URL."""

    def start(self) -> str:
        url = super().start()
        _BOUND.pop(store_alias(url, "default"), None)
        return url

    def stop(self) -> None:
        if self.ports:
            _BOUND.pop(store_alias(self.url, "default"), None)
        super().stop()


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


def _commands(client: Any, name: str) -> int:
    """How many ``name`` commands the cluster's primaries served since their counters were
    reset (``INFO commandstats``)."""
    total = 0
    for node in client.get_primaries():
        raw = redis.Redis(host=node.host, port=node.port)
        total += int(raw.info("commandstats").get(f"cmdstat_{name}", {}).get("calls", 0))
    return total


def _relayed(store: Any, size: int) -> list[str]:
    """Batches of ``size`` taken and marked sent until one is empty: the keys taken."""
    taken: list[str] = []
    while batch := [message.key for message in store.take(size, LEASE)]:
        store.mark_sent(batch, counted=True)
        taken += batch
    return taken


def test_the_relay_reads_the_slot_index_not_a_scan_of_every_primary(cluster_url: str) -> None:
    """Each batch found the slots' queues by a ``SCAN`` of every primary: a batch cost the
    whole keyspace. Now only the relay's first batch (and one a minute) scans; the others read
    the index, and every message is relayed once."""
    store: Any = using(store_alias(cluster_url, "default"))
    keys = _released_in_slots(store, 8)
    client = cluster_client(cluster_url)
    first = [message.key for message in store.take(2, LEASE)]  # the first batch scans
    store.mark_sent(first, counted=True)
    for node in client.get_primaries():
        redis.Redis(host=node.host, port=node.port).config_resetstat()

    taken = first + _relayed(store, 2)

    assert sorted(taken) == sorted(keys)
    assert _commands(client, "scan") == 0
    assert store.client.smembers(outbox_slots.index_key(store.prefix)) == set()


def _same_slot(store: Any, key: str) -> str:
    """Another key whose record (scope ``s``) is in ``key``'s record's slot."""
    slot = key_slot(record_key("s", hash_key(key), store.prefix).encode())
    return next(
        other
        for other in (f"r{number}" for number in itertools.count())
        if key_slot(record_key("s", hash_key(other), store.prefix).encode()) == slot
    )


def test_a_message_released_as_its_slot_leaves_the_index_is_relayed(
    cluster_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relay found a slot's due queue empty and removed its tag; a message released in
    that slot between the check and the removal (its writer's ``SADD`` before the ``SREM``)
    would be left out until the next scan. The queue is looked at again after the removal."""
    store: Any = using(store_alias(cluster_url, "default"))
    assert _relayed(store, 10) == []  # the first batch's scan done
    first = _released(store, "k0")
    assert [message.key for message in store.take(10, LEASE)] == [first]
    store.mark_sent([first], counted=True)  # its slot's due queue empty, its tag indexed
    srem = store.client.srem
    raced: list[str] = []

    def released_first(*args: Any) -> Any:
        if not raced:  # the check found the queue empty: a writer's script and SADD now
            raced.append(_released(store, _same_slot(store, "k0")))
        return srem(*args)

    monkeypatch.setattr(store.client, "srem", released_first)
    assert store.take(10, LEASE) == []  # nothing due: the slot found empty and removed
    monkeypatch.undo()

    assert len(raced) == 1
    assert [message.key for message in store.take(10, LEASE)] == raced


def test_a_message_its_writer_left_out_of_the_index_is_relayed_after_the_scan(
    cluster_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer that died between its script and its ``SADD`` left its message out of the
    index: the relay's scan, every ``SCAN_EVERY`` seconds, finds its slot's queue."""
    store: Any = using(store_alias(cluster_url, "default"))
    assert _relayed(store, 10) == []  # the first batch's scan done
    with monkeypatch.context() as writer:
        writer.setattr(outbox_slots.WriterIndex, "add", lambda *args: None)  # died before its SADD
        message = _released(store, "k0")
    assert store.take(10, LEASE) == []  # not indexed, no scan due yet

    now = outbox_slots.clock()
    monkeypatch.setattr(outbox_slots, "clock", lambda: now + outbox_slots.SCAN_EVERY)
    assert [taken.key for taken in store.take(10, LEASE)] == [message]
    indexed = store.client.smembers(outbox_slots.index_key(store.prefix))
    assert indexed == {outbox_slots.tag_of(queues(store.prefix, message, True).due).encode()}


def test_a_primary_down_holds_back_no_other_primary_s_messages(cluster: private_cluster) -> None:
    """A primary killed (no replica: its slots stay down): the relay's scan of every primary
    failed, and every batch with it, until the node came back. Now its slots are passed over
    (said in the log, scanned again next batch) and the others' messages are relayed."""
    url = cluster.url
    store: Any = using(store_alias(url, "default"))
    keys = _released_in_slots(store, 12)
    client = cluster_client(url)
    index = client.get_node_from_key(outbox_slots.index_key(store.prefix)).port
    ports = {key: client.get_node_from_key(key).port for key in keys}
    victim = next(port for port in sorted(set(ports.values())) if port != index)
    running = cluster.processes[victim]
    running.kill()
    running.wait()

    taken = [message.key for message in store.take(100, LEASE)]

    assert sorted(taken) == sorted(key for key in keys if ports[key] != victim)
    assert store._slots.owed  # the dead primary's scan still owed


def _tryagains(client: Any) -> int:
    """How many ``TRYAGAIN`` refusals the cluster's primaries answered (``INFO errorstats``)."""
    total = 0
    for node in client.get_primaries():
        raw = redis.Redis(host=node.host, port=node.port)
        total += int(raw.info("errorstats").get("errorstat_TRYAGAIN", {}).get("count", 0))
    return total


def test_a_result_written_while_its_slot_migrates_is_stored(cluster_url: str) -> None:
    """A result whose slot is migrating (its record on the source, its queues and message
    not: the source answers ``TRYAGAIN``): redis-py tries 16 times (about 0.4 s), then raises
    ``ClusterError("TTL exhausted.")``, which the store took for a refusal: the result
    unstored. Now it is tried again within the write's bound, and stored once the slot has
    moved."""
    store: Any = using(store_alias(cluster_url, "default"))
    write, message = _releasing(store, "k0")
    client = cluster_client(cluster_url)
    record = record_key("s", hash_key("k0"), store.prefix)
    source, _, slot, target_id, port = _migrating(client, record)
    outcome: list[bool] = []
    writer = threading.Thread(target=lambda: outcome.append(write(bound=60.0)))
    writer.start()
    wait_for(
        lambda: _tryagains(client) > 16 or not writer.is_alive(),
        "more TRYAGAIN refusals than redis-py's own tries",
    )
    assert writer.is_alive(), "the write gave up while its slot migrated"

    rest = [key.decode() for key in source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)]
    source.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", *rest)
    for node in client.get_primaries():
        raw = redis.Redis(host=node.host, port=node.port)
        raw.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
    writer.join(30)

    assert outcome == [True]
    assert [taken.key for taken in store.take(10, LEASE)] == [message]


def test_a_message_sent_again_is_relayed_though_its_slot_left_the_index(cluster_url: str) -> None:
    """A message failed for good leaves its due queue, and its slot the index; a re-send
    (``--retry-failed``, the admin's) makes it due again there, and indexes its slot."""
    store: Any = using(store_alias(cluster_url, "default"))
    message = _released(store, "k0")
    assert [taken.key for taken in store.take(10, LEASE)] == [message]
    assert store.mark_failed(message, "broker down", None, counted=True) == 1
    assert store.take(10, LEASE) == []  # its slot found empty: out of the index

    assert store.resend([message]) == 1
    assert [taken.key for taken in store.take(10, LEASE)] == [message]


def test_a_message_taken_under_a_lease_keeps_its_slot_indexed(cluster_url: str) -> None:
    """A batch with nothing due now is no empty slot: a message taken under a lease stays in
    its due queue, due again when the lease ends (its relay killed before its mark)."""
    store: Any = using(store_alias(cluster_url, "default"))
    message = _released(store, "k0")
    assert [taken.key for taken in store.take(10, LEASE)] == [message]
    assert store.take(10, LEASE) == []  # leased: nothing due, the slot kept

    store.client.zadd(queues(store.prefix, message, True).due, {message: 0})  # the lease ends
    assert [taken.key for taken in store.take(10, LEASE)] == [message]


def test_a_result_write_retried_after_a_lost_reply_indexes_its_slot(
    cluster_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write applied and its reply was lost (a connection cut, a failover): the retry
    answers "stored already", and no tag was added, nor did the fast path send (its ids are
    the first try's): the message waited for the relay's next scan (a reviewer's attack)."""
    from django_idempotency._store.redis import running

    store: Any = using(store_alias(cluster_url, "default"))
    assert _relayed(store, 10) == []  # the first batch's scan done: the index alone is read
    by_client, lost = running.by_client, []

    def reply_lost(client: Any, script: Any, name: str, *args: Any, **kw: Any) -> Any:
        reply = by_client(client, script, name, *args, **kw)
        if name.endswith("_RELEASING") and not lost:
            lost.append(name)
            raise redis.ConnectionError("reply lost")
        return reply

    monkeypatch.setattr(running, "by_client", reply_lost)
    write, message = _releasing(store, "k0")
    assert write()
    monkeypatch.undo()
    assert lost
    assert [taken.key for taken in store.take(10, LEASE)] == [message]


def test_a_primary_down_holds_back_no_periodic_scan_of_the_others(
    cluster: private_cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a primary was down its scan was owed, and the periodic scan waited for it: the
    healthy primaries were never scanned again, and a message there whose writer died before
    indexing it waited for the outage's end (a reviewer's attack). It waits one period."""
    store: Any = using(store_alias(cluster.url, "default"))
    assert _relayed(store, 10) == []  # the first batch's scan done
    client = cluster_client(cluster.url)
    index = client.get_node_from_key(outbox_slots.index_key(store.prefix)).port
    victim = next(port for port in cluster.ports if port != index)
    cluster.processes[victim].kill()
    cluster.processes[victim].wait()
    now = outbox_slots.clock()
    monkeypatch.setattr(outbox_slots, "clock", lambda: now + outbox_slots.SCAN_EVERY + 1)
    assert store.take(10, LEASE) == []  # a scan: the victim's fails, and is owed
    healthy = next(
        f"h{n}"
        for n in itertools.count()
        if client.get_node_from_key(record_key("s", hash_key(f"h{n}"), store.prefix)).port == index
    )
    with monkeypatch.context() as writer:  # a writer that died before its SADD
        writer.setattr(outbox_slots.WriterIndex, "add", lambda *args: None)
        message = _released(store, healthy)
    assert store.take(10, LEASE) == []  # not indexed: found by the next period's scan
    monkeypatch.setattr(outbox_slots, "clock", lambda: now + 2 * outbox_slots.SCAN_EVERY + 2)
    assert [taken.key for taken in store.take(10, LEASE)] == [message]
