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
  log, and scanned again at the next batch (after :data:`SCAN_EVERY` if its connection
  failed: a frozen one waits out a timeout per command); the others' slots are relayed
  meanwhile; a scan that saw a primary's slots change or move is made again at the next batch;
* the index failed (its primary down or frozen): the relay uses its last scans' tags for
  :data:`SCAN_EVERY` seconds, then reads and re-indexes (:class:`SlotIndex`);
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


def _tag_text(member: Any) -> str:
    return member.decode() if isinstance(member, bytes) else str(member)


def _node_of(client: Any, key: str) -> str:
    """The name of the primary serving ``key``'s slot, as the client knows it (``""``: none)."""
    try:
        return str(client.get_node_from_key(key).name)
    except Exception:  # a slot not covered: its take says why
        return ""


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


def _settled(client: Any, seen: dict[str, tuple[Any, tuple[str, ...] | None]]) -> bool:
    """Whether the primaries scanned (by name: redis-py 5.3's nodes are not hashable) serve
    the slots they did before their scan, none of them moving (read again now; one that
    does not answer is owed already)."""
    for node, before in seen.values():
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


def serving(client: Any, node: Any) -> set[str] | None:
    """The primaries that hold slots now (``host:port``), as ``node``'s ``CLUSTER NODES``
    says: one failed over holds none (its replica does); one frozen or dead, not failed
    over, keeps its slots, ``fail`` or not. ``None`` where the command is refused."""
    import redis

    try:
        text = _tag_text(client.execute_command("CLUSTER", "NODES", target_nodes=node))
    except redis.ResponseError:
        return None
    found = set()
    for line in (line.split() for line in text.splitlines()):
        if len(line) > 8 and "master" in line[2].split(","):
            found.add(line[1].split("@")[0].split(",")[0])
    return found


