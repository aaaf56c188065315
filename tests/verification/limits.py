"""The views' lock and TTLs (seconds), and the users' passwords: read by the views, the
generator and the checker, so that the three agree. Nothing here imports Django."""

from __future__ import annotations

#: Short, so that faults longer than it are cheap; renewed every third of it.
LOCK = 3
#: Longer than any run: one record life per key, but on ``/short-ttl/``.
TTL = 3600
SHORT_TTL = 6
#: Entry points and their TTLs.
TTLS = {
    "mixin": TTL, "function": TTL, "function-policy": TTL, "plain": TTL, "async": TTL,
    "ninja": TTL, "call": TTL, "atomic": TTL, "outbox": TTL, "accepted": TTL,
    "short-ttl": SHORT_TTL, "steps": TTL, "export": TTL,
}  # fmt: skip
#: Once the nemesis has healed, every key has a final answer within ``LOCK`` and this.
SETTLE = 15.0
#: A trivial request answered this late (seconds), or not at all, is the server overloaded.
SLOW = 5.0
#: Once every key is settled, every released message is delivered and consumed within this.
DRAIN = 30.0
#: Seconds the consumer's task works after its effect, before its result is written: a worker
#: killed then must not run the effect again for the redelivered message.
CONSUMER_WORK = 0.3


def password(user: str) -> str:
    """A verification user's password (Basic authentication): a test project's, as its MD5
    hasher (settings.py) is."""
    return f"{user}-verify"
