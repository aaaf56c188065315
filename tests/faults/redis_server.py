"""A ``redis-server`` of the fault suite's own (issue 44), and the faults it suffers.

Started in a temporary folder on a port of ``IDEMPOTENCY_FAULT_PORTS`` with the AOF on and
``appendfsync always`` (an acknowledged write is on disk), never the machine's shared Redis.
Only its own pid is ever signalled (:func:`tests.faults.databases.track` ends it at exit).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tests.faults.databases import FaultHarnessError, end, free_port, track, untrack, wait_gone

START_TIMEOUT = 30.0


class RedisServer:
    """``start``, ``kill`` (SIGKILL), ``shutdown`` (SIGTERM: Redis syncs the AOF and exits),
    ``cut`` (``CLIENT KILL`` of every client connection), ``freeze``/``thaw`` (SIGSTOP and
    SIGCONT: a blackhole, the kernel still accepts connections but nothing answers)."""

    def __init__(self) -> None:
        server = shutil.which("redis-server")
        if server is None:
            raise FaultHarnessError("redis-server is not installed (apt-get install redis-server)")
        self.program = server
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="idem-faults-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.root / "server.log"

    def start(self) -> None:
        assert self.process is None
        command = [
            self.program, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.root),
            "--appendonly", "yes", "--appendfsync", "always", "--save", "",
            "--logfile", str(self.log_path), "--daemonize", "no",
        ]  # fmt: skip
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL)
        track(self.process.pid, "redis-server")
        deadline = time.monotonic() + START_TIMEOUT
        while self._ping() != "PONG":
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise FaultHarnessError(f"redis-server did not start:\n{self.log_tail()}")
            time.sleep(0.05)

    def _ping(self) -> str:
        import redis

        try:
            return "PONG" if redis.Redis(port=self.port, socket_timeout=2).ping() else ""
        except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
            return ""

    def _gone(self) -> None:
        assert self.process is not None
        if not wait_gone(self.process.pid, 30):
            raise FaultHarnessError("redis-server did not end")
        self.process.wait()
        untrack(self.process.pid)
        self.process = None

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self._gone()

    def shutdown(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        self._gone()

    def cut(self) -> int:
        """Close every client connection of the server; how many it closed."""
        import redis

        admin = redis.Redis(port=self.port, socket_timeout=5)
        try:
            return int(admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"))
        finally:
            admin.close()

    def pause(self, seconds: float) -> None:
        """``CLIENT PAUSE`` every client (``ALL``) for ``seconds``: commands wait, the
        server's clock runs on (a lock lapses meanwhile), the pause ends by itself."""
        import redis

        admin = redis.Redis(port=self.port, socket_timeout=5)
        try:
            admin.execute_command("CLIENT", "PAUSE", int(seconds * 1000), "ALL")
        finally:
            admin.close()

    def freeze(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return f"({self.log_path} missing)"

    def destroy(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGCONT)
            end(self.process.pid, grace=10)
            self.process = None
        shutil.rmtree(self.root, ignore_errors=True)
