"""The store's server as its calls reach it: the one client of the process (by topology,
:mod:`.clients`), the prefix of its keys, the store's own connections (:mod:`.connections`),
the scripts registered with it, and one script's run within its bound (:mod:`.running`),
followed by ``REDIS_REPLICAS``' wait (:mod:`.waits`)."""

from __future__ import annotations

import threading
from typing import Any

from django_idempotency._store.redis import (
    clients,
    operations,
    outbox_scripts,
    running,
    scripts,
    waits,
)
from django_idempotency._store.redis.connections import Connections
from django_idempotency._store.redis.faults import RedisFault
from django_idempotency._store.redis.keyspace import key_prefix


class Server:
    """The Redis server (or Sentinel's master, or cluster) of the store ``alias``."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self._client: Any = None
        self._prefix: str | None = None
        #: A cluster's client: a script touches one slot, so a record's index is written
        #: apart from it. ``None`` until the client is made.
        self.cluster: bool | None = None
        self._scripts: dict[str, Any] = {}
        #: The store's own connections (:mod:`.connections`), from the client's plain pool.
        self.wire = Connections()
        #: Whether the server has ``WAITAOF`` (Redis 7.2+), read at the first wait.
        self._waitaof: bool | None = None
        self._lock = threading.Lock()

    @property
    def prefix(self) -> str:
        """The prefix of the store's keys (:func:`.keyspace.key_prefix`), read once."""
        if self._prefix is None:
            self._prefix = key_prefix(self.alias)
        return self._prefix

    @property
    def client(self) -> Any:
        if self._client is None:
            with self._lock:  # one client: a second one's end would close the first's sockets
                self._make_client()
        return self._client

    def _make_client(self) -> None:
        """The store's one client, made by the first call of the process. Two made by two
        first calls at once would break the calls in flight: the one dropped closes its pool
        when collected (redis-py's ``Redis.__del__``: a client made from a URL owns its pool),
        with the connections our idle list and the other threads' calls had from it."""
        if self._client is None:
            client = clients.make_client(self.alias)
            self.cluster = clients.is_cluster(client)
            self.wire.pool = clients.own_pool(client)
            self._client = client

    def script(self, name: str) -> Any:
        """The script ``name`` (of :mod:`.scripts`, :mod:`.operations` or
        :mod:`.outbox_scripts`), registered with the client at its first use."""
        script = self._scripts.get(name)
        if script is None:
            text = (
                getattr(scripts, name, None)
                or getattr(operations, name, None)
                or getattr(outbox_scripts, name)
            )
            script = self._scripts[name] = self.client.register_script(text)
        return script

    def run(
        self,
        name: str,
        keys: list[str],
        args: list[Any],
        bound: float | None,
        tries: int | None = None,
    ) -> Any:
        """Run a script within ``bound`` seconds (or ``tries``), again after a fault
        (:func:`.running.run`); then :class:`.faults.RedisFault`."""
        return running.run(self._eval, name, keys, args, bound, tries, self.alias)

    def _eval(self, name: str, keys: list[str], args: list[Any], seconds: float) -> Any:
        """One try of a script: on a connection of the store's own (:func:`.running.by_own`),
        or through redis-py's ``Script`` for a cluster, Sentinel's master, or a client
        without a plain pool. ``seconds``: what the try may take."""
        script = self.script(name)
        wait = self._wait_command(name, seconds)
        if self.wire.pool is None:
            return running.by_client(self.client, script, name, keys, args, wait)
        return running.by_own(self.wire, script, name, keys, args, seconds, wait)

    def _wait_command(self, name: str, seconds: float) -> tuple[Any, ...] | None:
        """The wait that follows a claim or a result write on its connection when
        ``REDIS_REPLICAS`` asks for replicas (:mod:`.waits`)."""
        if name not in waits.WAITED:
            return None
        from django_idempotency._conf.settings import conf

        replicas = conf.REDIS_REPLICAS
        if not replicas:
            return None
        if self.cluster:
            raise RedisFault(
                f"Redis store {self.alias!r}: REDIS_REPLICAS is not supported on a Redis "
                "Cluster (a WAIT must follow the write on its node's connection)."
            )
        if self._waitaof is None:
            version = waits.server_version(self.wire, self.client, seconds)
            self._waitaof = waits.has_waitaof(version)
        return waits.command(replicas, seconds, self._waitaof)
