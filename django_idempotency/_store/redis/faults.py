"""What counts as a fault of a Redis store, and what as a reply of its scripts: the failures
redis-py raises, the refusals that pass (a server loading, a failover), a reply that did not
come from our script, which refusals are an outage (one log line) rather than a bug, and a
failure raised as the store's refusal."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import DatabaseError


class RedisFault(DatabaseError):
    """A Redis command that failed for its connection or its server (a ``DatabaseError``, so
    that the core's writes report it as they report the database's)."""


def failures() -> tuple[type[Exception], ...]:
    """What redis-py raises for a server, a connection or a cluster that fails: its
    ``RedisError``, and a cluster's ``RedisClusterException`` (not one: without it, an
    unreachable cluster at a worker's first call would be a ``500``)."""
    import redis
    from redis.exceptions import RedisClusterException

    return (redis.RedisError, RedisClusterException)


@contextmanager
def refused(refusal: Callable[[BaseException], Exception]) -> Iterator[None]:
    """Raise a failure of redis-py's (:func:`failures`) as ``refusal`` makes it: the store's
    :meth:`~.contract.StoreContract.refusal`, the error the core raises."""
    try:
        yield
    except failures() as exc:
        raise refusal(exc) from exc


#: The kinds a claim's reply starts with (:data:`.scripts.CLAIM`).
_CLAIM_KINDS = frozenset((b"new", b"own", b"takeover", b"found"))


def understood(name: str, reply: Any) -> bool:
    """Whether a reply is the script's: a claim's is a list led by its kind, an outbox
    release's the write's number and the ids released (a failed queue's read: a number and
    its keys), a batch a list (:mod:`.outbox`), every other script's a number. Anything else
    did not come from our script on a Redis server: a client connected to itself (a server
    down on a port of the ephemeral range: its own command read back) must not take it for
    a claim, or a write for done."""
    if name == "CLAIM":
        return isinstance(reply, list) and len(reply) > 1 and reply[0] in _CLAIM_KINDS
    if name.endswith("_RELEASING") or name == "FAILED_LEFT":  # a number, then a list
        return isinstance(reply, list) and len(reply) == 2 and type(reply[0]) is int
    if name == "TAKE":  # the outbox's batch
        return isinstance(reply, list)
    return type(reply) is int


def connection_fault(name: str, what: Any) -> Exception:
    """A reply that is not the script's, or a failure redis-py does not name as its own
    (``AttributeError`` from a handshake whose ``HELLO`` was answered with a list,
    ``ValueError`` from a socket closed under a read), as the connection's fault: tried
    again, or answered ``503``, not a ``500``."""
    import redis

    if isinstance(what, Exception):
        fault = redis.ConnectionError(f"{name}: the connection failed: {what!r}")
    else:
        fault = redis.ConnectionError(f"{name}: a reply that is not the script's: {what!r:.80}")
    setattr(fault, _UNEXPECTED, True)  # logged with its traceback
    return fault


#: Marks a fault of :func:`connection_fault`: not redis-py's own, so not an expected outage.
_UNEXPECTED = "_idempotency_unexpected"


def passing(exc: Exception) -> bool:
    """Whether a server's refusal passes: loading its data after a restart, a replica that
    became read-only in a failover, a cluster's slot moving. redis-py's cluster client names
    the last by class, the code cut from the text (``TRYAGAIN`` while a slot's keys are split
    between its two primaries, ``ASK``/``MOVED``), and after 16 of them in a row (its
    ``RedisClusterRequestTTL``: about 0.4 s of a migration) raises ``ClusterError("TTL
    exhausted.")``: tried again within the call's bound, as a failover is."""
    from redis.exceptions import AskError, ClusterDownError, ClusterError, TryAgainError

    if isinstance(exc, (TryAgainError, AskError)):
        return True
    if isinstance(exc, ClusterError) and not isinstance(exc, ClusterDownError):
        return True
    text = str(exc).upper()
    return text.startswith(("LOADING", "READONLY", "TRYAGAIN", "MOVED", "ASK", "MASTERDOWN"))


def transient(exc: BaseException) -> bool:
    """Whether a failure is tried again within the call's bound: the connection's, the
    server's or the cluster's that passes (:func:`passing`)."""
    import redis
    from redis.exceptions import ClusterError

    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return True
    return isinstance(exc, (redis.ResponseError, ClusterError)) and passing(exc)


def expected(exc: BaseException) -> bool:
    """A refusal caused by the connection or the server (refused, cut, timed out, loading,
    read-only): an outage, one log line per refused call. A 3 s outage logged 790 chained
    tracebacks at ``ERROR``; what redis-py does not name as its own keeps its traceback."""
    seen: BaseException | None = exc
    known = False
    while seen is not None:
        if getattr(seen, _UNEXPECTED, False):
            return False
        if transient(seen):
            known = True
        seen = seen.__cause__
    return known


#: What a server answers a client it will not let in (redis-py raises some as
#: ``AuthenticationError``, others as a plain ``ResponseError``).
_REFUSED_CREDENTIALS = ("WRONGPASS", "NOAUTH", "NOPERM")


def misconfigured(exc: BaseException) -> BaseException | None:
    """The failure in ``exc``'s chain that no retry mends: the server refuses the store's
    credentials (a wrong password, a user without the rights). Ridden out as any fault within
    a call's bound (the claim's ``503``), but not an outage: ``None`` when there is none."""
    import redis

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, redis.AuthenticationError):
            return seen
        if isinstance(seen, redis.ResponseError) and str(seen).startswith(_REFUSED_CREDENTIALS):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
