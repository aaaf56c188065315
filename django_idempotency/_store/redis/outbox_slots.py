"""The slot index of the outbox on a Redis Cluster: which slots' due queues a relay takes from.

Each slot holding messages has its own queues (:func:`.outbox.queues`). Finding them by a
``SCAN`` of every primary on every batch made a batch cost the whole keyspace, and a primary
that was down failed every batch until its failover. So the slots whose due queue may hold a
message are kept in one set, ``P o:slots`` (their hash tags, :func:`slot_tag`):

* a writer adds its slot's tag (``SADD``) right after the script that released its messages
  applied (:class:`WriterIndex`; a script touches one slot, so it cannot write the set itself;
  after one such ``SADD`` fails, the process's writers skip theirs for :data:`SCAN_EVERY`),
  and a re-send (``RESEND``) adds the tags of the slots it made messages due in;
* a relay reads the set instead of scanning (:meth:`SlotIndex.due_tags`); a slot whose due
  queue it finds empty is removed (``SREM``), then the queue is looked at again and the tag
  added back if a message arrived meanwhile (:meth:`SlotIndex.emptied`): a writer whose ``SADD``
  came before the removal is never lost. A message taken under a lease stays in its due queue
  (its score in the future): its slot stays in the set until it is sent or failed for good;
* a writer that died between its script and its ``SADD`` left its message out of the set:
  every :data:`SCAN_EVERY` seconds (and at a relay's first batch) a relay scans every primary
  for due queues and adds their tags. A primary whose scan fails is passed over, said in the
  log, and scanned again at the next batch; the others' slots are relayed meanwhile;
  a scan that saw a primary's slots change or move is made again at the next batch;
* a batch takes from the slots in turn, starting after the slot the last one ended on
  (:meth:`SlotIndex.in_turn`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from django_idempotency._store.redis.faults import failures
from django_idempotency._store.redis.keyspace import glob

logger = logging.getLogger("django_idempotency")

#: How often a relay on a cluster scans every primary for due queues its index lacks
#: (seconds): the longest a message whose writer died before its ``SADD`` waits.
SCAN_EVERY = 60.0

#: The relay's clock (a test moves it on).
clock = time.monotonic


#: The hash slots of a Redis Cluster.
SLOTS = 16384


@lru_cache(maxsize=1)
def _slot_tags() -> tuple[str, ...]:
    """For each slot, the shortest decimal number whose hash tag lands in it: a slot's queues
    are named by it, so that one slot has one set of queues (computed once, ~0.1 s)."""
    found: dict[int, str] = {}
    number = 0
    while len(found) < SLOTS:
        found.setdefault(key_slot(str(number).encode()), str(number))
        number += 1
    return tuple(found[slot] for slot in range(SLOTS))


def key_slot(key: bytes) -> int:
    """``key``'s hash slot on a cluster (redis-py's, imported where the store is used)."""
    from redis.crc import key_slot as slot

    return int(slot(key))


def slot_tag(key: str) -> str:
    """The hash tag of ``key``'s slot's queues (:func:`_slot_tags`)."""
    return _slot_tags()[key_slot(key.encode())]


def index_key(prefix: str) -> str:
    """The set of the slots' tags whose due queue may hold a message."""
    return f"{prefix}o:slots"


def slot_queue(prefix: str, kind: str, tag: str) -> str:
    """The ``kind`` queue (``due``, ``left``, ``failed``) of the slot whose tag is ``tag``."""
    return f"{prefix}o:{kind}:{{{tag}}}"


def indexed(client: Any, prefix: str, tags: Iterable[str]) -> bool:
    """Add ``tags`` to the index (a re-send's, a scan's). A failure is
    logged, not raised: the message is stored, and the relay's next scan finds its slot."""
    tags = list(tags)
    if not tags:
        return True
    try:
        client.sadd(index_key(prefix), *tags)
    except failures() as exc:
        logger.warning(
            "Could not index the outbox's slot(s) %s (the next scan will): %s", tags, exc
        )
        return False
    return True


class WriterIndex:
    """A process's writers' additions to the index. Each ``SADD`` goes to the index's primary:
    one frozen (no reply: the socket timeout, 5 s) delayed every releasing write. Once one
    fails, the process's writers skip theirs for :data:`SCAN_EVERY` seconds (said once in the
    log): the relay's periodic scan finds their slots, as a writer's that died."""

    def __init__(self) -> None:
        self.skip_until = float("-inf")
        self._lock = threading.Lock()

    def add(self, client: Any, prefix: str, tag: str) -> None:
        """Add ``tag`` after a release, unless a failure's period is still running."""
        if clock() < self.skip_until:
            return
        try:
            client.sadd(index_key(prefix), tag)
        except failures() as exc:
            with self._lock:
                if clock() < self.skip_until:
                    return  # another write's failure said it
                self.skip_until = clock() + SCAN_EVERY
            logger.warning(
                "Could not index the outbox's slot %s; this process's writers skip the index "
                "for %.0f s (the relay's scan finds their slots): %s",
                tag,
                SCAN_EVERY,
                exc,
            )


def tag_of(queue: Any) -> str:
    """The slot's tag in the name of one of its queues."""
    text = queue.decode() if isinstance(queue, bytes) else str(queue)
    return text[text.rindex("{") + 1 : -1]


def unreachable(exc: BaseException) -> bool:
    """Whether a failure was its node's connection's (refused, cut, timed out): the node's
    other slots would fail as it did."""
    import redis

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (redis.ConnectionError, redis.TimeoutError)):
            return True
        seen = seen.__cause__
    return False


