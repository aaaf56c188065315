"""What operators read and erase across records: a scope's finished records erased now, the
records counted, one key's records in every scope, the census by status, a page of records
(the admin's) by a ``SCAN`` cursor (each a ``SCAN`` of the store's prefix or a read of a scope's
index)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django_idempotency._base import rules
from django_idempotency._base.durations import EPOCH
from django_idempotency._store.redis import codec, scripts
from django_idempotency._store.redis.codec import as_text
from django_idempotency._store.redis.keyspace import glob, record_key, scope_index
from django_idempotency._store.rows import Record
from django_idempotency.models import IdempotencyKey


def erase(
    client: Any, erase_record: Callable[[str], Any], scope: str, prefix: str, dry_run: bool
) -> tuple[int, int]:
    """Delete the scope's finished records now, each by ``erase_record`` (the ``ERASE``
    script, given the record's key): (deleted, in progress)."""
    index = scope_index(scope, prefix)
    deleted = in_progress = 0
    for member in client.zrange(index, 0, -1):
        key_hash = as_text(member)
        key = record_key(scope, key_hash, prefix)
        if dry_run:
            status = client.hget(key, "st")
            if status == b"processing":
                in_progress += 1
            elif status is not None:
                deleted += 1
            continue
        outcome = erase_record(key)
        if outcome == 1:
            deleted += 1
        elif outcome == -1:
            in_progress += 1
        if outcome != -1:
            client.zrem(index, member)
    return deleted, in_progress


def count(client: Any, prefix: str) -> int:
    """How many records the store holds (a ``SCAN`` of its prefix: an operator's figure)."""
    return sum(1 for _ in client.scan_iter(match=f"{glob(prefix)}r:*", count=1000))


def key_records(
    client: Any,
    prefix: str,
    key_hash: str,
    read: Callable[[str, str], IdempotencyKey | None],
) -> list[IdempotencyKey]:
    """The key's records in every scope (a ``SCAN`` for its hash; each read by ``read``,
    unsaved instances), oldest first: tests, operators."""
    found = []
    for name in client.scan_iter(match=f"{glob(prefix)}r:{{*:{key_hash}}}", count=1000):
        scope = client.hget(name, "sc")
        record = None if scope is None else read(as_text(scope), key_hash)
        if record is not None:
            found.append(record)
    return sorted(found, key=lambda record: record.created_at)


class _Lock(NamedTuple):
    """The fields of a record :data:`~.._base.rules.STALE` reads (its lock's end aware, as
    the server's clock is read)."""

    status: str
    unlock_at: datetime | None


def census(client: Any, prefix: str, stuck_after: timedelta = timedelta(hours=1)) -> dict[str, Any]:
    """The store's records by status, and how many are :data:`~.._base.rules.STALE` (taken
    over by their key's next request): one ``SCAN`` and pipelined ``HMGET`` calls, the times
    by the server's clock. Expired records are absent (Redis's TTL). With them, the
    operations handed on (their ``202`` stored) and those silent for ``stuck_after``, as the
    table's figures count them."""
    seconds, micro = client.time()
    now = EPOCH + timedelta(seconds=int(seconds), microseconds=int(micro))
    silent_since = (now - stuck_after - EPOCH) // timedelta(microseconds=1)
    # Every status, its count zero or not, as the table's figures list them.
    by_status = dict.fromkeys((rules.PROCESSING, rules.COMPLETED, rules.FAILED), 0)
    stale = running = stuck = 0
    oldest_update: int | None = None  # of the running operations: the longest silence's
    batch: list[Any] = []

    def tally() -> None:
        nonlocal stale, running, stuck, oldest_update
        pipe = client.pipeline(transaction=False)
        for name in batch:
            pipe.hmget(name, "st", "ua", "rs", "up")
        for status, unlock, response, updated in pipe.execute():
            if status is None:  # expired since the scan
                continue
            text = as_text(status)
            by_status[text] = by_status.get(text, 0) + 1
            unlock_at = EPOCH + timedelta(microseconds=int(unlock)) if unlock else None
            if rules.STALE.holds(_Lock(text, unlock_at), now):
                stale += 1
            if text == "completed" and response == b"202":
                running += 1
                stuck += bool(updated) and int(updated) <= silent_since
                if updated and (oldest_update is None or int(updated) < oldest_update):
                    oldest_update = int(updated)
        batch.clear()

    for name in client.scan_iter(match=f"{glob(prefix)}r:*", count=1000):
        batch.append(name)
        if len(batch) >= 1000:
            tally()
    if batch:
        tally()
    return {
        "total": sum(by_status.values()),
        "by_status": by_status,
        "stale": stale,
        "operations_running": running,
        "operations_stuck": stuck,
        "longest_operation_silence_seconds": _silence(now, oldest_update),
    }


