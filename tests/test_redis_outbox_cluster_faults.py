"""The Redis Cluster outbox against one node's faults: a primary frozen (``SIGSTOP``) holds back
no other primary's scripts nor every releasing write, a slot migrating aborts no other slot's
marks, and a slot kept full starves no other. Needs ``redis-server`` (a private cluster)."""

from __future__ import annotations

import contextlib
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
from django_idempotency._store.redis import outbox_marks, outbox_slots
from django_idempotency._store.redis.clients import SOCKET_TIMEOUT, cluster_client
from django_idempotency._store.redis.keyspace import record_key, scope_index
from django_idempotency._store.redis.outbox import queues
from django_idempotency._store.redis.outbox_slots import key_slot
from tests.redis_servers import private_cluster
from tests.test_redis_outbox_resharding import LEASE, _cluster, _migrating
from tests.test_redis_store import _released, _released_in_slots, _releasing

pytestmark = pytest.mark.redis


@pytest.fixture
def cluster_url(tmp_path: Any) -> Iterator[str]:
    with _cluster(tmp_path) as url:
        yield url


@pytest.fixture
def nodes(tmp_path: Any) -> Iterator[private_cluster]:
    """A private cluster whose nodes serve their slots while another is frozen."""
    made = _cluster(tmp_path, "--cluster-require-full-coverage", "no")
    with made:
        yield made


@contextmanager
def _frozen(nodes: private_cluster, port: int) -> Iterator[None]:
    """The primary on ``port`` stopped (``SIGSTOP``: its socket open, nothing answered)."""
    process = nodes.processes[port]
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


def _spare(nodes: private_cluster, store: Any, client: Any) -> int:
    """A primary holding neither the outbox's slot index nor scope ``s``'s index."""
    busy = {
        _port(client, outbox_slots.index_key(store.prefix)),
        _port(client, scope_index("s", store.prefix)),
    }
    return next(port for port in nodes.ports if port not in busy)


def test_a_node_that_lost_its_scripts_is_not_held_back_by_a_frozen_primary(
    nodes: private_cluster,
) -> None:
    """redis-py's ``Script`` loads a script a node lacks on every primary: a primary frozen
    held a healthy node's write back (its socket timeout, 5 s) once that node had lost its
    scripts (a restart, ``SCRIPT FLUSH``). The script is loaded on its key's node alone."""
    store: Any = using(store_alias(nodes.url, "default"))
    client = cluster_client(nodes.url)
    frozen = _spare(nodes, store, client)
    key = next(_key_on(store, client, set(nodes.ports) - {frozen}))
    write, _ = _releasing(store, key)
    node = _port(client, record_key("s", hash_key(key), store.prefix))
    redis.Redis(port=node).script_flush()

    with _frozen(nodes, frozen):
        started = time.monotonic()
        assert write()
        took = time.monotonic() - started

    assert took < SOCKET_TIMEOUT / 2


