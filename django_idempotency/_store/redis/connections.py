"""The store's own connections: made from its client's plain pool (or a cluster node's), kept
on idle lists of its own, each exchange's commands packed and sent in one write and read back
within the call's time.

The connections are made from the pool's own settings (its host, its credentials, its TLS) but
are the store's, one per concurrent call (the pool's checkout and release, its check
for unread data and its observability hooks cost a replay 11 µs, a tenth of our Python around
the Redis call), so the cache's own connections keep the timeouts their settings give them."""

from __future__ import annotations

import importlib
import os
from typing import Any

from django_idempotency._store.redis.faults import connection_fault

#: hiredis's packer of a command, in C (the redis extra installs hiredis): redis-py 8.2's own,
#: with hiredis, encodes each argument in Python first (a claim's seven: 0.14M instructions).
_pack_command: Any
try:
    _pack_command = importlib.import_module("hiredis").pack_command
except ImportError:  # pragma: no cover - redis-py's parser and packer in Python
    _pack_command = None


def packed(connection: Any, parts: tuple[Any, ...]) -> Any:
    """A command as the connection sends it: hiredis packs our parts (str, int, bytes) as
    redis-py's own packer does, in C (tests/test_redis_store.py compares the two)."""
    if _pack_command is None:
        return connection.pack_command(*parts)
    return [_pack_command(parts)]


def limit(connection: Any, seconds: float) -> None:
    """Bound a connection's next reads and writes (and a reconnection) by ``seconds``:
    redis-py reads with its socket's own timeout."""
    connection.socket_timeout = seconds
    connection.socket_connect_timeout = seconds
    sock = getattr(connection, "_sock", None)
    if sock is not None:
        sock.settimeout(seconds)


class Connections:
    """The store's own connections (see the module's docstring). Each exchange sets its
    connection's socket timeout, and a connection made for it connects and shakes hands within
    it too (a cache alias's client has no socket timeout by default, and one try of a
    claim waited for a frozen server for good; a URL's client waited its 5 s timeout past the
    claim's bound)."""

    def __init__(self) -> None:
        #: The client's plain connection pool, ``None`` where its connections are not to be
        #: kept (a cluster, Sentinel's, a blocking or caching pool: :func:`.clients.own_pool`).
        self.pool: Any = None
        self.idle: list[Any] = []
        #: A cluster's renewal connections, each node's own (:mod:`.renewal`).
        self.nodes: dict[str, list[Any]] = {}
        self._pid = os.getpid()

    def exchange(
        self,
        commands: list[tuple[Any, ...]],
        seconds: float,
        name: str,
        node: tuple[str, Any] | None = None,
    ) -> list[Any]:
        """Send ``commands`` in one write on a connection of the store's own and read their
        replies (a server's refusal is its command's reply, an exception in the list), all
        within ``seconds``. A connection that met anything but a server's replies is closed,
        with every idle one (a restart or a cut killed them too): the next makes a new one.
        ``node``: a cluster node's name and pool, whose connections are kept apart."""
        import redis

        if self._pid != os.getpid():  # a forked child: its parent's sockets are not its own
            self.idle = []
            self.nodes = {}
            self._pid = os.getpid()
        if node is None:
            pool, idle = self.pool, self.idle
        else:
            pool, idle = node[1], self.nodes.setdefault(node[0], [])
        try:
            connection = idle.pop()
        except IndexError:
            connection = None
        try:
            if connection is None:
                timeouts = {"socket_timeout": seconds, "socket_connect_timeout": seconds}
                connection = pool.connection_class(**{**pool.connection_kwargs, **timeouts})
                connection.connect()
            else:
                limit(connection, seconds)
            parts = [part for command in commands for part in packed(connection, command)]
            connection.send_packed_command(parts)
            replies: list[Any] = []
            for _ in commands:
                try:
                    replies.append(connection.read_response())
                except redis.ResponseError as exc:  # the server's reply, read whole
                    replies.append(exc)
        except BaseException as exc:
            self.drop(connection, idle)
            if isinstance(exc, Exception) and not isinstance(exc, redis.RedisError):
                raise connection_fault(name, exc) from exc
            raise
        idle.append(connection)
        return replies

    def drop(self, connection: Any, idle: list[Any] | None = None) -> None:
        """A connection that failed, and every idle one (of its server), closed."""
        idle, dropped = self.idle if idle is None else idle, [connection]
        while idle:
            try:
                dropped.append(idle.pop())
            except IndexError:  # another thread took the last
                break
        for each in dropped:
            if each is not None:
                each.disconnect()
