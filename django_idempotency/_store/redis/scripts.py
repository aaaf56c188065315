"""The Redis store's Lua scripts: each decision and each fenced write is one script, run
atomically by the server, its time read from the server's own clock (``TIME``) inside it.

One record is one hash (``KEYS[1]``), so a script touches one key, and one cluster slot. Its
fields: ``st`` status, ``fp`` fingerprint, ``m`` method, ``p`` path, ``sc`` scope (for an
operator: the key's name has only its hash), ``tok`` lock token, ``att`` attempt, ``rp``/``rd``
recovery point and its data (JSON), ``oid`` its operation's id (:mod:`.operations`: random, set
when the record begins), ``ca``/``up``/``ua``/``ea`` created, updated, unlock and
expiry times (microseconds since the epoch, the server's clock), ``rs``/``rh``/``rb`` the
response's status, headers (JSON, :mod:`.._store.sealing`'s shapes) and body. The record expires
by Redis's own TTL (``PEXPIREAT ea``): an expired record is absent, and a new claim starts
afresh.
"""

from __future__ import annotations

#: The fields a claim that finds another call's record returns, in this order.
FIELDS = (
    "st", "fp", "tok", "ua", "att", "rp", "rd", "ea", "rs", "rh", "rb", "m", "p", "ca", "up", "oid",
)  # fmt: skip

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
"""

#: ``hold(key, unlock)``: the record lives at least until its lock's end (``unlock``), its
#: expiry and Redis's TTL with it: a record whose owner keeps renewing is never expired, and
#: so never deleted under it, however long it runs past its TTL.
_HOLD = """
local function hold(key, unlock)
  local expires = tonumber(redis.call('HGET', key, 'ea'))
  if expires < unlock then
    redis.call('HSET', key, 'ea', unlock)
    redis.call('PEXPIREAT', key, math.ceil(unlock / 1000))
  end
end
"""

#: :data:`.._base.rules.TAKEOVER` as the claim reads it of the record's fields ``r`` (status,
#: fingerprint, token, unlock: :data:`CLAIM`'s ``HMGET``) at the server's ``now``, for the
#: claimant's fingerprint ``ARGV[2]``: a stale record of the same request. An expired record is
#: absent (Redis's TTL), and claimed afresh. ``tests/test_rules.py`` checks the two agree.
TAKES_OVER = "r[1] == 'processing' and r[2] == ARGV[2] and r[4] and tonumber(r[4]) <= now"

#: ARGV: token, fingerprint, method, path, lock (µs), ttl (µs), scope, a new operation id.
#: Returns ``{"new", now, oid}``, ``{"own", now, attempt, rp, rd, ca, oid}`` (this token's
#: claim, applied with its reply lost), ``{"takeover", now, attempt, rp, rd, ca, oid}``, or
#: ``{"found", now, fields...}``. A record written before records had an operation id gets
#: the new one when taken over.
#:
#: A takeover needs the lock to have lapsed by the server's clock, now, inside the script, and
#: the same fingerprint: a live owner's lock is never taken (the duplicate gets its record,
#: a ``409``), whatever the caller's clock says.
CLAIM = (
    _NOW
    + _HOLD
    + """
local key = KEYS[1]
local r = redis.call('HMGET', key, 'st', 'fp', 'tok', 'ua', 'att', 'rp', 'rd', 'ea', 'rs',
                     'rh', 'rb', 'm', 'p', 'ca', 'up', 'oid')
if not r[1] then
  local expires = now + tonumber(ARGV[6])
  redis.call('HSET', key, 'st', 'processing', 'fp', ARGV[2], 'm', ARGV[3], 'p', ARGV[4],
             'tok', ARGV[1], 'att', 1, 'rp', '', 'ca', now, 'ua', now + tonumber(ARGV[5]),
             'ea', expires, 'up', now, 'sc', ARGV[7], 'oid', ARGV[8])
  redis.call('PEXPIREAT', key, math.ceil(expires / 1000))
  return {'new', now, ARGV[8]}
end
if r[3] == ARGV[1] then
  if r[1] == 'processing' then
    return {'own', now, r[5], r[6], r[7], r[14], r[16]}
  end
end
if """
    + TAKES_OVER
    + """ then
  local attempt = tonumber(r[5]) + 1
  redis.call('HSET', key, 'tok', ARGV[1], 'att', attempt, 'ua', now + tonumber(ARGV[5]),
             'up', now)
  hold(key, now + tonumber(ARGV[5]))
  if not r[16] then
    r[16] = ARGV[8]
    redis.call('HSET', key, 'oid', r[16])
  end
  return {'takeover', now, attempt, r[6], r[7], r[14], r[16]}
