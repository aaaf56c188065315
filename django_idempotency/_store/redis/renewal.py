"""The renewal of many claims' locks at once, within the renewer's bound: on the store's own
connection in one write, through a pipeline of the client, or on a cluster each node's locks
on a thread of their own."""

from __future__ import annotations

import threading
import time
from typing import Any

from django_idempotency._store.contract import ClaimHandle
from django_idempotency._store.redis.connections import Connections
from django_idempotency._store.redis.faults import connection_fault, understood
from django_idempotency._store.redis.running import LEAST_TRY
from django_idempotency._store.writes import RenewalShortfall

#: The name of the threads that renew a cluster node's locks (:func:`on_cluster`).
THREAD_PREFIX = "django-idempotency-renew-"

#: A lock to renew: its claim's pk, its token, its record's Redis key.
Lock = tuple[ClaimHandle, Any, str]


def pipelined(client: Any, script: Any, locks: list[Lock], lock: int) -> list[Any]:
    """The renewal's scripts in one pipeline of the client (one round trip)."""
    pipe = client.pipeline(transaction=False)
    for _, token, key in locks:
        script(keys=[key], args=[str(token), lock], client=pipe)
    return list(pipe.execute())


def bounded(
    connections: Connections,
    script: Any,
    locks: list[Lock],
    lock: int,
    seconds: float,
    node: tuple[str, Any] | None = None,
) -> list[Any]:
    """The renewal's scripts on a connection of the store's own (a cluster ``node``'s),
    within ``seconds``; a script the server lacks is loaded there (not through a cluster's
    client, which loads it on every primary, a frozen one too). A frozen server held a
    renewal through the client for its socket timeout, or for good."""
    import redis

    deadline = time.monotonic() + seconds
    commands = [("EVALSHA", script.sha, 1, key, str(token), lock) for _, token, key in locks]
    replies = connections.exchange(commands, seconds, "RENEW", node)
    if any(isinstance(reply, redis.exceptions.NoScriptError) for reply in replies):
        left = max(deadline - time.monotonic(), LEAST_TRY)
        connections.exchange([("SCRIPT", "LOAD", script.script)], left, "RENEW", node)
        left = max(deadline - time.monotonic(), LEAST_TRY)
        replies = connections.exchange(commands, left, "RENEW", node)
    for index, reply in enumerate(replies):
        if node is not None and str(reply).startswith(("MOVED", "ASK")):
            # A slot moved: through the cluster's client, which follows it.
            _, token, key = locks[index]
            reply = replies[index] = script(keys=[key], args=[str(token), lock])
        if isinstance(reply, Exception):
            raise reply
        if not understood("RENEW", reply):
            raise connection_fault("RENEW", reply)
    return replies


class _Nodes:
    """What each node's thread answered, and the nodes that failed, under one guard."""

    def __init__(
        self, client: Any, connections: Connections, script: Any, lock: int, seconds: float
    ) -> None:
        self.client, self.connections, self.script = client, connections, script
        self.lock, self.seconds = lock, seconds
        self.answers: dict[int, bool] = {}
        self.errors: list[str] = []
        self.guard = threading.Lock()

    def renew(self, name: str, locks: list[Lock]) -> None:
        """One node's locks, on a connection of the store's own to that node, made from the
        node's pool's settings, its socket timeout the renewal's bound, not through the
        cluster's client: after one node's timeout, the client's next command, on any node,
        refreshed the topology from the frozen node first and waited its socket timeout
        there, so the healthy nodes' renewals missed their bound too."""
        try:
            server = self.client.get_redis_connection(self.client.get_node(node_name=name))
            place = (name, server.connection_pool)
            replies = bounded(self.connections, self.script, locks, self.lock, self.seconds, place)
            with self.guard:
                for (pk, _, _), reply in zip(locks, replies, strict=True):
                    self.answers[pk] = bool(reply)
        except Exception as exc:  # this node's fault: the other nodes' locks go on
            with self.guard:
                self.errors.append(f"{name}: {type(exc).__name__}: {exc}")


def on_cluster(
    client: Any,
    connections: Connections,
    script: Any,
    locks: list[Lock],
    lock: int,
    seconds: float,
    shown: str,
) -> set[tuple[ClaimHandle, Any]]:
    """A cluster's renewal: each node's locks on a thread of their own, one call per lock
    (routed to its record's slot), all within ``seconds``: with one call for every lock in
    turn, the first lock on a frozen or dead primary would raise (or wait out the client's
    socket timeout) before any lock on the healthy primaries was renewed, and their owners
    would be taken over. A node that fails or does not answer in time
    costs its own locks' renewal alone: :class:`RenewalShortfall` says which locks were
    settled, and the renewer tries the others again; a thread still waiting on a frozen
    node is left to its socket's timeout (its late answer is not counted)."""
    by_node: dict[str, list[Lock]] = {}
    for each in locks:
        by_node.setdefault(client.get_node_from_key(each[2]).name, []).append(each)
    nodes = _Nodes(client, connections, script, lock, seconds)
    deadline = time.monotonic() + seconds
    threads = [
        threading.Thread(
            target=nodes.renew, args=(name, mine), name=f"{THREAD_PREFIX}{name}", daemon=True
        )
        for name, mine in by_node.items()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(deadline - time.monotonic(), 0))
    with nodes.guard:  # what came in time: a late answer is not counted
        answered = dict(nodes.answers)
        faults = list(nodes.errors)
    held = {(pk, token) for pk, token, _ in locks if answered.get(pk)}
    if len(answered) < len(locks):
        alive = zip(by_node, threads, strict=True)
        slow = [name for name, thread in alive if thread.is_alive()]
        why = faults + [f"{name}: no answer within {seconds:.2g}s" for name in slow]
        raise RenewalShortfall(
            f"Redis store {shown!r}: {len(locks) - len(answered)} of "
            f"{len(locks)} lock(s) not renewed ({'; '.join(why)})",
            held,
            set(answered),
        )
    return held