def _members(client: Any, prefix: str) -> set[str] | None:
    """The index's tags; ``None`` if it cannot be read (its node down: a scan stands in)."""
    try:
        members = client.smembers(index_key(prefix))
    except failures() as exc:
        logger.warning("The outbox's slot index could not be read (scanning instead): %s", exc)
        return None
    return {tag for tag in map(_tag_text, members) if tag.isdigit()}


def _tag_text(member: Any) -> str:
    return member.decode() if isinstance(member, bytes) else str(member)


def own_slots(client: Any, node: Any) -> tuple[str, ...] | None:
    """The slots ``node`` says it serves (its own line of ``CLUSTER NODES``), with the
    migrations under way to or from it (``[slot->-id]``, ``[slot-<-id]``); ``None`` where the
    command is refused (renamed, or forbidden to the store's user): not known."""
    import redis

    try:
        text = _tag_text(client.execute_command("CLUSTER", "NODES", target_nodes=node))
    except redis.ResponseError:
        return None
    lines = [line.split() for line in text.splitlines()]
    mine = [line for line in lines if len(line) > 2 and "myself" in line[2]]
    return tuple(mine[0][8:]) if mine else None


def _scanned(client: Any, prefix: str, node: Any) -> set[str]:
    """The tags of the due queues ``node`` holds (a ``SCAN``)."""
    pattern = f"{glob(prefix)}o:due:{{*"
    names = client.scan_iter(match=pattern, _type="zset", count=1000, target_nodes=node)
    return {tag_of(name) for name in names}


def _settled(client: Any, seen: dict[Any, tuple[str, ...] | None]) -> bool:
    """Whether the primaries scanned serve the slots they did before their scan, none of
    them moving (read again now; one that does not answer is owed already)."""
    for node, before in seen.items():
        if before is None:
            continue  # not known: the periodic scan alone
        if any(part.startswith("[") for part in before):
            return False
        try:
            if own_slots(client, node) != before:
                return False
        except failures():
            return False
    return True


class SlotIndex:
    """A relay's view of the index: when its next full scan is due, and the primaries whose
    last scan failed (``owed``: scanned again at each batch until one succeeds). The periodic
    scan never waits for them: while a primary was down, the healthy ones went unscanned."""

    def __init__(self) -> None:
        self.scan_at = 0.0
        self.owed: set[str] = set()
        #: The slot the last batch ended on: the next starts after it.
        self.last = -1
        #: Whether the last full scan saw slots move (:meth:`_scan`): scanned again.
        self.unsettled = False

    def in_turn(self, tags: list[str]) -> list[str]:
        """``tags`` (in slot order) from the first after :attr:`last`, round: taken from
        the first slot on, a batch that slot kept full left the later ones unsent."""
        after = [tag for tag in tags if key_slot(tag.encode()) > self.last]
        return after + tags[: len(tags) - len(after)]

    def due_tags(self, client: Any, prefix: str) -> list[str]:
        """The tags of the slots to take from: the index's, with every primary's scan when
        one is due (or the index unreadable, or the last one unsettled), and the owed
        primaries' at each batch."""
        tags = _members(client, prefix)
        if tags is None or clock() >= self.scan_at or self.unsettled:
            self.scan_at = clock() + SCAN_EVERY
            tags = (tags or set()) | self._scan(client, prefix, None)
        elif self.owed:
            tags |= self._scan(client, prefix, self.owed)
        return sorted(tags, key=lambda tag: key_slot(tag.encode()))

    def _scan(self, client: Any, prefix: str, only: set[str] | None) -> set[str]:
        """The due queues' tags on every primary (or on those ``only`` names), added to the
        index. A primary whose scan fails is passed over and owed; a name no longer a
        primary (failed over) is owed no more: the next full scan covers its successor. A
        full scan during which a primary's slots changed or moved (``CLUSTER NODES``' own
        line: a queue may have left a primary not scanned yet for one scanned already) is
        :attr:`unsettled`: the next batch scans again."""
        found: set[str] = set()
        primaries = client.get_primaries()
        self.owed &= {node.name for node in primaries}
        seen: dict[Any, tuple[str, ...] | None] = {}
        for node in primaries:
            if only is not None and node.name not in only:
                continue
            try:
                seen[node] = own_slots(client, node)
                tags = _scanned(client, prefix, node)
            except failures() as exc:
                logger.warning(
                    "The outbox relay's scan of %s failed, passed over (scanned again at the "
                    "next batch): %s",
                    node.name,
                    exc,
                )
                self.owed.add(node.name)
                continue
            found |= tags
            if indexed(client, prefix, tags):
                self.owed.discard(node.name)
            else:
                self.owed.add(node.name)
        if only is None:
            self.unsettled = not _settled(client, seen)
        return found

    def emptied(self, client: Any, prefix: str, tag: str) -> None:
        """A slot whose take found nothing due: removed from the index if its due queue is
        empty (no message, leased or not), then added back if one arrived meanwhile (its
        writer's ``SADD`` may have come before the ``SREM``). A failure leaves the tag in."""
        due = slot_queue(prefix, "due", tag)
        try:
            if client.zcard(due):
                return
            client.srem(index_key(prefix), tag)
        except failures():
            return
        try:
            if not client.zcard(due):
                return
        except failures():
            pass  # not known to be empty: kept
        indexed(client, prefix, [tag])