end
-- (a field absent is false in r: no hole for unpack)
return {'found', now, unpack(r)}
"""
)

_FENCE = """
local key = KEYS[1]
local r = redis.call('HMGET', key, 'st', 'tok')
if r[2] ~= ARGV[1] then return 0 end
"""

#: ARGV: token, status, response status ('' none), headers JSON, body, '1' if a body, own
#: ttl (µs, '' none), key hash, the scope's TTL (µs). 1: stored; 2: this token's result was
#: stored already (a reply lost). With ``KEYS[2]`` (one server: not on a cluster, where it is
#: another slot's), the record joins its scope's index (erasure), which forgets those past
#: their expiry, and lasts as long as its last record.
_COMPLETE_DONE = """
if r[1] ~= 'processing' then return 2 end"""
#: What a result's write does once fenced (:data:`COMPLETE`, :data:`STALE_FAIL`): ARGV[2..7].
_COMPLETE_WRITE = """
redis.call('HSET', key, 'st', ARGV[2], 'rs', ARGV[3], 'rh', ARGV[4], 'ua', '', 'up', now)
if ARGV[6] == '1' then redis.call('HSET', key, 'rb', ARGV[5]) end
local expires = tonumber(redis.call('HGET', key, 'ea'))
if ARGV[7] ~= '' then
  expires = now + tonumber(ARGV[7])
  redis.call('HSET', key, 'ea', expires)
  redis.call('PEXPIREAT', key, math.ceil(expires / 1000))
end
"""
_COMPLETE_INDEX = """if KEYS[2] then
  redis.call('ZADD', KEYS[2], expires, ARGV[8])
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', KEYS[2], math.ceil(tonumber(last[2]) / 1000) + 1000)
end
"""
COMPLETE = _NOW + _FENCE + _COMPLETE_DONE + _COMPLETE_WRITE + _COMPLETE_INDEX + "return 1\n"
#: :data:`COMPLETE` without the scope's index, as a cluster's outbox releases with it
#: (:mod:`.outbox_scripts`): the index is another slot's.
COMPLETE_ON_SLOT = _NOW + _FENCE + _COMPLETE_DONE + _COMPLETE_WRITE + "return 1\n"

#: An operator's fence: the record is still ``processing`` under the token the operator read
#: (``ARGV[1]``) and :data:`.._base.rules.STALE` by the server's clock, now.
_STALE_FENCE = """
local key = KEYS[1]
local r = redis.call('HMGET', key, 'st', 'tok', 'ua')
if r[2] ~= ARGV[1] or r[1] ~= 'processing' or not r[3] or r[3] == ''
   or tonumber(r[3]) > now then
  return 0
end
"""

#: An operator's release of a stale record (the admin's action). ARGV: the token read. 1:
#: deleted (a retry claims afresh; the owner, alive after all, finds nothing to write).
STALE_RELEASE = (
    _NOW
    + _STALE_FENCE
    + """
redis.call('DEL', key)
return 1
"""
)

#: An operator's failure of a stale record: :data:`COMPLETE`'s ARGV, and ``ARGV[9]`` the
#: operator's own token, which replaces the owner's: the owner's result write, if it comes
#: after all, is refused (0), never taken for its own stored before (2). 1: stored, or
#: stored already by this call (a reply lost).
STALE_FAIL = (
    _NOW
    + """
if redis.call('HGET', KEYS[1], 'tok') == ARGV[9] then return 1 end"""
    + _STALE_FENCE
    + """
redis.call('HSET', key, 'tok', ARGV[9])"""
    + _COMPLETE_WRITE
    + _COMPLETE_INDEX
    + "return 1\n"
)

#: ARGV: token. Deletes the record (a retry claims afresh).
RELEASE = (
    _FENCE
    + """
if r[1] ~= 'processing' then return 0 end
redis.call('DEL', key)
return 1
"""
)

#: ARGV: token. Keeps the record at its recovery point, its lock lapsed now.
UNLOCK = (
    _NOW
    + _FENCE
    + """
if r[1] ~= 'processing' then return 0 end
redis.call('HSET', key, 'ua', now, 'up', now)
return 1
"""
)

#: ARGV: token, name, data (JSON), lock (µs). Records progress and renews the lock.
RECOVERY_POINT = (
    _NOW
    + _HOLD
    + _FENCE
    + """
if r[1] ~= 'processing' then return 0 end
redis.call('HSET', key, 'rp', ARGV[2], 'rd', ARGV[3], 'ua', now + tonumber(ARGV[4]),
           'up', now)
hold(key, now + tonumber(ARGV[4]))
return 1
"""
)

#: ARGV: token, lock (µs). Pushes the lock forward while the owner lives.
RENEW = (
    _NOW
    + _HOLD
    + _FENCE
    + """
if r[1] ~= 'processing' then return 0 end
redis.call('HSET', key, 'ua', now + tonumber(ARGV[2]))
hold(key, now + tonumber(ARGV[2]))
return 1
"""
)

#: ARGV: none. Erasure: deletes the record unless it is still processing (1 deleted,
#: 0 absent, -1 in progress).
ERASE = """
local st = redis.call('HGET', KEYS[1], 'st')
if not st then return 0 end
if st == 'processing' then return -1 end
redis.call('DEL', KEYS[1])
return 1
"""
