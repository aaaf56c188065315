"""The fault scenario on the Redis store (issue 44): gunicorn's workers serve a protected view
whose records live on a ``redis-server`` of the suite's own (AOF, ``appendfsync always``),
and while twenty keys wait in their views and their duplicates come, the server is SIGKILLed
and started again from its AOF, has every client connection cut (``CLIENT KILL``, every 0.1 s
for 3 s), is blackholed (SIGSTOP: connections are accepted, nothing answers, then SIGCONT), or
is restarted gracefully (SIGTERM, then started again). Every outage is shorter than the view's
10 s lock: each key's effect runs once, every answer is the result, its replay, ``409`` or
``503`` with ``Retry-After``, never a ``500`` (:mod:`tests.faults.storm` says what else it
asserts). The app's own tables (sessions, users) are on a SQLite file; each effect is a line in
a file. The figures are printed. Before issue 44's fix, an owner gave its result write up after
one statement's share of its lock (1.7 s): after a SIGKILL or a restart every key ran twice."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.faults import app as apps
from tests.faults.databases import SQLiteFile
from tests.faults.redis_server import RedisServer
from tests.faults.storm import Fault, Store, check, run
from tests.test_servers_postgresql import serving

pytestmark = pytest.mark.faults

#: How long the server stays down or silent: well under the view's lock (10 s).
OUTAGE = 3.0
#: How often the connections are cut meanwhile (seconds).
CUT_EVERY = 0.1


class RedisStatuses(Store):
    """Each key's record status, read from the server (the storm's ``processing`` check)."""

    def __init__(self, server: RedisServer) -> None:
        super().__init__(lambda sql, params: [])
        self.server = server

    def statuses(self, keys: list[str]) -> dict[str, str]:
        import redis

        from django_idempotency._base.keys import hash_key

        hashes = {hash_key(key): key for key in keys}
        client = redis.Redis(port=self.server.port, socket_timeout=10)
        try:
            found: dict[str, str] = {}
            for name in client.scan_iter(match="idempotency:r:*", count=1000):
                key_hash = name.decode().rsplit(":", 1)[1].rstrip("}")
                if key_hash in hashes and (status := client.hget(name, "st")) is not None:
                    found[hashes[key_hash]] = status.decode()
            return found
        finally:
            client.close()


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    try:
        server.start()
        yield server
    except BaseException:
        print(f"\n----- redis-server log -----\n{server.log_tail()}")
        raise
    finally:
        server.destroy()


@pytest.fixture(scope="module")
def redis_app(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[Any]:
    database = SQLiteFile()
    try:
        apps.migrate(database.url())
        app = apps.app(
            database.url(),
            DJANGO_SETTINGS_MODULE="tests.faults.redis_settings",
            IDEMPOTENCY_FAULT_REDIS_URL=redis_server.url(),
        )
        yield from serving(request, app)
    finally:
        database.destroy()


def _fault(name: str, server: RedisServer) -> Fault:
    def after(action: Any) -> Any:
        def recover() -> None:
            time.sleep(OUTAGE)
            action()

        return recover

    if name == "sigkill-aof":  # the claims were synced to the AOF before they were answered
        return Fault(name, server.kill, after(server.start), retry_after=True)
    if name == "connections-cut":  # every client connection, again and again: a flapping link

        def keep_cutting() -> None:
            cut, until = 0, time.monotonic() + OUTAGE
            while time.monotonic() < until:
                cut += server.cut()
                time.sleep(CUT_EVERY)
            print(f"cut {cut} connections", end=" ")

        return Fault(name, server.cut, keep_cutting, retry_after=True)
    if name == "blackhole":
        return Fault(name, server.freeze, after(server.thaw), retry_after=True)
    if name == "graceful-restart":
        return Fault(name, server.shutdown, after(server.start), retry_after=True)
    raise ValueError(name)


FAULTS = ["sigkill-aof", "connections-cut", "blackhole", "graceful-restart"]


@pytest.mark.parametrize("fault", FAULTS)
def test_redis_fault(fault: str, redis_server: RedisServer, redis_app: Any) -> None:
    figures = run(
        redis_app, RedisStatuses(redis_server), "redis", _fault(fault, redis_server), "two-phase"
    )
    check(figures, redis_app)
