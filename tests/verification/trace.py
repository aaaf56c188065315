"""A diagnosis of SQLite's write lock (``IDEMPOTENCY_VERIFY_SQLITE_TRACE``: a folder): every
statement each SQLite connection of a server process begins, with its time, process, thread,
whether the connection was in a transaction, and its text, as JSON lines in
``trace-<pid>.jsonl`` of that folder (written every half second, not fsynced). Off unless
the variable is set; read beside ``locks.py``'s record of who held the file's locks."""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

_state: dict[str, Any] = {"pid": 0, "lines": deque()}
#: The signal that makes a traced process write every thread's Python stack to
#: ``stacks-<pid>.txt`` (``locks.py`` sends it to the holders of a lock held long).
DUMP = signal.SIGRTMIN + 3


def install(folder: str) -> None:
    from django.db.backends.signals import connection_created

    def created(sender: Any, connection: Any, **kwargs: Any) -> None:
        if connection.vendor != "sqlite":
            return
        raw = connection.connection
        alias = connection.alias

        def traced(sql: str) -> None:
            lines = _lines(folder)
            lines.append(
                (time.time(), threading.current_thread().name, alias, raw.in_transaction,
                 sql[:160])
            )  # fmt: skip

        raw.set_trace_callback(traced)

    connection_created.connect(created, weak=False)


def _lines(folder: str) -> deque[Any]:
    """This process's buffer (a forked worker starts its own, and its own writer)."""
    if _state["pid"] != os.getpid():
        _state["pid"] = os.getpid()
        _state["lines"] = deque()
        _state["stacks"] = (Path(folder) / f"stacks-{os.getpid()}.txt").open("a")
        faulthandler.register(DUMP, file=_state["stacks"], all_threads=True)
        threading.Thread(target=_write, args=(Path(folder),), daemon=True).start()
    lines: deque[Any] = _state["lines"]
    return lines


def _write(folder: Path) -> None:
    pid = os.getpid()
    path = folder / f"trace-{pid}.jsonl"
    while True:
        time.sleep(0.5)
        queued: deque[Any] = _state["lines"]
        lines = [queued.popleft() for _ in range(len(queued))]
        if lines:
            with path.open("a") as out:
                out.write("".join(json.dumps([pid, *line]) + "\n" for line in lines))
