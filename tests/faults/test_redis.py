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
one statement's share of its lock (1.7 s): after a SIGKILL or a restart every key ran twice.

Issue 50: the server paused (``CLIENT PAUSE ALL``; its clock runs on) under a renewed 3 s lock
while duplicates keep coming: 1.5 s, shorter than the lock's least remainder, runs no key
twice; 4 s, longer than its whole, is the window docs/stores.rst states (SPEC 4a): keys may run
twice, and the figures say how many."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.faults import app as apps
from tests.faults.databases import SQLiteFile
from tests.faults.redis_server import RedisServer
from tests.faults.storm import Fault, Store, check, run
from tests.faults.views import RENEWED_LOCK
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
    if name.startswith("pause-"):  # pause-<seconds>s: CLIENT PAUSE ALL, the clock running on
        seconds = float(name.removeprefix("pause-").removesuffix("s"))
        paused: list[float] = []

        def pause() -> None:
            paused.append(time.monotonic())
            server.pause(seconds)

        def until_it_ends() -> None:
            time.sleep(max(0.0, paused[0] + seconds - time.monotonic()))

        # Under the renewed view's 3 s lock (renewed every second: 2 to 3 s left when the
        # pause comes), owners that outlast it and duplicates every 0.5 s. SPEC 4a's bound: a
        # pause shorter than the lock's least remainder (two thirds of it) runs no key twice;
        # a longer one is the window docs/stores.rst states: keys may run twice (reported in
        # the figures, not a failure).
        return Fault(
            name,
            pause,
            until_it_ends,
            lock=RENEWED_LOCK,
            hold=RENEWED_LOCK,
            path="/two-phase-renewed/",
            retry_after=True,
            executions=frozenset({1} if seconds < RENEWED_LOCK * 2 / 3 else {1, 2}),
        )
    raise ValueError(name)


#: The pauses: shorter than the lock's least remainder (2 s), and longer than its most (3 s).
PAUSES = ["pause-1.5s", "pause-4s"]
FAULTS = ["sigkill-aof", "connections-cut", "blackhole", "graceful-restart", *PAUSES]


@pytest.mark.parametrize("fault", FAULTS)
def test_redis_fault(fault: str, redis_server: RedisServer, redis_app: Any) -> None:
    figures = run(
        redis_app, RedisStatuses(redis_server), "redis", _fault(fault, redis_server), "two-phase"
    )
    check(figures, redis_app)