def test_a_frozen_index_primary_holds_back_one_releasing_write_not_each(
    nodes: private_cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each releasing write added its slot's tag to the slot index, on one primary: frozen,
    it held every write back its socket timeout (5 s). After one ``SADD`` fails, the process's
    writes skip theirs for a scan's period; the relay's periodic scan finds their messages."""
    store: Any = using(store_alias(nodes.url, "default"))
    client = cluster_client(nodes.url)
    assert store.take(10, LEASE) == []  # the relay's first batch's scan done
    frozen = _port(client, outbox_slots.index_key(store.prefix))
    assert _port(client, scope_index("s", store.prefix)) != frozen
    keys = itertools.islice(_key_on(store, client, set(nodes.ports) - {frozen}), 3)
    writes = [_releasing(store, key) for key in keys]
    sadd, tries = store.client.sadd, []

    def counted(*args: Any) -> Any:
        tries.append(args)
        return sadd(*args)

    monkeypatch.setattr(store.client, "sadd", counted)
    took = []
    with _frozen(nodes, frozen):
        for write, _ in writes:
            started = time.monotonic()
            assert write()
            took.append(time.monotonic() - started)
    monkeypatch.undo()

    assert len(tries) == 1  # the first write's, which timed out
    assert took[0] >= SOCKET_TIMEOUT * 0.9
    assert max(took[1:]) < 1.0
    now = outbox_slots.clock()
    monkeypatch.setattr(outbox_slots, "clock", lambda: now + outbox_slots.SCAN_EVERY)
    taken = [message.key for message in store.take(10, LEASE)]
    assert sorted(taken) == sorted(message for _, message in writes)


def test_a_frozen_index_primary_holds_back_one_relay_batch_not_each(
    nodes: private_cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each relay batch read the slot index (``SMEMBERS``) from its frozen primary, then
    scanned every primary, asking the frozen one again and re-indexing on it: a socket
    timeout (5 s) per command, at every batch. After one failure the relay uses its last
    scan's tags and passes the frozen primary over for a scan's period; then the index again."""
    store: Any = using(store_alias(nodes.url, "default"))
    client = cluster_client(nodes.url)
    assert store.take(10, LEASE) == []  # the relay's first batch's scan done
    frozen = _port(client, outbox_slots.index_key(store.prefix))
    keys = itertools.islice(_key_on(store, client, set(nodes.ports) - {frozen}), 4)
    messages = {_released(store, key) for key in keys}
    smembers, reads = store.client.smembers, []

    def counted(*args: Any) -> Any:
        reads.append(args)
        return smembers(*args)

    monkeypatch.setattr(store.client, "smembers", counted)
    taken, took = set(), []
    with _frozen(nodes, frozen):
        for _ in range(3):
            started = time.monotonic()
            taken |= {message.key for message in store.take(1, LEASE)}
            took.append(time.monotonic() - started)

    assert len(reads) == 1  # the first batch's, which timed out
    assert max(took[1:]) < 2.0
    assert len(taken) == 3 and taken <= messages
    now = outbox_slots.clock()
    monkeypatch.setattr(outbox_slots, "clock", lambda: now + outbox_slots.SCAN_EVERY + 1)
    assert [message.key for message in store.take(1, LEASE)] == list(messages - taken)
    assert len(reads) == 2  # the index read again
    (last,) = messages - taken
    indexed = store.client.smembers(outbox_slots.index_key(store.prefix))
    assert outbox_slots.slot_tag(last).encode() in indexed


def _slot(store: Any, key: str) -> int:
    """The slot of ``key``'s record (scope ``s``): its messages' queues' too."""
    return key_slot(record_key("s", hash_key(key), store.prefix).encode())


def test_a_slot_kept_full_starves_no_later_slot(cluster_url: str) -> None:
    """Each batch took from the slots in one order, from the first: a slot that kept the
    batch full (messages released there as fast as they were sent) left every later slot's
    unsent. Each batch starts after the slot the last one ended on."""
    store: Any = using(store_alias(cluster_url, "default"))
    first, later = sorted(["k0", "k1"], key=lambda key: _slot(store, key))
    assert _slot(store, first) < _slot(store, later)
    _released(store, first)
    waiting = _released(store, later)
    more = (key for n in itertools.count() if _slot(store, key := f"r{n}") == _slot(store, first))
    sent: list[str] = []
    for _ in range(3):
        _released(store, next(more))  # the first slot kept full
        batch = [message.key for message in store.take(1, LEASE)]
        store.mark_sent(batch, counted=True)
        sent += batch

    assert waiting in sent


def test_a_slot_that_starts_migrating_is_marked_sent(cluster_url: str) -> None:
    """The mark declared its slot's ``failed`` queue, which did not exist: the server refuses
    a script whose declared keys a migrating slot's node holds in part (``TRYAGAIN``), so no
    message of a migrating slot was marked, nor any slot's after it in the pass (each sent
    again after its lease). Nothing has moved yet: both are marked."""
    store: Any = using(store_alias(cluster_url, "default"))
    moving, other = _released_in_slots(store, 2)
    assert sorted(message.key for message in store.take(10, LEASE)) == sorted([moving, other])
    _migrating(cluster_client(cluster_url), moving)

    assert store.mark_sent([moving, other], counted=True) == 2


def test_a_slot_whose_message_moved_holds_back_no_other_slot_s_marks(cluster_url: str) -> None:
    """A message moved to the new primary before its queues: its slot's mark is refused
    (nothing written: the message stays pending), said in the log, and the other slots' are
    marked; once the slot has moved, its mark goes through."""
    store: Any = using(store_alias(cluster_url, "default"))
    moving, other = _released_in_slots(store, 2)
    assert sorted(message.key for message in store.take(10, LEASE)) == sorted([moving, other])
    client = cluster_client(cluster_url)
    source, target, slot, target_id, port = _migrating(client, moving)
    source.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", moving)

    assert store.mark_sent([moving, other], counted=True) == 1
    assert store.client.hget(other, "st") == b"sent"

    rest = [key.decode() for key in source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)]
    source.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", *rest)
    for node in client.get_primaries():
        raw = redis.Redis(host=node.host, port=node.port)
        raw.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
    assert target.hget(moving, "st") == b"pending"  # nothing written by the refused mark
    assert store.mark_sent([moving], counted=True) == 1
    assert target.hget(moving, "st") == b"sent"


