"""The app under fault: gunicorn with several threaded worker processes, on a fault database.

``gthread`` workers (4 processes of 16 threads): twenty requests wait in their views at once
while their duplicates, retries and new requests are served. A worker accepts no more
connections than it has threads: a request queued in a worker whose threads all wait at the
gate would wait for the gate, which waits for it. Each worker keeps its connections
per thread as Django does; the suite checks that no worker was re-forked (:meth:`booted`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.faults.databases import free_port, track, untrack
from tests.servers import harness

WORKERS = 4
THREADS = 16


class App(harness.Server):
    """A started :class:`tests.servers.harness.Server` whose folder holds the views' files."""

    folder: Path
    #: The cookies of a logged-in client (``/log-in/``).
    session: dict[str, str]

    def start(self) -> None:
        super().start()
        assert self.process is not None
        track(self.process.pid, "gunicorn")
        response = httpx.post(f"{self.url}/log-in/", timeout=30)
        response.raise_for_status()
        self.session = dict(response.cookies)

    def stop(self) -> None:
        super().stop()
        if self.process is not None:
            untrack(self.process.pid)
        shutil.rmtree(self.folder, ignore_errors=True)

    def discard_log(self) -> None:
        """Keep a copy in ``IDEMPOTENCY_FAULT_LOGS`` (a folder) when it is set, for a look at
        what the workers said under a fault that passed too."""
        if (folder := os.environ.get("IDEMPOTENCY_FAULT_LOGS")) and hasattr(self, "log_path"):
            shutil.copy(self.log_path, Path(folder) / self.log_path.name)
        super().discard_log()

    def warm(self) -> None:
        """Give every worker thread a connection: as many requests at once as there are
        threads, each holding its thread for a moment (a worker takes no more than its
        threads). A thread whose kept connection died in an earlier fault answers this plain
        view with Django's own ``500`` at once and drops that connection; being free again, it
        may take a second request of the round while another thread gets none. So rounds go on
        until one is answered ``200`` throughout. That still does not reach every thread (a
        worker may take more of a round's requests, one after another, than another worker):
        an app warmed after a fault is one of its own (``test_persistent.py``)."""
        statuses: list[int] = []
        for _ in range(6):
            with ThreadPoolExecutor(max_workers=WORKERS * THREADS) as pool:
                statuses = list(pool.map(
                    lambda _: httpx.get(f"{self.url}/warm/", timeout=60).status_code,
                    range(WORKERS * THREADS)))  # fmt: skip
            if set(statuses) == {200}:
                return
        raise AssertionError(f"the app's threads did not all reconnect: {sorted(statuses)}")

    def booted(self) -> set[int]:
        """Every worker pid gunicorn booted so far: a re-forked worker adds one."""
        return self.worker_pids()


def environment(database_url: str, folder: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="tests.faults.settings",
        DATABASE_URL=database_url,
        IDEMPOTENCY_FAULT_DIR=str(folder),
        PYTHONPATH=os.pathsep.join(filter(None, [str(harness.ROOT), env.get("PYTHONPATH")])),
        PYTHONUNBUFFERED="1",
    )
    env.pop("IDEMPOTENCY_TEST_DB", None)
    env.update(extra)
    return env


def migrate(database_url: str) -> None:
    """The app's tables on the fault database, as a deployment creates them."""
    result = subprocess.run(
        [sys.executable, "-m", "django", "migrate", "--noinput", "-v", "0"],
        cwd=harness.ROOT,
        env=environment(database_url, Path(tempfile.gettempdir())),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode != 0:
        raise RuntimeError(f"migrate failed:\n{result.stdout}\n{result.stderr}")


def app(database_url: str, **extra: str) -> App:
    """Not started yet: call ``start()``. ``extra``: more environment (persistent connections)."""
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="idem-faults-app-"))
    command = [
        sys.executable, "-m", "gunicorn",
        "--workers", str(WORKERS), "--threads", str(THREADS), "--worker-class", "gthread",
        "--worker-connections", str(THREADS),
        "--preload", "--bind", f"127.0.0.1:{port}", "--backlog", "256",
        "--timeout", "120", "--graceful-timeout", "2",
        "--log-level", "info", "--error-logfile", "-",
        *harness._no_control_socket(),
        "django.core.wsgi:get_wsgi_application()",
    ]  # fmt: skip
    server = App("gunicorn", command, port, environment(database_url, folder, **extra), WORKERS)
    server.folder = folder
    return server
