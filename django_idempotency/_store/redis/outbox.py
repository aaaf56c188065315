"""The outbox on the Redis store (``docs/outbox.rst``): messages released by the very script
that writes the kept result (or a recovery point), so that they exist exactly when it does, and
taken by the relay under a lease, as the database's outbox rows are.

Keys (``P`` the store's prefix, ``T`` the record's hash tag, :func:`.keyspace.record_key`):

* ``P o:m:{T}:<message id>``, a hash per message: ``id``, ``e`` engine, ``t`` task, ``a``
  arguments (JSON), ``n`` sends tried, ``st`` state (``pending``, ``sent``, ``failed``),
  ``ra``/``sa`` released and sent times (microseconds, the server's clock), ``le`` the last
  error, ``rk`` its record's key. It shares the record's hash tag: one slot with its record.
* ``o:<message id>`` fields of the record's own hash: which messages the record's life has
  released, so that a takeover (or a write tried again) staging one again releases nothing new.
  They go with the record (its TTL, its release, its erasure), as message ids are its life's.
* ``P o:due`` (a sorted set of message keys by the time they may be taken: a release's lease,
  a batch's lease, a retry's backoff), ``P o:failed`` (failed for good, by release time) and
  ``P o:left`` (every undelivered message, by release time: the backlog's oldest).

On one server (or a Sentinel's master) the three sorted sets are the store's. On a Redis
Cluster a script touches one slot, so each slot that holds messages has its own three:
``P o:due:{S}``, ``P o:failed:{S}`` and ``P o:left:{S}``, ``S`` a hash tag of that slot
(:func:`slot_tag`): a record's messages are released into its own slot's queues, in the
result's own script, as on one server. A relay finds the slots whose due queue may hold a
message in the slot index (:mod:`.outbox_slots`: ``P o:slots``, written after each release, a
``SCAN`` of each primary every minute recovering what a writer that died left out), and takes,
marks and re-sends each slot's messages by that slot's scripts (the marks:
:mod:`.outbox_marks`); the messages of one record keep
their order, those of two slots are taken in any. The operator's reads (the backlog, the failed
messages) still ``SCAN`` every primary for the ``left`` and ``failed`` queues (:func:`queue_keys`).

A relay takes a batch (:data:`.outbox_scripts.TAKE`) by pushing each message's score forward
by its lease and counting its send: one killed between the take and the mark leaves the
message due again once the lease passes (at least once). Sent messages are kept until their
record expires (for the operator's eye), then Redis deletes them. The scripts are
:mod:`.outbox_scripts`'.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django_idempotency._store.contract import Taken
from django_idempotency._store.outbox import Backlog, Release
from django_idempotency._store.redis import outbox_slots
from django_idempotency._store.redis.codec import as_micros, as_time
from django_idempotency._store.redis.faults import RedisFault
from django_idempotency._store.redis.keyspace import glob
from django_idempotency._store.redis.outbox_slots import SlotIndex, key_slot, slot_queue, slot_tag

logger = logging.getLogger("django_idempotency")


class FailedMessage(NamedTuple):
    """A message failed for good, as ``idempotency_relay --failed`` lists it (the fields it
    reads of the database's ``OutboxMessage``); ``pk`` is its key."""

    pk: str
    message_id: str
    task: str
    attempts: int
    released_at: datetime
    last_error: str


def due_key(prefix: str) -> str:
    return f"{prefix}o:due"


def failed_key(prefix: str) -> str:
    return f"{prefix}o:failed"


def left_key(prefix: str) -> str:
    return f"{prefix}o:left"


class Queues(NamedTuple):
    """The sorted sets a message is queued in: the store's, or on a cluster its slot's."""

    due: str
    left: str
    failed: str


def queues(prefix: str, key: str, cluster: bool) -> Queues:
    """The queues of the message (or record) ``key``: the store's on one server, its slot's
    on a cluster, where a script touches one slot."""
    if not cluster:
        return Queues(due_key(prefix), left_key(prefix), failed_key(prefix))
    tag = slot_tag(key)
    return Queues(*(slot_queue(prefix, kind, tag) for kind in ("due", "left", "failed")))


def queue_keys(client: Any, prefix: str, kind: str, cluster: bool) -> list[str]:
    """Every queue of ``kind`` (``due``, ``left``, ``failed``): the store's one on one server;
    on a cluster each slot's that exists (a ``SCAN`` of each primary: an empty sorted set is
    no key), in slot order. The operator's reads only: the relay reads the slot index."""
    if not cluster:
        return [f"{prefix}o:{kind}"]
    found = client.scan_iter(
        match=f"{glob(prefix)}o:{kind}:{{*", _type="zset", target_nodes=client.PRIMARIES
    )
    return sorted({_text(name) for name in found}, key=lambda name: key_slot(name.encode()))


def message_key(record: str, message_id: str, prefix: str) -> str:
    """A message's key: its record's hash tag (one slot with it), then its id."""
    tag = record[record.index("{") :]
    return f"{prefix}o:m:{tag}:{message_id}"


def releasing(
    keys: list[str], args: list[Any], release: Release, index: str, prefix: str, cluster: bool
) -> tuple[list[str], list[Any]]:
    """A fenced write's keys and arguments with ``release``'s messages after them: the record,
    its scope's index (one server only: another slot's on a cluster), its queues."""
    record = keys[0]
    due, left, _ = queues(prefix, record, cluster)
    more = [record, due, left] if cluster else [record, index, due, left]
    more += [message_key(record, message.message_id, prefix) for message in release.messages]
    flat = [value for message in release.messages for value in message]
    return more, [*args, *flat, as_micros(release.lease)]


def released(reply: Any, release: Release) -> Any:
    """A releasing script's result; the ids it inserted are set on ``release``."""
    done, inserted = reply
    release.inserted = [_text(value) for value in inserted]
    return done


def take(
    client_run: Any,
    client: Any,
    prefix: str,
    size: int,
    lease: timedelta,
    index: SlotIndex | None,
) -> list[Taken]:
    """Claim up to ``size`` messages due now for ``lease`` (:data:`.outbox_scripts.TAKE`): of
    the store's queue, or on a cluster (``index``, :mod:`.outbox_slots`) of each indexed
    slot's in turn until the batch is full, starting after the slot the last batch ended on
    (:meth:`.SlotIndex.in_turn`: a slot kept full starves no other). A slot whose take fails
    (moving to another primary, a message gone ahead of its queue: the server stops the
    script) is passed over, said in the log, and the others' batch is sent; after a
    connection's failure, the other slots of that primary too (each would spend its own try).
    Only when every slot failed does the take fail. A slot with nothing due may be empty:
    :meth:`.SlotIndex.emptied`."""
    args = [size, as_micros(lease)]
    if index is None:
        return _taken(client_run("TAKE", [due_key(prefix)], args))
    taken: list[Taken] = []
    failed: RedisFault | None = None
    down: set[str] = set()
    ran = False  # a slot answered (with nothing due, maybe): the take did not fail
    for tag in index.in_turn(index.due_tags(client, prefix)):
        index.last = key_slot(tag.encode())
        due = slot_queue(prefix, "due", tag)
        node = _node_name(client, due)
        if node in down:
            continue
        try:
            batch = _taken(client_run("TAKE", [due], [size - len(taken), args[1]]))
        except RedisFault as exc:
            logger.warning("The outbox's take from %s failed, passed over: %s", due, exc)
            failed = failed or exc
            if outbox_slots.unreachable(exc):
                down.add(node)
            continue
        ran = True
        if not batch:
            index.emptied(client, prefix, tag)
        taken += batch
        if len(taken) >= size:
            break
    if failed is not None and not ran:
        raise failed
    return taken


def _taken(reply: Any) -> list[Taken]:
    return [
        Taken(_text(key), _text(id_), _text(engine), _text(task), _text(arguments), int(sends))
        for key, id_, engine, task, arguments, sends in reply
    ]


def _node_name(client: Any, key: str) -> str:
    """The name of the primary serving ``key``'s slot, as the client knows it (``""``: none)."""
    try:
        return str(client.get_node_from_key(key).name)
    except Exception:  # a slot not covered: its take says why
        return ""


def backlog(client_run: Any, client: Any, prefix: str, cluster: bool) -> Backlog:
    """Pending and failed messages, and the oldest undelivered one's release: of the store's
    queues, or summed over a cluster's slots'. A failed queue's key whose message is no
    longer failed is not counted (:data:`.outbox_scripts.FAILED_LEFT`)."""
    pending = sum(int(client.zcard(due)) for due in queue_keys(client, prefix, "due", cluster))
    failed = sum(
        int(client_run("FAILED_LEFT", [each], ["0"])[0])
        for each in queue_keys(client, prefix, "failed", cluster)
    )
    firsts = [
        int(oldest[0][1])
        for left in queue_keys(client, prefix, "left", cluster)
        if (oldest := client.zrange(left, 0, 0, withscores=True))
    ]
    return Backlog(pending, failed, as_time(min(firsts)) if firsts else None)


def failed(client_run: Any, client: Any, prefix: str, cluster: bool) -> list[FailedMessage]:
    """The messages failed for good, oldest release first (every slot's, on a cluster). A
    failed queue's key whose message is no longer failed leaves it
    (:data:`.outbox_scripts.FAILED_LEFT`)."""
    keys = [
        key
        for queue in queue_keys(client, prefix, "failed", cluster)
        for key in client_run("FAILED_LEFT", [queue], ["1"])[1]
    ]
    found = []
    for key in keys:
        fields = client.hmget(key, "id", "t", "n", "ra", "le")
        if fields[0] is None:
            continue
        id_, task, sends, at, error = fields
        released_at = as_time(int(at))
        assert released_at is not None
        found.append(
            FailedMessage(
                _text(key), _text(id_), _text(task), int(sends), released_at, _text(error or b"")
            )
        )
    return sorted(found, key=lambda message: (message.released_at, message.pk))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
