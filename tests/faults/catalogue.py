"""The faults, each built for a server of :mod:`tests.faults.databases` or a proxy."""

from __future__ import annotations

import threading
import time

from tests.faults.databases import MariaDBServer, PostgresCluster, SQLiteFile
from tests.faults.proxy import COMMIT, RESULT_WRITE, FaultProxy
from tests.faults.storm import FRESH_DURING, KEYS, LONG_LOCK, SHORT_LOCK, Fault

OUTAGE = 10.0  # "stop for 10 s", under the views' 30 s lock
READ_ONLY_SPELL = 3.0
SQLITE_HOLD = 8.0  # past SQLite's 5 s busy wait, under the views' 30 s lock
PROXY_WAIT = 10.0  # for the owners' result writes to reach the armed proxy

#: The window that remains: a two-phase owner whose outage outlasts its lock (10 s).
LONG_OUTAGE = 15.0

SERVER_FAULTS = ["restart", "stop-10s", "terminate", "read-only"]
PROXY_FAULTS = ["drop-request", "drop-reply"]


def server_fault(name: str, server: PostgresCluster | MariaDBServer) -> Fault:
    if name == "restart":
        return Fault(name, server.restart)
    if name == "stop-10s":

        def come_back() -> None:
            time.sleep(OUTAGE)
            server.start()

        return Fault(name, server.stop, come_back, lock=LONG_LOCK)
    if name == "terminate":
        return Fault(name, lambda: print(f"terminated {server.terminate_backends()}", end=" "))
    if name == "read-only":
        # MariaDB's SET GLOBAL read_only waits for open write transactions (the atomic
        # views'): it is set from a thread, and the gate opens meanwhile.
        setting = threading.Thread(target=server.read_only, args=(True,))

        def turn_on() -> None:
            setting.start()
            setting.join(timeout=2)

        def turn_off() -> None:
            setting.join(timeout=60)
            time.sleep(READ_ONLY_SPELL)
            server.read_only(False)

        return Fault(name, turn_on, turn_off, replays=True)
    if name == "stop-15s-lock-10s":

        def come_back_late() -> None:
            time.sleep(LONG_OUTAGE)
            server.start()

        # The owner gives its result up when its lock could lapse; a retry then runs the view
        # again. Once or twice, then: what is asserted is the rest (no 500, all settled).
        return Fault(name, server.stop, come_back_late, executions=frozenset({1, 2}))
    raise ValueError(name)


def proxy_fault(name: str, proxy: FaultProxy, mode: str) -> Fault:
    """Cut the owners' connections as their result write passes (two-phase), or as their
    transaction's commit passes (atomic, after its result write)."""
    cut = {"drop-request": "request", "drop-reply": "reply"}[name]
    pattern, after = (RESULT_WRITE, None) if mode == "two-phase" else (COMMIT, RESULT_WRITE)
    # The new keys sent during the fault write results too: they may take some of the cuts.
    armed: list[object] = []

    def arm() -> None:
        armed.append(proxy.arm(cut, pattern, after=after, count=KEYS + FRESH_DURING))

    def disarm() -> None:
        trigger = armed[0]
        trigger.done.wait(PROXY_WAIT)  # type: ignore[attr-defined]
        print(f"cuts {proxy.disarm()}", end=" ")

    return Fault(name, arm, disarm)


def sqlite_fault(database: SQLiteFile, mode: str) -> Fault:
    """Two-phase: the owners' result writes meet the lock. Atomic: an atomic view holds the
    one write lock until it commits, so the lock is taken first and the keys come under it."""

    def release() -> None:
        time.sleep(SQLITE_HOLD)
        database.unlock()

    early = mode == "atomic"
    return Fault("exclusive-lock", database.lock, release, lock=LONG_LOCK, early=early)


#: Blackholes (issue 39) and their lengths: shorter than the views' 10 s lock, and longer.
BLACKHOLES = {"blackhole-1s": 1.0, "blackhole-5s": 5.0, "blackhole-15s": 15.0}


def blackhole_fault(name: str, proxy: FaultProxy, *, pooled: bool = False) -> Fault:
    """Silence every connection through the proxy, and the new ones until the fault ends (as
    a failover that moved an IP does); those silenced stay so, open, after it. Longer than
    the lock, a key may run twice (the owner gave its result up when its lock could lapse)."""
    seconds = BLACKHOLES[name]

    def inject() -> None:
        print(f"silenced {proxy.blackhole()}", end=" ")

    def recover() -> None:
        time.sleep(seconds)
        print(f"still open {proxy.restore()}", end=" ")

    runs = frozenset({1, 2}) if seconds > SHORT_LOCK else frozenset({1})
    return Fault(name, inject, recover, executions=runs, logged_in=not pooled)
