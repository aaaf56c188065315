"""The outbox's Lua scripts on the Redis store (:mod:`.outbox` says what the keys hold): the
release of a fenced write's messages in the write's own script, and the relay's take, marks
and re-send, each run atomically by the server on its own clock."""

from __future__ import annotations

from django_idempotency._store.redis import scripts

#: ``release_messages()``: after a fenced write applied, insert the messages not released yet.
#: KEYS: record, scope index (one server only: on a cluster it is another slot's), due, left
#: (the store's, or on a cluster the record's slot's), then one key per message; the ARGV's last
#: ``4 n + 1`` are each message's id, engine, task, arguments, then the lease (µs): what comes
#: before is the write's own. Returns the ids inserted. Each is due a microsecond after the one
#: staged before it: a relay takes them in the order they were staged. ``%(due)s``: the due
#: queue's position in KEYS.
_RELEASE = """
local function release_messages(now)
  local q = %(due)s
  local n = #KEYS - q - 1
  local base = #ARGV - 4 * n - 1
  local lease = tonumber(ARGV[#ARGV])
  local inserted = {}
  for i = 1, n do
    local at = base + (i - 1) * 4
    local id = ARGV[at + 1]
    if redis.call('HSETNX', KEYS[1], 'o:' .. id, '1') == 1 then
      redis.call('HSET', KEYS[q + 1 + i], 'id', id, 'e', ARGV[at + 2], 't', ARGV[at + 3],
                 'a', ARGV[at + 4], 'n', 0, 'st', 'pending', 'ra', now, 'le', '',
                 'rk', KEYS[1])
      redis.call('ZADD', KEYS[q], now + lease + i - 1, KEYS[q + 1 + i])
      redis.call('ZADD', KEYS[q + 1], now, KEYS[q + 1 + i])
      inserted[#inserted + 1] = id
    end
  end
  return inserted
end
"""


