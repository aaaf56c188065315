"""One script's run: its tries within the call's bound (a script met by a fault is tried again,
every script being safe to run twice), each try on a connection of the store's own or through
redis-py's ``Script``, its reply checked as the script's and its replicas' wait as enough."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from django_idempotency._conf.values import display_name
from django_idempotency._store import deadlines
from django_idempotency._store.redis import waits
from django_idempotency._store.redis.connections import Connections
from django_idempotency._store.redis.faults import (
    RedisFault,
    connection_fault,
    failures,
    misconfigured,
    passing,
    transient,
    understood,
)

logger = logging.getLogger("django_idempotency")

#: How often a script that met a fault is tried again within its bound, and the first pause.
_FIRST_RETRY = 0.02
_MAX_RETRY = 0.25
#: The least time one try of a call is given (seconds): its bound's last moments.
LEAST_TRY = 0.05

#: One try of a script: its name, keys, arguments, and the seconds the try may take.
Evaluate = Callable[[str, list[str], list[Any], float], Any]


def run(
    evaluate: Evaluate,
    name: str,
    keys: list[str],
    args: list[Any],
    bound: float | None,
    tries: int | None,
    alias: str,
) -> Any:
    """Run a script, again after a fault (a lost connection, a timeout, a server loading
    or refusing writes, a cluster's slot migrating: :func:`.faults.passing`) until ``bound``
    seconds have passed (or ``tries`` were made); then :class:`RedisFault`. Every script is
    safe to run twice: the second finds the first's effect by the token. An owner's write
    rides a fault out while its lock holds; a claim tries twice (a new connection after a
    dead one), then answers ``503``."""
    import redis

    deadline = time.monotonic() + (deadlines.LEAST if bound is None else bound)
    delay = _FIRST_RETRY
    while True:
        if tries is not None:
            tries -= 1
        try:
            return evaluate(name, keys, args, max(deadline - time.monotonic(), LEAST_TRY))
        except failures() as exc:
            if isinstance(exc, redis.ResponseError) and not passing(exc):
                raise RedisFault(f"Redis refused {name}: {exc}") from exc
            if not transient(exc):
                raise RedisFault(f"Redis store {display_name(alias)!r}: {exc}") from exc
            # A claim's wait for replicas that fell short took its time already: not
            # again (a result write's is, within its lock: a failover may be under way).
            short = tries is not None and getattr(exc, "short_wait", False)
            if short or tries == 0 or time.monotonic() + delay >= deadline:
                raise RedisFault(f"Redis store {display_name(alias)!r}: {exc}") from exc
            logger.log(
                # A claim's second try: its refusal, if any, is the call's one line; refused
                # credentials are ridden out (a rotation) but said by the caller, once.
                logging.DEBUG if tries is not None or misconfigured(exc) else logging.WARNING,
                "Idempotency store %r failed (%s); trying again in %.2gs.",
                display_name(alias),
                exc,
                delay,
            )
        time.sleep(delay)
        delay = min(delay * 2, _MAX_RETRY)


def by_own(
    connections: Connections,
    script: Any,
    name: str,
    keys: list[str],
    args: list[Any],
    seconds: float,
    wait: tuple[Any, ...] | None,
) -> Any:
    """``EVALSHA`` on a connection of the store's own, sent and read below redis-py's
    command machinery (its retry wrapper, its timing): every protected call's claim and
    result, as the database store's statements go below the drivers' cursors. A
    server that lost its scripts (a restart) gets it loaded; the replicas' wait follows on
    the same connection. ``seconds``: what the try may take, its connect and handshake
    included."""
    import redis

    commands: list[tuple[Any, ...]] = [("EVALSHA", script.sha, len(keys), *keys, *args)]
    if wait is not None:
        commands.append(wait)
    replies = connections.exchange(commands, seconds, name)
    if isinstance(replies[0], redis.exceptions.NoScriptError):
        (loaded,) = connections.exchange([("SCRIPT", "LOAD", script.script)], seconds, name)
        if isinstance(loaded, Exception):
            raise loaded
        replies = connections.exchange(commands, seconds, name)
    reply = replies[0]
    if isinstance(reply, Exception):
        raise reply
    if not understood(name, reply):
        raise connection_fault(name, reply)
    if wait is not None and not waits.found(name, reply):
        waits.check(name, wait, replies[1])
    return reply


def by_client(
    client: Any,
    script: Any,
    name: str,
    keys: list[str],
    args: list[Any],
    wait: tuple[Any, ...] | None = None,
) -> Any:
    """The script through redis-py's ``Script`` (it loads one the server lacks), and the
    replicas' wait after it in one pipeline: on the same connection, as ``WAIT`` needs. A
    cluster (:func:`on_key_node`), Sentinel's master, or a client without a plain pool runs its
    scripts so."""
    import redis

    from django_idempotency._store.redis.clients import is_cluster

    try:
        if wait is None and is_cluster(client):
            reply = on_key_node(client, script, keys, args)
        elif wait is None:
            reply = script(keys=keys, args=args)
        else:
            pipe = client.pipeline(transaction=False)
            script(keys=keys, args=args, client=pipe)
            pipe.execute_command(*wait)
            reply, acknowledged = pipe.execute()
    except redis.RedisError:
        raise
    except Exception as exc:
        raise connection_fault(name, exc) from exc
    if not understood(name, reply):
        raise connection_fault(name, reply)
    if wait is not None and not waits.found(name, reply):
        waits.check(name, wait, acknowledged)
    return reply


def on_key_node(client: Any, script: Any, keys: list[str], args: list[Any]) -> Any:
    """A cluster's script: ``EVALSHA`` on its key's node, and where that node lost its scripts
    (a restart, ``SCRIPT FLUSH``) ``EVAL`` there, which loads it there. redis-py's ``Script``
    loads a missing script on every primary: one frozen primary held the healthy node's
    script (and its write) back for its socket timeout."""
    import redis

    try:
        return client.evalsha(script.sha, len(keys), *keys, *args)
    except redis.exceptions.NoScriptError:
        return client.eval(script.script, len(keys), *keys, *args)
