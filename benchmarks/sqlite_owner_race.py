"""How long an owner's write waits for SQLite's write lock under a crowd of writers.

A model of ``tests/faults/test_sqlite.py``'s crowd, at the driver's level: 4 processes of 12
threads each begin ``IMMEDIATE`` (a 1 s busy timeout, as an atomic view's wait), hold the lock
0.2 s, commit, and come back 3 ms later (the response and the next request); an owner writes
every 0.3 s, trying for the lock as ``SQLiteStore.owner_write`` does (``pause``: no busy wait,
again every half millisecond) or as it did (``busy``: a 10 ms busy timeout, again at once).
Run both side by side, so that they share the machine's load:

    python benchmarks/sqlite_owner_race.py busy 60 & python benchmarks/sqlite_owner_race.py pause 60

Prints the owner's writes and their waits (median, 90th percentile, longest; how many over
0.6 s and over 1 s).
"""

from __future__ import annotations

import multiprocessing
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

PROCESSES, THREADS, HOLD, COMEBACK, EVERY, PAUSE = 4, 12, 0.2, 0.003, 0.3, 0.0005


def crowd(path: str, stop_at: float) -> None:
    def writer() -> None:
        while time.time() < stop_at:
            connection = sqlite3.connect(path, timeout=1.0, isolation_level=None)
            try:
                connection.execute("BEGIN IMMEDIATE")
                connection.execute("INSERT INTO t VALUES (1)")
                time.sleep(HOLD)
                connection.execute("COMMIT")
            except sqlite3.OperationalError:  # its wait ran out: a 503, and the next request
                pass
            finally:
                connection.close()
            time.sleep(COMEBACK)

    threads = [threading.Thread(target=writer) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def owner(
    path: str, strategy: str, stop_at: float, out: multiprocessing.Queue[list[float]]
) -> None:
    connection = sqlite3.connect(path, isolation_level=None)
    waits = []
    while time.time() < stop_at - 1:
        time.sleep(EVERY)
        start = time.monotonic()
        while True:
            try:
                connection.execute(f"PRAGMA busy_timeout = {10 if strategy == 'busy' else 0}")
                connection.execute("BEGIN IMMEDIATE")
                connection.execute("PRAGMA busy_timeout = 5000")
                connection.execute("INSERT INTO t VALUES (2)")
                connection.execute("COMMIT")
                break
            except sqlite3.OperationalError:
                if strategy == "pause":
                    time.sleep(PAUSE)
        waits.append(time.monotonic() - start)
    out.put(waits)


def main() -> None:
    strategy, seconds = sys.argv[1], float(sys.argv[2])
    assert strategy in ("busy", "pause"), strategy
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "race.sqlite3")
        with sqlite3.connect(path) as connection:
            connection.execute("CREATE TABLE t (x)")
        stop_at = time.time() + seconds
        out: multiprocessing.Queue[list[float]] = multiprocessing.Queue()
        processes = [
            multiprocessing.Process(target=crowd, args=(path, stop_at)) for _ in range(PROCESSES)
        ]
        processes.append(multiprocessing.Process(target=owner, args=(path, strategy, stop_at, out)))
        for process in processes:
            process.start()
        waits = sorted(out.get())
        for process in processes:
            process.join()
    print(
        f"{strategy}: {len(waits)} writes, median {statistics.median(waits):.3f} s, "
        f"p90 {waits[int(len(waits) * 0.9)]:.3f} s, longest {waits[-1]:.3f} s, "
        f"over 0.6 s {sum(w > 0.6 for w in waits)}, over 1 s {sum(w > 1.0 for w in waits)}"
    )


if __name__ == "__main__":
    main()