class SlotIndex:
    """A relay's view of the index: when its next full scan is due, and the primaries whose
    last scan failed (``owed``: scanned again at each batch until one succeeds). The periodic
    scan never waits for them: while a primary was down, the healthy ones went unscanned.

    A frozen primary (no reply: the socket timeout, 5 s, at each command) cost every batch
    that timeout per command sent to it. So, as a writer's :class:`WriterIndex`, the relay
    remembers a failure for :data:`SCAN_EVERY` seconds: after the index failed (``SMEMBERS``,
    ``SADD``, ``SREM``), the last scan's tags stand in for it (a full scan at the period's
    end uses it again); a primary whose scan (or the index's command) timed out or was
    refused its connection is owed but not asked again (``CLUSTER NODES``, ``SCAN``, its
    slots' takes) until then."""

    def __init__(self) -> None:
        self.scan_at = 0.0
        self.owed: set[str] = set()
        #: The slot the last batch ended on: the next starts after it.
        self.last = -1
        #: Whether the last full scan saw slots move (:meth:`_scan`): scanned again.
        self.unsettled = False
        #: Until when the index is not used (a failure's period), and the last scans' tags.
        self.index_down_until = float("-inf")
        self.scanned: set[str] = set()
        #: The primary the index failed on (another serving it now: a failover, used again).
        self.index_on = ""
        #: The primaries not asked until a time (their connection failed).
        self.resting: dict[str, float] = {}

    def in_turn(self, tags: list[str]) -> list[str]:
        """``tags`` (in slot order) from the first after :attr:`last`, round: taken from
        the first slot on, a batch that slot kept full left the later ones unsent."""
        after = [tag for tag in tags if key_slot(tag.encode()) > self.last]
        return after + tags[: len(tags) - len(after)]

    def due_tags(self, client: Any, prefix: str) -> list[str]:
        """The tags of the slots to take from: the index's (the last scans' while it is
        down), with every primary's scan when one is due (or the index just failed or came
        back, or the last scan unsettled), and the owed primaries' at each batch."""
        self._follow_failover(client)
        tags = self._members(client, prefix)
        if tags is None or clock() >= self.scan_at or self.unsettled:
            self.scan_at = clock() + SCAN_EVERY
            tags = (set(self.scanned) if tags is None else tags) | self._scan(client, prefix, None)
        elif self.owed:
            tags |= self._scan(client, prefix, self.owed)
        return self.asked(client, prefix, sorted(tags, key=lambda tag: key_slot(tag.encode())))

    def _follow_failover(self, client: Any) -> None:
        """While a primary rests or the index is not used: asked of a primary that answers,
        whether one of them no longer serves (failed over: its replica does); if so, the
        client's map of slots is made again and their rest ends. Nothing sent to a primary
        that rests, the client never learnt of its failover: its slots, the index with
        them, went unrelayed for the whole period."""
        gone = set(self.resting) | ({self.index_on} if self.index_on else set())
        if not gone:
            return
        now = self._serving_now(client, gone)
        if now is None or not (moved := gone - now):
            return
        for name in moved:
            self.resting.pop(name, None)
        if self.index_on in moved:  # back on its successor: scanned now, as in _members
            self.index_on, self.index_down_until = "", float("-inf")
            self.scan_at = clock()
        try:
            client.nodes_manager.initialize()
        except failures():
            pass  # the next batch asks again

    def _serving_now(self, client: Any, gone: set[str]) -> set[str] | None:
        """:func:`serving` as the first primary not ``gone`` that answers says; one whose
        connection fails rests as a scan's would (asked first at each batch, a second frozen
        primary cost every batch its socket timeout). ``None``: none said."""
        for node in client.get_primaries():
            if node.name in gone or self._resting(node.name):
                continue
            try:
                return serving(client, node)
            except failures() as exc:
                if not unreachable(exc):
                    return None
                self._passed_over(node.name, exc)
        return None

    def _members(self, client: Any, prefix: str) -> set[str] | None:
        """The index's tags; ``None`` if it failed now (a scan stands in). While it is down,
        the last scans' tags, and no scan is due before its time."""
        if clock() < self.index_down_until and self._index_node(client, prefix) == self.index_on:
            return set(self.scanned)  # on the primary that failed: a failover ends the period
        try:
            members = client.smembers(index_key(prefix))
        except failures() as exc:
            self._index_failed(client, prefix, "read", exc)
            return None
        if self.index_down_until > float("-inf"):  # back: what was scanned meanwhile indexed
            self.index_on, self.index_down_until = "", float("-inf")
            self.scan_at = clock()
        return {tag for tag in map(_tag_text, members) if tag.isdigit()}

    def _index_failed(self, client: Any, prefix: str, what: str, exc: BaseException) -> None:
        """The index failed: not used for :data:`SCAN_EVERY` seconds (said once). If its
        connection did, its primary rests too (owed: its scan would wait as long)."""
        if clock() < self.index_down_until:
            return
        self.index_down_until = clock() + SCAN_EVERY
        name = self.index_on = self._index_node(client, prefix)
        if unreachable(exc):
            self.owed.add(name)
            self.resting[name] = self.index_down_until
        logger.warning(
            "The outbox's slot index could not be %s; the relay uses its scans instead for "
            "%.0f s: %s",
            what,
            SCAN_EVERY,
            exc,
        )

    @staticmethod
    def _index_node(client: Any, prefix: str) -> str:
        """The primary serving the index, as the client knows it now."""
        return _node_of(client, index_key(prefix))

    def _add(self, client: Any, prefix: str, tags: set[str]) -> bool:
        """Add a scan's ``tags`` to the index (not while it is down)."""
        self.scanned |= tags
        if not tags or clock() < self.index_down_until:
            return True
        try:
            client.sadd(index_key(prefix), *tags)
        except failures() as exc:
            self._index_failed(client, prefix, "written", exc)
            return False
        return True

    def _scan(self, client: Any, prefix: str, only: set[str] | None) -> set[str]:
        """The due queues' tags on every primary (or on those ``only`` names), added to the
        index. A primary whose scan fails is passed over and owed (one whose connection
        failed rests: not asked for :data:`SCAN_EVERY` seconds); a name no longer a
        primary (failed over) is owed no more: the next full scan covers its successor. A
        full scan during which a primary's slots changed or moved (``CLUSTER NODES``' own
        line: a queue may have left a primary not scanned yet for one scanned already) is
        :attr:`unsettled`: the next batch scans again."""
        found: set[str] = set()
        primaries = client.get_primaries()
        self.owed &= {node.name for node in primaries}
        seen: dict[str, tuple[Any, tuple[str, ...] | None]] = {}
        for node in primaries:
            if (only is not None and node.name not in only) or self._resting(node.name):
                continue
            try:
                seen[node.name] = node, own_slots(client, node)
                tags = _scanned(client, prefix, node)
            except failures() as exc:
                self._passed_over(node.name, exc)
                continue
            found |= tags
            if self._add(client, prefix, tags):
                self.owed.discard(node.name)
            else:
                self.owed.add(node.name)
        if only is None:
            self.scanned = set(found)
            self.unsettled = not _settled(client, seen)
        return found

    def _passed_over(self, name: str, exc: BaseException) -> None:
        """A primary whose scan failed: owed; resting if its connection failed."""
        self.owed.add(name)
        if unreachable(exc):
            self.resting[name] = clock() + SCAN_EVERY
        logger.warning(
            "The outbox relay's scan of %s failed, passed over (scanned again at the next "
            "batch%s): %s",
            name,
            f" after {SCAN_EVERY:.0f} s" if name in self.resting else "",
            exc,
        )

    def _resting(self, name: str) -> bool:
        """Whether the primary ``name`` is not asked (its connection failed lately)."""
        if clock() < self.resting.get(name, float("-inf")):
            return True
        self.resting.pop(name, None)
        return False

    def asked(self, client: Any, prefix: str, tags: list[str]) -> list[str]:
        """``tags`` but those of a resting primary's slots (each take would wait it out)."""
        if not self.resting:
            return tags
        return [
            tag
            for tag in tags
            if not self._resting(_node_of(client, slot_queue(prefix, "due", tag)))
        ]

    def emptied(self, client: Any, prefix: str, tag: str) -> None:
        """A slot whose take found nothing due: removed from the index if its due queue is
        empty (no message, leased or not), then added back if one arrived meanwhile (its
        writer's ``SADD`` may have come before the ``SREM``). A failure leaves the tag in
        (the index's: :meth:`_index_failed`)."""
        due = slot_queue(prefix, "due", tag)
        try:
            if client.zcard(due):
                return
        except failures():
            return
        self.scanned.discard(tag)
        if clock() < self.index_down_until:
            return  # the index not used: its next scan re-indexes
        try:
            client.srem(index_key(prefix), tag)
        except failures() as exc:
            self._index_failed(client, prefix, "written", exc)
            return
        try:
            if not client.zcard(due):
                return
        except failures():
            pass  # not known to be empty: kept
        self._add(client, prefix, {tag})