def _releasing(script: str, applied: str, due: int = 3) -> str:
    """``script`` (a fenced write) run as a function, then, where it returned ``applied``,
    the release of its messages in the same script: ``{result, inserted ids}``. A fence that
    refuses (a late owner's write) releases nothing. ``due``: the due queue's key's position
    (3 on one server, after the scope's index; 2 on a cluster, which has none there)."""
    return (
        scripts._NOW
        + _RELEASE % {"due": due}
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
#: On a cluster (:func:`.outbox.releasing`): the result's write without its scope's index
#: (another slot's, written after: :meth:`.fencing.FencedWrites.index`), and its messages'
#: release into its slot's queues.
SLOT_COMPLETE_RELEASING = _releasing(scripts.COMPLETE_ON_SLOT, "1", due=2)
#: On a cluster: a recovery point's write and its messages' release into its slot's queues.
SLOT_RECOVERY_POINT_RELEASING = _releasing(scripts.RECOVERY_POINT, "1", due=2)

#: KEYS: due. ARGV: size, lease (µs). A batch due now, each message's score pushed forward by
#: the lease (a microsecond more for each: their order kept) and its send counted: ``{key,
#: id, engine, task, arguments, sends}`` each. A key whose message is no longer pending leaves
#: the set; one whose message this node does not hold stays, due a lease later: on a cluster
#: whose slot moves to another primary key by key, the queue may arrive before its message
#: (a take there, redirected by ``ASK``, dropped it, and the message arrived to no queue).
TAKE = (
    scripts._NOW
    + """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local taken = {}
for position, key in ipairs(due) do
  local m = redis.call('HMGET', key, 'id', 'e', 't', 'a', 'st')
  if not m[1] then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]) + position - 1, key)
  elseif m[5] ~= 'pending' then
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

#: ``here(key)``: whether ``key`` is this node's to touch. On a cluster, while its slot moves
#: to another primary, a key this node no longer holds (or never held: it cannot tell) stops
#: the script with an error at its first command, after what it already wrote; read with
#: ``pcall`` first, a script refuses before writing anything (:data:`MOVING`), and a refusal
#: is redis-py's ``TRYAGAIN``: tried again within the call's bound. Elsewhere, always true.
_HERE = """
local function here(key)
  return type(redis.pcall('EXISTS', key)) ~= 'table'
end
local moving = 'TRYAGAIN a key of the outbox is moving to another node'
"""

#: KEYS: left (one queue, which holds every undelivered message: a script's declared keys that
#: a moving slot's node lacks in part are refused by the server, a ``failed`` queue that never
#: existed was one). ARGV: '1' if the send was counted when taken (the relay's), due, failed,
#: then message keys. Marks them sent, out of the queues their state has them in (a send that
#: succeeded after another relay gave the message up leaves the failed set); each is kept until
#: its record expires (deleted now if it has). A message sent already (a mark made again) is
#: counted and left as it is: its send is not counted twice, its send time not moved. Refused,
#: nothing written, if a key it needs is moving (:data:`_HERE`).
MARK_SENT = (
    scripts._NOW
    + _HERE
    + """
local found, marked = {}, 0
for i = 4, #ARGV do
  if not here(ARGV[i]) then return redis.error_reply(moving) end
  local m = redis.call('HMGET', ARGV[i], 'rk', 'st')
  if m[2] == 'sent' then
    marked = marked + 1
  elseif m[1] then
    local queue = ({pending = ARGV[2], failed = ARGV[3]})[m[2]]
    if not here(m[1]) or (queue and not here(queue)) then return redis.error_reply(moving) end
    found[#found + 1] = {ARGV[i], m[1], queue}
  end
end
for _, m in ipairs(found) do
  local key, record, queue = m[1], m[2], m[3]
  redis.call('HSET', key, 'st', 'sent', 'sa', now)
  if ARGV[1] ~= '1' then redis.call('HINCRBY', key, 'n', 1) end
  redis.call('ZREM', KEYS[1], key)
  if queue then redis.call('ZREM', queue, key) end
  local expires = redis.call('HGET', record, 'ea')
  if expires then
    redis.call('PEXPIREAT', key, math.ceil(tonumber(expires) / 1000))
  else
    redis.call('DEL', key)
  end
end
return #found + marked
"""
)

#: KEYS: due. ARGV: key, error, delay until the next try (µs; '' failed for good), '1' if the
#: send was counted when taken, failed. Only a pending message: a relay whose lease ran out
#: while it sent must not make a message another relay delivered failed (sent again). Refused,
#: nothing written, if a key it needs is moving (:data:`_HERE`).
MARK_FAILED = (
    scripts._NOW
    + _HERE
    + """
if not here(ARGV[1]) then return redis.error_reply(moving) end
if redis.call('HGET', ARGV[1], 'st') ~= 'pending' then return 0 end
if ARGV[3] == '' and not here(ARGV[5]) then return redis.error_reply(moving) end
redis.call('HSET', ARGV[1], 'le', ARGV[2])
if ARGV[4] ~= '1' then redis.call('HINCRBY', ARGV[1], 'n', 1) end
if ARGV[3] == '' then
  redis.call('HSET', ARGV[1], 'st', 'failed')
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('ZADD', ARGV[5], tonumber(redis.call('HGET', ARGV[1], 'ra')), ARGV[1])
else
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
end
return 1
"""
)

#: KEYS: failed. ARGV: due, then message keys. Failed messages made pending and due now; a
#: key whose message is no longer failed (sent, or gone with its record) leaves the failed
#: queue (:data:`FAILED_LEFT`). Refused, nothing written, if a key it needs is moving
#: (:data:`_HERE`).
RESEND = (
    scripts._NOW
    + _HERE
    + """
local found, stale = {}, {}
for i = 2, #ARGV do
  if not here(ARGV[i]) then return redis.error_reply(moving) end
  if redis.call('HGET', ARGV[i], 'st') == 'failed' then
    if not here(ARGV[1]) then return redis.error_reply(moving) end
    found[#found + 1] = ARGV[i]
  else
    stale[#stale + 1] = ARGV[i]
  end
end
for _, key in ipairs(stale) do redis.call('ZREM', KEYS[1], key) end
for _, key in ipairs(found) do
  redis.call('HSET', key, 'st', 'pending')
  redis.call('ZREM', KEYS[1], key)
  redis.call('ZADD', ARGV[1], now, key)
end
return #found
"""
)

#: KEYS: failed. ARGV: '1' to remove stale keys. ``{count, keys}``: the failed queue's keys
#: whose message is failed (or not this node's to read: a slot moving), oldest first; a key
#: whose message is no longer failed is stale (a send marked while its slot moved left it in
#: the old primary's queue; a message gone with its record) and, with '1', leaves the queue.
FAILED_LEFT = (
    _HERE
    + """
local left = {}
for _, key in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if not here(key) or redis.call('HGET', key, 'st') == 'failed' then
    left[#left + 1] = key
  elseif ARGV[1] == '1' then
    redis.call('ZREM', KEYS[1], key)
  end
end
return {#left, left}
"""
)
