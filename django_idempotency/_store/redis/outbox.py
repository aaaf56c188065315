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

The three sorted sets are the store's, not a record's: a script that writes a record and them
touches two slots, which a Redis Cluster refuses. The outbox is served on one server (or a
Sentinel's master); a cluster store is refused by check E065 and before a view runs.

A relay takes a batch (:data:`TAKE`) by pushing each message's score forward by its lease and
counting its send: one killed between the take and the mark leaves the message due again once
the lease passes (at least once). Sent messages are kept until their record expires (for the
operator's eye), then Redis deletes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, NamedTuple

from django.utils import timezone

from django_idempotency._conf.values import CACHE_PREFIX
from django_idempotency._store.outbox import Backlog, Release
from django_idempotency._store.redis import clients, scripts
from django_idempotency._store.redis.codec import as_micros, as_time

#: ``release_messages()``: after a fenced write applied, insert the messages not released yet.
#: KEYS: record, scope index, due, left, then one key per message; the ARGV's last ``4 n + 1``
#: are each message's id, engine, task, arguments, then the lease (µs): what comes before is
#: the write's own. Returns the ids inserted. Each is due a microsecond after the one staged
#: before it: a relay takes them in the order they were staged.
_RELEASE = """
local function release_messages(now)
  local n = #KEYS - 4
  local base = #ARGV - 4 * n - 1
  local lease = tonumber(ARGV[#ARGV])
  local inserted = {}
  for i = 1, n do
    local at = base + (i - 1) * 4
    local id = ARGV[at + 1]
    if redis.call('HSETNX', KEYS[1], 'o:' .. id, '1') == 1 then
      redis.call('HSET', KEYS[4 + i], 'id', id, 'e', ARGV[at + 2], 't', ARGV[at + 3],
                 'a', ARGV[at + 4], 'n', 0, 'st', 'pending', 'ra', now, 'le', '',
                 'rk', KEYS[1])
      redis.call('ZADD', KEYS[3], now + lease + i - 1, KEYS[4 + i])
      redis.call('ZADD', KEYS[4], now, KEYS[4 + i])
      inserted[#inserted + 1] = id
    end
  end
  return inserted
end
"""


def _releasing(script: str, applied: str) -> str:
    """``script`` (a fenced write) run as a function, then, where it returned ``applied``,
    the release of its messages in the same script: ``{result, inserted ids}``. A fence that
    refuses (a late owner's write) releases nothing."""
    return (
        scripts._NOW
        + _RELEASE
        + "local function fenced()\n"
        + script
        + "\nend\nlocal done = fenced()\n"
        + f"if done == {applied} then return {{done, release_messages(now)}} end\n"
        + "return {done, {}}\n"
    )


#: The result's write (:data:`.scripts.COMPLETE`) and its messages' release.
COMPLETE_RELEASING = _releasing(scripts.COMPLETE, "1")
#: A recovery point's write (:data:`.scripts.RECOVERY_POINT`) and its messages' release.
RECOVERY_POINT_RELEASING = _releasing(scripts.RECOVERY_POINT, "1")

#: KEYS: due. ARGV: size, lease (µs). A batch due now, each message's score pushed forward by
#: the lease (a microsecond more for each: their order kept) and its send counted: ``{key,
#: id, engine, task, arguments, sends}`` each. A key
#: whose message is gone or no longer pending leaves the set.
TAKE = (
    scripts._NOW
    + """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local taken = {}
for position, key in ipairs(due) do
  local m = redis.call('HMGET', key, 'id', 'e', 't', 'a', 'st')
  if (not m[1]) or m[5] ~= 'pending' then
    redis.call('ZREM', KEYS[1], key)
  else
    local sends = redis.call('HINCRBY', key, 'n', 1)
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]) + position - 1, key)
    taken[#taken + 1] = {key, m[1], m[2], m[3], m[4], sends}
  end
end
return taken
"""
)

#: KEYS: due, left, failed. ARGV: '1' if the send was counted when taken (the relay's), then
#: message keys. Marks them sent (a send that succeeded after another relay gave the message up
#: leaves the failed set too); each is kept until its record expires (deleted now if it has).
MARK_SENT = (
    scripts._NOW
    + """
local marked = 0
for i = 2, #ARGV do
  local key = ARGV[i]
  local record = redis.call('HGET', key, 'rk')
  if record then
    redis.call('HSET', key, 'st', 'sent', 'sa', now)
    if ARGV[1] ~= '1' then redis.call('HINCRBY', key, 'n', 1) end
    redis.call('ZREM', KEYS[1], key)
    redis.call('ZREM', KEYS[2], key)
    redis.call('ZREM', KEYS[3], key)
    local expires = redis.call('HGET', record, 'ea')
    if expires then
      redis.call('PEXPIREAT', key, math.ceil(tonumber(expires) / 1000))
    else
      redis.call('DEL', key)
    end
    marked = marked + 1
  end
end
return marked
"""
)

#: KEYS: due, failed. ARGV: key, error, delay until the next try (µs; '' failed for good),
#: '1' if the send was counted when taken. Only a pending message: a relay whose lease ran out
#: while it sent must not make a message another relay delivered failed (sent again).
MARK_FAILED = (
    scripts._NOW
    + """
if redis.call('HGET', ARGV[1], 'st') ~= 'pending' then return 0 end
redis.call('HSET', ARGV[1], 'le', ARGV[2])
if ARGV[4] ~= '1' then redis.call('HINCRBY', ARGV[1], 'n', 1) end
if ARGV[3] == '' then
  redis.call('HSET', ARGV[1], 'st', 'failed')
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('ZADD', KEYS[2], tonumber(redis.call('HGET', ARGV[1], 'ra')), ARGV[1])
else
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
end
return 1
"""
)

#: KEYS: due, failed. ARGV: message keys. Failed messages made pending and due now.
RESEND = (
    scripts._NOW
    + """
local made = 0
for i = 1, #ARGV do
  if redis.call('HGET', ARGV[i], 'st') == 'failed' then
    redis.call('HSET', ARGV[i], 'st', 'pending')
    redis.call('ZREM', KEYS[2], ARGV[i])
    redis.call('ZADD', KEYS[1], now, ARGV[i])
    made = made + 1
  end
end
return made
"""
)


class Taken(NamedTuple):
    """A message a relay took: as :class:`.._store.outbox.Taken`, its ``id`` the message's key."""

    id: str
    message_id: str
    engine: str
    task: str
    arguments: str
    attempts: int

    @property
    def key(self) -> str:
        """What the store's ``mark_sent`` and ``mark_failed`` name it by: its key."""
        return self.id


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


def message_key(record: str, message_id: str, prefix: str) -> str:
    """A message's key: its record's hash tag (one slot with it), then its id."""
    tag = record[record.index("{") :]
    return f"{prefix}o:m:{tag}:{message_id}"


def releasing(
    keys: list[str], args: list[Any], release: Release, index: str, prefix: str
) -> tuple[list[str], list[Any]]:
    """A fenced write's keys and arguments with ``release``'s messages after them."""
    record = keys[0]
    more = [record, index, due_key(prefix), left_key(prefix)]
    more += [message_key(record, message.message_id, prefix) for message in release.messages]
    flat = [value for message in release.messages for value in message]
    return more, [*args, *flat, as_micros(release.lease)]


def released(reply: Any, release: Release) -> Any:
    """A releasing script's result; the ids it inserted are set on ``release``."""
    done, inserted = reply
    release.inserted = [_text(value) for value in inserted]
    return done


#: Why the outbox is not served on a Redis Cluster.
ON_CLUSTER = (
    "on a Redis Cluster a script touches one slot, and the outbox's queue (which the relay "
    "reads) is in another than the record it is released with"
)


@lru_cache(maxsize=64)
def refusal(name: str) -> str | None:
    """Why the outbox cannot be served on the store ``name`` (a store layer's name: a
    ``cache:`` alias or a URL), or ``None``: a Redis Cluster (:data:`ON_CLUSTER`), known by
    its URL, or by its cache's client (made, not connected). Asked at each request of a view
    that calls ``enqueue``: a name's topology is read once."""
    if name.startswith(clients.CLUSTER):
        return ON_CLUSTER
    if name.startswith(CACHE_PREFIX):
        try:
            client = clients.client_for(name)
        except Exception:
            return None  # not a Redis cache: E060 says so
        if clients.is_cluster(client):
            return ON_CLUSTER
    return None


def take(client_run: Any, prefix: str, size: int, lease: timedelta) -> list[Taken]:
    """Claim up to ``size`` messages due now for ``lease`` (:data:`TAKE`)."""
    reply = client_run("TAKE", [due_key(prefix)], [size, as_micros(lease)])
    return [
        Taken(_text(key), _text(id_), _text(engine), _text(task), _text(arguments), int(sends))
        for key, id_, engine, task, arguments, sends in reply
    ]


def mark_sent(client_run: Any, prefix: str, keys: Sequence[str], *, counted: bool) -> int:
    if not keys:
        return 0
    args = ["1" if counted else "0", *keys]
    keys_ = [due_key(prefix), left_key(prefix), failed_key(prefix)]
    return int(client_run("MARK_SENT", keys_, args))


def mark_failed(
    client_run: Any,
    prefix: str,
    key: str,
    error: str,
    retry_at: datetime | None,
    *,
    counted: bool,
) -> int:
    delay = "" if retry_at is None else as_micros(max(retry_at - timezone.now(), timedelta(0)))
    args = [key, error[:4000], delay, "1" if counted else "0"]
    return int(client_run("MARK_FAILED", [due_key(prefix), failed_key(prefix)], args))


def resend(client_run: Any, prefix: str, keys: Sequence[str]) -> int:
    if not keys:
        return 0
    return int(client_run("RESEND", [due_key(prefix), failed_key(prefix)], list(keys)))


def backlog(client: Any, prefix: str) -> Backlog:
    """Pending and failed messages, and the oldest undelivered one's release."""
    pipe = client.pipeline(transaction=False)
    pipe.zcard(due_key(prefix))
    pipe.zcard(failed_key(prefix))
    pipe.zrange(left_key(prefix), 0, 0, withscores=True)
    pending, failed, oldest = pipe.execute()
    first = as_time(int(oldest[0][1])) if oldest else None
    return Backlog(int(pending), int(failed), first)


def failed(client: Any, prefix: str) -> list[FailedMessage]:
    """The messages failed for good, oldest release first."""
    found = []
    for key in client.zrange(failed_key(prefix), 0, -1):
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
    return found


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
