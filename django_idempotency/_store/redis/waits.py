"""``REDIS_REPLICAS``: the ``WAIT`` (``WAITAOF`` on Redis 7.2 and later) that follows a claim
or a result write on its connection, and the check of its reply (a wait that fell short is a
fault, tried again within the call's bound)."""

from __future__ import annotations

from typing import Any

from django_idempotency._store.redis.codec import as_text
from django_idempotency._store.redis.connections import Connections

#: The scripts a ``REDIS_REPLICAS`` wait follows: the claim and the result (an operator's too).
WAITED = frozenset(("CLAIM", "COMPLETE", "COMPLETE_RELEASING", "STALE_FAIL"))
#: The share of a try's time its wait may take: its reply must come before the socket's
#: timeout, or the fault is the connection's.
_WAIT_SHARE = 0.8


def command(replicas: int, seconds: float, waitaof: bool) -> tuple[Any, ...]:
    """The wait for ``replicas``, its timeout within what the try has left (``seconds``; never
    0: that is forever)."""
    milliseconds = max(10, int(seconds * 1000 * _WAIT_SHARE))
    if waitaof:
        return ("WAITAOF", 0, replicas, milliseconds)
    return ("WAIT", replicas, milliseconds)


def has_waitaof(version: str) -> bool:
    """Whether a server of ``version`` has ``WAITAOF`` (Redis 7.2 and later)."""
    major, minor = (int(part) for part in [*version.split("."), "0"][:2])
    return (major, minor) >= (7, 2)


def server_version(connections: Connections, client: Any, seconds: float) -> str:
    """The server's ``redis_version``: on a connection of the store's own where it has them."""
    if connections.pool is None:
        return str(client.info("server").get("redis_version", "0"))
    (info,) = connections.exchange([("INFO", "server")], seconds, "INFO")
    if isinstance(info, Exception):
        raise info
    for line in as_text(info).splitlines():
        if line.startswith("redis_version:"):
            return line.partition(":")[2].strip()
    return "0"


def found(name: str, reply: Any) -> bool:
    """Whether a claim found a record and wrote nothing: a replay or a duplicate, whose wait
    for replicas is moot (a new primary without its replicas yet still replays)."""
    return name == "CLAIM" and reply[0] == b"found"


def check(name: str, wait: tuple[Any, ...], reply: Any) -> None:
    """Raise :class:`redis.TimeoutError` (a fault) when the wait fell short."""
    import redis

    if isinstance(reply, Exception):
        raise reply
    wanted = wait[2] if wait[0] == "WAITAOF" else wait[1]
    got = int(reply[1]) if isinstance(reply, list) else int(reply)
    if got < wanted:
        # A fault (tried again within the call's bound, then 503), marked as the wait's.
        short = redis.TimeoutError(
            f"{name}: {got} of {wanted} replica(s) acknowledged it within {wait[-1]} ms "
            f"({wait[0]}, REDIS_REPLICAS)"
        )
        short.short_wait = True  # type: ignore[attr-defined]
        raise short
