"""The fault harness signals only its own processes, however long the run.

A long run forks thousands of processes and threads, and the kernel's pids wrap (32768 here)
within minutes: a pid the harness tracked may name another process by then, or a thread of
one (``/proc`` shows a thread's id, and ``kill`` of it signals its whole process). Two of the
checker's hour-long runs were SIGKILLed so, by a harness ending a server that was gone.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from tests.faults import databases


def test_a_threads_id_is_no_process() -> None:
    ready, done = threading.Event(), threading.Event()
    ids: list[int] = []

    def waiting() -> None:
        ids.append(threading.get_native_id())
        ready.set()
        done.wait(10)

    thread = threading.Thread(target=waiting)
    thread.start()
    try:
        assert ready.wait(10)
        assert databases.started_at(ids[0]) is None
        assert not databases.alive(ids[0])
        assert databases.alive(threading.get_native_id()) == (
            threading.get_native_id() == threading.main_thread().native_id
        )
    finally:
        done.set()
        thread.join()


def test_a_tracked_pid_that_names_another_process_is_gone() -> None:
    """A pid tracked when its process started, which now names a process started later."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    try:
        databases.track(child.pid, "child")
        assert databases.alive(child.pid)
        what, began = databases._started[child.pid]
        assert began is not None
        databases._started[child.pid] = (what, began - 1)  # as if an earlier process's
        assert not databases.alive(child.pid)
        databases.end(child.pid, grace=0.5)  # not ours any more: not signalled
        assert child.poll() is None
    finally:
        databases.untrack(child.pid)
        assert child.stdin is not None
        child.stdin.close()
        child.wait(10)


def test_ending_a_pid_that_is_a_thread_of_this_process_spares_it() -> None:
    """``end`` of a gone server's pid, now a thread's id of the process that ends it: it must
    not SIGTERM (or SIGKILL) that process. In a process of its own: without the check, the
    signal ends it."""
    code = (
        "import threading\n"
        "from tests.faults import databases\n"
        "ids, done = [], threading.Event()\n"
        "thread = threading.Thread(target=lambda: (ids.append(threading.get_native_id()), "
        "done.wait(10)))\n"
        "thread.start()\n"
        "while not ids: pass\n"
        "databases.end(ids[0], grace=0.5)\n"
        "done.set(); thread.join()\n"
        "print('spared')\n"
    )
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=root
    )
    assert (result.returncode, result.stdout.strip()) == (0, "spared"), result.stderr
