"""Start the test project under real servers on loopback, wait until they serve, stop them.

gunicorn runs sync worker processes (``--preload``: Django is imported once, and a worker the
tests SIGKILL is re-forked at once); uvicorn runs the ASGI application in one process. Both log
to a file the tests read. Every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    """One server process group; ``url`` is where it listens, ``log()`` what it said so far."""

    name: str
    command: list[str]
    port: int
    env: dict[str, str]
    workers: int = 1
    log_path: Path = field(init=False)
    process: subprocess.Popen[bytes] | None = field(init=False, default=None)
    _read_to: int = field(init=False, default=0)
    _booted: set[int] = field(init=False, default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        fd, path = tempfile.mkstemp(prefix=f"idempotency-{self.name}-", suffix=".log")
        self.log_path = Path(path)
        self._read_to, self._booted = 0, set()
        with os.fdopen(fd, "wb") as log:
            # Its own session, so stop() reaches the workers too.
            self.process = subprocess.Popen(
                self.command,
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_until_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited at start:\n{self.log()}")
            if self.log().count("Booting worker") >= self.workers or self.workers == 1:
                try:
                    if httpx.get(f"{self.url}/health/", timeout=2).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready after {START_TIMEOUT}s:\n{self.log()}")

    def worker_pids(self) -> set[int]:
        """The pids of the worker processes gunicorn says it booted (dead ones included),
        read on from where the last call stopped: an hour's log is hundreds of MB, and reading
        it whole at each worker fault held the checker's process (its fault proxy's threads
        too) for seconds."""
        with self.log_path.open("rb") as log:
            log.seek(self._read_to)
            chunk = log.read()
        complete = chunk.rfind(b"\n") + 1  # a line still being written is read next time
        self._read_to += complete
        for line in chunk[:complete].decode(errors="replace").splitlines():
            if "Booting worker with pid:" in line:
                self._booted.add(int(line.rsplit(":", 1)[1]))
        return set(self._booted)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=STOP_TIMEOUT)

    def discard_log(self) -> None:
        if hasattr(self, "log_path"):
            self.log_path.unlink(missing_ok=True)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except (AttributeError, FileNotFoundError):
            return ""


def _environment(database: str, kind: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="tests.servers.settings",
        IDEMPOTENCY_SERVER_DB=database,
        IDEMPOTENCY_SERVER_KIND=kind,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        PYTHONUNBUFFERED="1",
    )
    return env


def gunicorn(database: str, *, workers: int = 4) -> Server:
    """Not started yet: call ``start()``."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "gunicorn",
        "--workers",
        str(workers),
        "--worker-class",
        "sync",
        "--preload",
        "--bind",
        f"127.0.0.1:{port}",
        "--timeout",
        "30",
        "--graceful-timeout",
        "2",
        "--log-level",
        "info",
        "--error-logfile",
        "-",
        *_no_control_socket(),
        "django.core.wsgi:get_wsgi_application()",
    ]
    return Server("gunicorn", command, port, _environment(database, "wsgi"), workers)


def _no_control_socket() -> list[str]:
    """Recent gunicorns open a control socket in ``~/.gunicorn`` shared by every instance:
    concurrent test runs would fight over it."""
    from gunicorn.config import KNOWN_SETTINGS

    if any(setting.name == "control_socket_disable" for setting in KNOWN_SETTINGS):
        return ["--no-control-socket"]
    return []


def uvicorn(database: str) -> Server:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        "django.core.asgi:get_asgi_application",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--lifespan",
        "off",
        "--log-level",
        "warning",
        "--timeout-graceful-shutdown",
        "2",
    ]
    return Server("uvicorn", command, port, _environment(database, "asgi"))
