"""A Redis record as an operation: its id, the index that finds it, its status read, its
final response written once and its progress (the database store's :mod:`.._store.operations`).

A Redis record has no primary key (:class:`.store.RedisStore`'s ``pk`` is a number of one
process), so each record gets an id of its own when it begins: 16 random bytes, its ``oid``
field, written by the claim's script (a takeover keeps it, as it keeps ``ca``; a record expired
and claimed again is a new one with a new id). The operation's name, what the operation id's
MAC covers in place of a primary key (:mod:`.._call.operations`), is ``r<store>-<oid>``:
``<store>`` a short hash of the store's alias (the status endpoint of any process finds the
store among those its settings and views name, :func:`resolve`), never the alias itself (a
URL may carry a password).

The index ``o:{<oid>}`` names the record's key. It is written when the id is first handed
out (:func:`index`: a claim's ``operation_id``, a duplicate's ``202``), never by the claim
itself: a view that never reads its operation pays nothing, and on a cluster the index is in
another slot than the record, which no script may touch together. It expires with the record
(written again whenever the record's expiry moves: the ``202`` stored, the final response
stored with a TTL of its own), and only points: every read checks the record's ``oid``, so
an index that outlives its record, or a record of a new life under the same key, names
nothing.

The final response replaces the stored ``202`` in one script (:data:`COMPLETE_OPERATION`)
whose condition is that ``202`` of this life (``oid`` and ``ca``) unexpired by the server's
clock: two concurrent completions cannot both apply.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Iterator
from typing import Any

from django_idempotency._store.contract import Operation
from django_idempotency._store.operation_states import state_of
from django_idempotency._store.redis.codec import as_instant, as_json, as_text, as_time
from django_idempotency._store.redis.keyspace import glob, scope_index
from django_idempotency._store.redis.names import name

#: The record's fields an operation reads, in this order.
_READ = ("oid", "sc", "st", "rs", "rh", "rb", "ca", "ea", "ua", "rp", "rd")

_FENCE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local key = KEYS[1]
local r = redis.call('HMGET', key, 'oid', 'ca', 'st', 'rs', 'ea')
if r[1] ~= ARGV[1] or r[2] ~= ARGV[2] or r[3] ~= 'completed' or r[4] ~= '202'
   or tonumber(r[5]) <= now then
  return 0
end
"""

#: ARGV: oid, ca (this life), status, response status, headers JSON, body, '1' if a body, own
#: ttl (µs, '' none), key hash. The record's expiry (µs, never 0): the final response
#: replaced the ``202``; 0: the record is no such operation's handed-on ``202`` (any longer)
#: (a number, as every script's reply: :func:`.faults.understood`). With
#: ``KEYS[2]`` (one server) the scope's index (erasure) learns the record's new expiry.
COMPLETE_OPERATION = (
    _FENCE
    + """
redis.call('HSET', key, 'st', ARGV[3], 'rs', ARGV[4], 'rh', ARGV[5], 'up', now)
if ARGV[7] == '1' then redis.call('HSET', key, 'rb', ARGV[6]) else redis.call('HDEL', key, 'rb') end
local expires = tonumber(r[5])
if ARGV[8] ~= '' then
  expires = now + tonumber(ARGV[8])
  redis.call('HSET', key, 'ea', expires)
  redis.call('PEXPIREAT', key, math.ceil(expires / 1000))
  if KEYS[2] then
    redis.call('ZADD', KEYS[2], expires, ARGV[9])
    local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
    redis.call('PEXPIREAT', KEYS[2], math.ceil(tonumber(last[2]) / 1000) + 1000)
  end
end
return expires
"""
)

#: ARGV: oid, ca, the progress's recovery point name, its data (JSON). 1: set; 0: refused as
#: :data:`COMPLETE_OPERATION` refuses.
OPERATION_PROGRESS = (
    _FENCE
    + """
redis.call('HSET', key, 'rp', ARGV[3], 'rd', ARGV[4], 'up', now)
return 1
"""
)


def index_key(oid: str, prefix: str) -> str:
    """The key that names the record of operation ``oid`` (its own slot on a cluster)."""
    return f"{prefix}o:{{{oid}}}"