def _silence(now: datetime, updated: int | None) -> float | None:
    """Seconds since ``updated`` (microseconds since the epoch), as the table's figure."""
    if updated is None:
        return None
    return max(0.0, (now - EPOCH - timedelta(microseconds=updated)).total_seconds())


#: ``SCAN`` calls one page makes at most: a filter that matches few records gives a short page
#: (its next cursor goes on), never a walk of the whole keyspace in one request.
PAGE_SCANS = 10


def browse(
    client: Any, prefix: str, cursor: str, size: int, status: str | None
) -> tuple[list[IdempotencyKey], str | None]:
    """A page of the store's records (``status``'s only, if given) from ``cursor`` (``"0"``:
    the first): at least ``size`` of them unless :data:`PAGE_SCANS` calls of ``SCAN`` (``COUNT
    size``) found fewer, newest first within the page; and the next page's cursor (``None``:
    the scan is over). On a cluster the cursor is a primary's (by name) and its own:
    ``<primary>:<cursor>``, each primary scanned in turn."""
    nodes = _primaries(client)
    node, at = _parse_cursor(cursor, len(nodes))
    found: list[IdempotencyKey] = []
    for _ in range(PAGE_SCANS):
        where = {} if nodes[node] is None else {"target_nodes": nodes[node]}
        at, names = client.scan(cursor=at, match=f"{glob(prefix)}r:*", count=size, **where)
        if isinstance(at, dict):  # a cluster's: by node
            (at,) = at.values()
        found += _records(client, names, status)
        if int(at) == 0:
            node, at = node + 1, 0
            if node == len(nodes):
                return _newest_first(found), None
        if len(found) >= size:
            break
    return _newest_first(found), f"{node}:{at}"


def _primaries(client: Any) -> list[Any]:
    """The nodes a scan walks: one server's (``None``), or a cluster's primaries by name."""
    if not hasattr(client, "get_primaries"):
        return [None]
    return sorted(client.get_primaries(), key=lambda node: node.name)


def _parse_cursor(cursor: str, nodes: int) -> tuple[int, int]:
    """``(node, cursor)`` of a page's cursor: ``"0"`` or ``"<node>:<cursor>"``; a malformed
    one (a URL edited by hand) starts again."""
    node, _, at = cursor.rpartition(":")
    if not (node or "0").isdigit() or not at.isdigit() or int(node or 0) >= nodes:
        return 0, 0
    return int(node or 0), int(at)


def _records(client: Any, names: list[Any], status: str | None) -> list[IdempotencyKey]:
    """The records of the keys ``names`` (pipelined ``HMGET`` calls), read as a claim that found
    them would read them; those expired since the scan are absent."""
    if not names:
        return []
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.hmget(name, "sc", *scripts.FIELDS)
    seconds, micro = client.time()
    now = int(seconds) * 1_000_000 + int(micro)
    found = []
    for name, (scope, *values) in zip(names, pipe.execute(), strict=True):
        if scope is None or values[0] is None or (status and as_text(values[0]) != status):
            continue
        key_hash = as_text(name).rpartition(":")[2][:-1]
        record: Record = codec.record(as_text(scope), key_hash, [b"found", now, *values])
        found.append(record.instance())
    return found


def _newest_first(records: list[IdempotencyKey]) -> list[IdempotencyKey]:
    return sorted(records, key=lambda record: record.created_at, reverse=True)


def eviction_policies(client: Any) -> dict[str, str]:
    """``maxmemory-policy`` of the server (under ``""``), or of each primary of a cluster (by
    its name): each holds its share of the records."""
    if not hasattr(client, "get_primaries"):
        return {"": as_text(client.config_get("maxmemory-policy")["maxmemory-policy"])}
    found = {}
    for node in client.get_primaries():
        reply = client.config_get("maxmemory-policy", target_nodes=node)
        found[node.name] = as_text(reply["maxmemory-policy"])
    return found


def unpersisted(client: Any) -> list[str]:
    """The server (``""``), or the primaries of a cluster (by ``host:port``), that run without
    ``appendonly`` (``INFO persistence``): each holds its share of the records."""
    if not hasattr(client, "get_primaries"):
        found = {"": client.info("persistence")}
    else:
        found = client.info("persistence", target_nodes=client.PRIMARIES)
        if "aof_enabled" in found:  # one primary: its reply itself
            found = {client.get_primaries()[0].name: found}
    return [node for node, info in found.items() if str(info.get("aof_enabled")) == "0"]