def test_a_scan_that_saw_a_slot_moving_is_made_again(
    cluster_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The periodic scan reads the primaries one by one: a queue that left one not scanned yet
    for one scanned already was missed, its message (its writer's ``SADD`` lost) left for the
    next period's scan. A scan during which a slot was moving is made again at the next
    batch, until one sees the slots settled."""
    store: Any = using(store_alias(cluster_url, "default"))
    assert store.take(10, LEASE) == []  # the relay's first batch's scan done
    _migrating(cluster_client(cluster_url), record_key("s", hash_key("m"), store.prefix))
    now = outbox_slots.clock()
    monkeypatch.setattr(outbox_slots, "clock", lambda: now + outbox_slots.SCAN_EVERY)
    assert store.take(10, LEASE) == []  # a periodic scan, a slot seen moving
    with monkeypatch.context() as writer:  # its writer's SADD lost
        writer.setattr(outbox_slots.WriterIndex, "add", lambda *args: None)
        message = _released(store, "k0")

    assert [taken.key for taken in store.take(10, LEASE)] == [message]


def test_a_mark_that_counts_short_is_said_and_made_again(
    cluster_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A mark's count was not read: a message its node did not hold (expired with its record,
    or not arrived yet on a slot's new primary) went unmarked unsaid. It is said in the log,
    and the slot's mark made again (once)."""
    store: Any = using(store_alias(cluster_url, "default"))
    message = _released(store, "k0")
    gone = _released(
        store,
        next(
            key
            for key in (f"r{n}" for n in itertools.count())
            if _slot(store, key) == _slot(store, "k0")
        ),
    )
    assert len(store.take(10, LEASE)) == 2
    store.client.delete(gone)  # expired with its record
    node = redis.Redis(port=_port(store.client, message))
    node.config_resetstat()

    assert store.mark_sent([message, gone], counted=True) == 1
    assert node.info("commandstats")["cmdstat_evalsha"]["calls"] == 2
    again = [r for r in caplog.records if "marking them again" in r.getMessage()]
    assert len(again) == 1


def test_a_cluster_that_refuses_cluster_nodes_is_scanned(
    cluster_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user without ``CLUSTER NODES`` (an ACL, a provider's): the scan cannot tell whether
    slots moved, and scans as before; a refusal there failed every primary's scan."""
    store: Any = using(store_alias(cluster_url, "default"))
    for node in cluster_client(cluster_url).get_primaries():
        raw = redis.Redis(host=node.host, port=node.port)
        raw.execute_command("ACL", "SETUSER", "default", "-cluster|nodes")
    with monkeypatch.context() as writer:  # its writer's SADD lost
        writer.setattr(outbox_slots.WriterIndex, "add", lambda *args: None)
        message = _released(store, "k0")

    assert [taken.key for taken in store.take(10, LEASE)] == [message]


def test_a_failed_send_in_a_slot_that_starts_migrating_is_recorded(cluster_url: str) -> None:
    """A failed send's mark declared the slot's ``failed`` queue too, which did not exist: the
    migrating slot's node refused it (``TRYAGAIN``), and the relay's pass with it."""
    from django.utils import timezone

    store: Any = using(store_alias(cluster_url, "default"))
    message = _released(store, "k0")
    assert [taken.key for taken in store.take(10, LEASE)] == [message]
    _migrating(cluster_client(cluster_url), message)
    retry = timezone.now() + LEASE

    assert store.mark_failed(message, "broker down", retry, counted=True) == 1
    assert store.client.hget(message, "le") == b"broker down"


@pytest.mark.parametrize("moved", [True, False], ids=["message-moved", "slot-migrating"])
def test_a_refused_failed_send_s_record_leaves_the_batch_s_sent_ones_marked(
    cluster_url: str, moved: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed send's record refused (its slot moving: the message gone ahead, or on its
    last send the slot's ``failed`` queue, which never existed, not to be made there) let the
    store's error out of the relay's pass before the batch's sent messages were marked: each
    was sent again after its lease, every lease while the slot moved. They are marked first;
    the refused record is said and passed over."""
    from django.test import override_settings

    from django_idempotency._ops import relay

    settings = {"STORE": cluster_url, "OUTBOX_MAX_ATTEMPTS": 2 if moved else 1}
    store: Any = using(store_alias(cluster_url, "default"))
    healthy, moving = sorted(["k0", "k1"], key=lambda key: _slot(store, key))
    sent, refused = _released(store, healthy), _released(store, moving)
    client = cluster_client(cluster_url)

    def send(engine: str, task: str, arguments: str, message_id: str) -> None:
        if message_id == moving:
            source, _, _, _, port = _migrating(client, refused)
            if moved:
                source.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", refused)
            raise RuntimeError("broker refused")

    monkeypatch.setattr(relay.outbox, "send", send)
    monkeypatch.setattr(relay, "STATEMENT_BOUND", 1.0)  # the refusal's retries, bounded
    with override_settings(IDEMPOTENCY=settings):
        done = relay.Relay(cluster_url, batch_size=10).one_pass()

    assert (done.sent, done.failed) == (1, 1)
    assert store.client.hget(sent, "st") == b"sent"


def test_a_primary_frozen_mid_batch_holds_back_the_others_marks_one_timeout_once(
    nodes: private_cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A primary frozen after the take: the marks went slot by slot, each of its slots
    waiting its socket timeout (5 s) in turn, past the healthy primaries' lease (another relay
    then sent their messages again). After one fails to connect, its other slots are passed
    over (their messages sent again after the lease); the next marks try it last."""
    monkeypatch.setattr(outbox_marks, "_silent", {})  # no earlier test's cluster's
    store: Any = using(store_alias(nodes.url, "default"))
    client = cluster_client(nodes.url)
    frozen = _spare(nodes, store, client)
    stuck = [
        _released(store, key) for key in itertools.islice(_key_on(store, client, {frozen}, "f"), 4)
    ]
    others = set(nodes.ports) - {frozen}
    healthy = [_released(store, key) for key in itertools.islice(_key_on(store, client, others), 3)]
    assert len({key_slot(key.encode()) for key in stuck}) == 4
    assert len(store.take(10, LEASE)) == 7
    with _frozen(nodes, frozen):
        started = time.monotonic()
        assert store.mark_sent(stuck + healthy, counted=True) == 3
        took = time.monotonic() - started
        ran, relayed = [], store._relayed
        monkeypatch.setattr(
            store, "_relayed", lambda *args: ran.append(args[1][0]) or relayed(*args)
        )
        assert store.mark_sent(stuck + healthy, counted=True) == 3

    assert took < SOCKET_TIMEOUT * 1.5
    assert all(store.client.hget(key, "st") == b"sent" for key in healthy)
    tried = [_port(client, queue) for queue in ran]
    assert tried[-1] == frozen and tried.count(frozen) == 1


def test_a_take_whose_other_slots_had_nothing_due_is_not_failed_by_a_frozen_one(
    nodes: private_cluster,
) -> None:
    """A take failed when one slot failed (its primary frozen) and every other answered with
    nothing due: only when every slot fails does the take fail."""
    store: Any = using(store_alias(nodes.url, "default"))
    client = cluster_client(nodes.url)
    assert store.take(10, LEASE) == []  # the relay's first batch's scan done
    frozen = _spare(nodes, store, client)
    _released(store, next(_key_on(store, client, set(nodes.ports) - {frozen})))
    assert len(store.take(10, LEASE)) == 1  # its slot: nothing due now
    _released(store, next(_key_on(store, client, {frozen}, "f")))
    with _frozen(nodes, frozen):
        assert store.take(10, LEASE) == []


def test_a_mark_made_again_counts_no_send_twice(cluster_url: str) -> None:
    """A fast path's mark (the send not counted when taken) that counted short was made
    again: the messages the first run marked were marked again, their send counted twice
    and their send time moved. A message sent already is left as it is."""
    store: Any = using(store_alias(cluster_url, "default"))
    message = _released(store, "k0")
    other = next(
        key
        for key in (f"r{n}" for n in itertools.count())
        if _slot(store, key) == _slot(store, "k0")
    )
    gone = _released(store, other)
    store.client.delete(gone)  # expired with its record

    assert store.mark_sent([message, gone], counted=False) == 1
    assert store.client.hget(message, "n") == b"1"
    sent_at = store.client.hget(message, "sa")
    assert store.mark_sent([message], counted=False) == 1
    assert store.client.hmget(message, "n", "sa") == [b"1", sent_at]


def _sent_while_failed_queue_stayed(url: str) -> tuple[Any, str, redis.Redis, str]:
    """A message failed for good, then sent (a late send), marked while its slot migrated
    with its ``left`` queue moved and its ``failed`` queue not: the mark ran on the new
    primary, the old one's failed queue kept the key, and moved along. The store, the
    message, its slot's primary and its failed queue."""
    store: Any = using(store_alias(url, "default"))
    message = _released(store, "k0")
    assert [taken.key for taken in store.take(10, LEASE)] == [message]
    assert store.mark_failed(message, "broker down", None, counted=True) == 1
    record = store.client.hget(message, "rk").decode()
    client = cluster_client(url)
    source, target, slot, target_id, port = _migrating(client, message)
    _, left, failed = queues(store.prefix, message, True)
    source.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", left, message, record)
    assert store.mark_sent([message], counted=True) == 1
    source.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", failed)
    for node in client.get_primaries():
        raw = redis.Redis(host=node.host, port=node.port)
        raw.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
    assert target.zcard(failed) == 1
    return store, message, target, failed


def test_a_sent_message_left_in_a_failed_queue_is_not_listed_nor_counted(
    cluster_url: str,
) -> None:
    """A sent message's key left in a failed queue was counted failed for good and listed
    (``--failed``) for as long as the queue lived. Not counted; the listing removes it."""
    store, _, target, failed = _sent_while_failed_queue_stayed(cluster_url)

    assert store.backlog().failed == 0
    assert store.failed_messages() == []
    assert target.zcard(failed) == 0


def test_a_sent_message_left_in_a_failed_queue_is_removed_by_a_resend(cluster_url: str) -> None:
    """``--retry-failed`` made nothing due and removed nothing: the key stayed."""
    store, message, target, failed = _sent_while_failed_queue_stayed(cluster_url)

    assert store.resend([message]) == 0
    assert target.zcard(failed) == 0
    assert target.hget(message, "st") == b"sent"


def test_the_index_primary_s_failover_ends_the_relay_s_rest(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relay rested a primary whose connection failed, and the index with it, for the
    scan's period: sending nothing there, its client never learnt of the failover, and the
    killed primary's slots (the index's too) went unrelayed for the whole period. A primary
    that answers is asked whether the rested one still serves; failed over, the client's map
    is made again and its messages are sent at once."""
    from django_idempotency._ops import relay

    with _replicated_cluster(tmp_path, monkeypatch) as (nodes, store, client):
        url, victim = nodes.url, _port(client, outbox_slots.index_key(store.prefix))
        keys = [
            key
            for node in client.get_primaries()
            for key in itertools.islice(_key_on(store, client, {node.port}, f"p{node.port}"), 3)
        ]
        for key in keys:
            _released(store, key)
        for node in client.get_primaries():  # the replicas hold every message
            _replicated(node.port)
            assert redis.Redis(port=node.port).execute_command("WAIT", 1, 5000) == 1
        sent: list[str] = []
        monkeypatch.setattr(relay.outbox, "send", lambda *call: sent.append(call[-1]))
        nodes.processes[victim].kill()
        relaying, deadline = relay.Relay(url, batch_size=2), time.monotonic() + 30
        while time.monotonic() < deadline and len(set(sent)) < len(keys):
            with contextlib.suppress(Exception):  # the failover under way: the next pass
                relaying.one_pass()
            time.sleep(0.2)
    assert sorted(sent) == sorted(keys)


def test_a_message_unindexed_during_the_index_s_failover_is_scanned_once_it_ends(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer whose ``SADD`` failed while the index's primary failed over skips the index
    (its slot not in the set on the successor): the relay that followed the failover used
    the set again without the scan its return makes, and the message waited a scan period."""
    from django_idempotency._ops import relay

    with _replicated_cluster(tmp_path, monkeypatch) as (nodes, store, client):
        url, victim = nodes.url, _port(client, outbox_slots.index_key(store.prefix))
        _replicated(victim)
        nodes.processes[victim].kill()
        relaying = relay.Relay(url, batch_size=2)
        with contextlib.suppress(Exception):
            relaying.one_pass()  # the index fails: the relay rests it
        store._writes.slot_index.skip_until = float("inf")  # a writer that skips the index
        key = next(_key_on(store, client, set(nodes.ports) - {victim}))
        _released(store, key)  # its message's id: the key
        sent: list[str] = []
        monkeypatch.setattr(relay.outbox, "send", lambda *call: sent.append(call[-1]))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not sent:
            with contextlib.suppress(Exception):  # the failover under way: the next pass
                relaying.one_pass()
            time.sleep(0.2)
    assert sent == [key]


def _replicated(port: int) -> None:
    """Wait until the primary on ``port`` has its replica in sync: one that never synced is
    not elected in its place (its data too old to be trusted)."""
    deadline = time.monotonic() + 30
    while redis.Redis(port=port).info("replication").get("slave0", {}).get("state") != "online":
        assert time.monotonic() < deadline, f"the replica of {port} never synced"
        time.sleep(0.1)


def test_a_second_frozen_primary_is_asked_of_a_failover_once_not_at_each_batch(
    nodes: private_cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the index's primary rests, each batch asks the first other primary whether it
    failed over (``CLUSTER NODES``): that one frozen too, every batch waited out its socket
    timeout. It rests as a failed scan's primary does, and the next one is asked."""
    store: Any = using(store_alias(nodes.url, "default"))
    client = store.client
    assert store.take(10, LEASE) == []  # the relay's first batch's scan done
    index = _port(client, outbox_slots.index_key(store.prefix))
    second = next(node.port for node in client.get_primaries() if node.port != index)
    serving, asked = outbox_slots.serving, []

    def counted(client: Any, node: Any) -> Any:
        asked.append(node.port)
        return serving(client, node)

    monkeypatch.setattr(outbox_slots, "serving", counted)
    with _frozen(nodes, index):
        store.take(1, LEASE)  # the index's read times out: it rests
        with _frozen(nodes, second):
            for _ in range(3):
                store.take(1, LEASE)
    assert asked.count(second) == 1, asked
    assert len(asked) >= 3  # a primary that answers asked at the later batches


@contextmanager
def _replicated_cluster(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[private_cluster, Any, Any]]:
    """A private cluster with a replica of each primary, ``STORE`` on it, the relay's first
    scan made (nothing due), and a scan period that outlasts the test: (nodes, store,
    client)."""
    from django.test import override_settings

    monkeypatch.setattr(outbox_slots, "SCAN_EVERY", 600.0)
    nodes = _cluster(tmp_path, "--cluster-require-full-coverage", "no", replicas=1)
    with nodes as url, override_settings(IDEMPOTENCY={"STORE": url}):
        store: Any = using(store_alias(url, "default"))
        assert store.take(10, LEASE) == []
        yield nodes, store, cluster_client(url)