def read(client: Any, alias: str, prefix: str, oid: str) -> Operation | None:
    """Operation ``oid``'s record, through its index; ``None``: no such operation (the index
    gone, or its record gone or of another life)."""
    key = client.get(index_key(oid, prefix))
    if key is None:
        return None
    key = as_text(key)
    values = client.hmget(key, *_READ)
    if values[0] is None or as_text(values[0]) != oid:
        return None
    _, scope, status, response, headers, body, created, expires, unlock, point, data = values
    return Operation(
        pk=name(alias, oid),
        scope=as_text(scope),
        key_hash=key.rpartition(":")[2].rstrip("}"),
        status=as_text(status),
        response_status=int(response) if response else None,
        response_headers=json.loads(headers) if headers else None,
        response_body=None if body is None else bytes(body),
        created_at=as_instant(created),
        expires_at=as_instant(expires),
        unlock_at=as_time(unlock),
        recovery_point=as_text(point or b""),
        recovery_data=as_json(data),
        alias=alias,
    )


def list_key(scope: str, prefix: str) -> str:
    """The sorted set of a scope's operations whose ids were handed out: oid by ``ca`` (the
    list endpoint's order, newest first), in its own slot on a cluster."""
    return f"{prefix}p:{scope_index(scope, '')}"


def index(client: Any, key: str, oid: str, prefix: str, fields: Any = None) -> None:
    """Write the index of operation ``oid`` (record ``key``), expiring with the record, and
    add it to its scope's list; ``fields``: the record's ``ca``, ``ea`` and ``sc`` when read
    already. Nothing when the record is gone."""
    if fields is None:
        fields = client.hmget(key, "ca", "ea", "sc")
    created, expires, scope = fields
    if expires is None or created is None or scope is None:
        return
    at = -(-int(expires) // 1000)  # ms, as the record's own PEXPIREAT
    listed = list_key(as_text(scope), prefix)
    pipe = client.pipeline(transaction=False)
    pipe.set(index_key(oid, prefix), key, pxat=at)
    pipe.zadd(listed, {oid: int(created)})
    pipe.pexpireat(listed, at, gt=True)  # it lasts as long as its last operation
    pipe.pexpireat(listed, at, nx=True)
    pipe.execute()


def listed(
    client: Any,
    alias: str,
    prefix: str,
    scopes: set[str],
    before: int | None,
    limit: int,
    state: str | None,
) -> list[Operation]:
    """The unexpired operations of ``scopes`` whose ids were handed out, newest first (by
    ``ca``), at most ``limit``, those begun before ``before`` (µs: the list's cursor), in
    ``state`` if given. An operation whose record is gone leaves its scope's list here."""
    from django.utils import timezone

    now = timezone.now()
    found: list[Operation] = []
    streams = [_newest(client, list_key(scope, prefix), before) for scope in scopes]
    for _, key, oid in heapq.merge(*streams, key=lambda item: -item[0]):
        operation = read(client, alias, prefix, oid)
        if operation is None or operation.expired(now):
            client.zrem(key, oid)
            continue
        if state is None or state_of(operation, now) == state:
            found.append(operation)
            if len(found) == limit:
                break
    return found


def _newest(client: Any, key: str, before: int | None) -> Iterator[tuple[int, str, str]]:
    """(ca, key, oid) of a scope's list, newest first, before ``before``: read a page at a
    time."""
    top: Any = "+inf" if before is None else f"({before}"
    while True:
        page = client.zrevrangebyscore(key, top, "-inf", start=0, num=_PAGE, withscores=True)
        for oid, score in page:
            yield int(score), key, as_text(oid)
        if len(page) < _PAGE:
            return
        top = f"({int(page[-1][1])}"


_PAGE = 100


def stuck(
    client: Any, alias: str, prefix: str, older_than: int, read: Callable[[str, str], Any]
) -> list[Any]:
    """The store's operations handed on (their ``202`` stored) whose record had no word for
    ``older_than`` µs by the server's clock: a ``SCAN`` and pipelined reads (an operator's
    command, as :func:`.scans.census`). Each is its record as ``read`` reads it (an unsaved
    instance) with its operation's name as its ``pk``, oldest word first."""
    seconds, micro = client.time()
    before = int(seconds) * 1_000_000 + int(micro) - older_than
    found = []
    names = list(client.scan_iter(match=f"{glob(prefix)}r:*", count=1000))
    for at in range(0, len(names), 1000):
        batch = names[at : at + 1000]
        pipe = client.pipeline(transaction=False)
        for key in batch:
            pipe.hmget(key, "st", "rs", "up", "oid", "sc")
        for key, (status, response, updated, oid, scope) in zip(batch, pipe.execute(), strict=True):
            if status != b"completed" or response != b"202" or not oid or scope is None:
                continue
            if updated is None or int(updated) > before:
                continue
            record = read(as_text(scope), as_text(key).rpartition(":")[2].rstrip("}"))
            if record is not None:
                record.pk = name(alias, as_text(oid))
                found.append(record)
    return sorted(found, key=lambda record: record.updated_at)
