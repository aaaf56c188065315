"""``redis-server`` processes of the tests' own (issue 44): one server, or a Redis Cluster of
three primaries, each in a folder of its own, on ports below the kernel's ephemeral range
(:mod:`tests.ports`). Never the machine's shared Redis; only their own pids are signalled.

``python -m tests.redis_servers cluster DIR`` starts a cluster for CI's Redis leg and prints its
``redis+cluster://`` URL; ``python -m tests.redis_servers stop DIR`` ends it.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import redis

from tests import ports

#: How long a server or the cluster has to answer (seconds).
START_TIMEOUT = 30.0


def free_port() -> int:
    """A port for a private ``redis-server``, below the kernel's ephemeral ports: a probe of a
    server not listening yet (or restarting) on one of those may connect to itself and read its
    own ``HELLO`` back (:mod:`tests.ports`; the Sentinel test's probe once, on 47300-47399).
    ``IDEMPOTENCY_REDIS_PORTS=first-last``: a range of one's own."""
    within = ports.below_ephemeral()
    if chosen := os.environ.get("IDEMPOTENCY_REDIS_PORTS"):
        first, last = (int(port) for port in chosen.split("-"))
        within = range(first, last + 1)
    return ports.free(1, within)[0]


def start_server(
    port: int, directory: str, *options: str, config: str | None = None
) -> subprocess.Popen[bytes]:
    """A ``redis-server`` on ``port`` with its files and its log in ``directory``, returned once
    it answers a ``PING``; if it ends or stays silent 30 s, a failure with its log's tail (a
    restart's probe once gave up after 10 s on a loaded machine, its cause unknown). The probe
    speaks RESP2 (no ``HELLO``): on a port of the ephemeral range one connected to itself
    before the replica listened and read its own ``HELLO 3`` back (CI, the redis leg);
    :func:`free_port` no longer gives one."""
    log = Path(directory, f"redis-{port}.log")
    process = subprocess.Popen(
        [shutil.which("redis-server") or "redis-server", *([config] if config else []),
         "--port", str(port), "--bind", "127.0.0.1", "--dir", directory, "--logfile", str(log),
         *([] if config else ["--save", ""]), *options],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            redis.Redis(host="127.0.0.1", port=port, protocol=2, socket_timeout=5).ping()
            return process
        except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError) as error:
            if process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            process.kill()
            ended = process.wait()
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
            raise AssertionError(
                f"redis-server on port {port} did not answer ({error}; exit {ended}):\n{tail}"
            ) from error


def _cluster_port(taken: set[int]) -> int:
    """A port whose cluster bus port (10000 above) is free and below the ephemeral range too."""
    top = ports.ephemeral().start - 10000
    for port in random.sample(range(20000, top), top - 20000):
        if {port, port + 10000} & taken:
            continue
        with socket.socket() as one, socket.socket() as bus:
            try:
                one.bind(("127.0.0.1", port))
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        taken.update({port, port + 10000})
        return port
    raise OSError(f"no free pair of ports in 20000-{top - 1} and 10000 above")


class private_cluster:
    """A Redis Cluster of three primaries (and ``replicas`` replicas of each), with the AOF on,
    in ``directory``: its URL once every node sees every slot served. Its pids are in
    ``directory/pids``; ``processes`` maps each node's port to its process."""

    def __init__(self, directory: str | Path, *options: str, replicas: int = 0) -> None:
        self.dir = Path(directory)
        self.options = options
        self.replicas = replicas
        self.ports: list[int] = []
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    def __enter__(self) -> str:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def start(self) -> str:
        taken: set[int] = set()
        for _ in range(3 * (1 + self.replicas)):
            port = _cluster_port(taken)
            folder = self.dir / str(port)
            folder.mkdir(parents=True)
            self.processes[port] = start_server(
                port, str(folder), "--cluster-enabled", "yes", "--appendonly", "yes",
                "--cluster-node-timeout", "1000", *self.options,
            )  # fmt: skip
            self.ports.append(port)
            pids = " ".join(str(p.pid) for p in self.processes.values())
            (self.dir / "pids").write_text(pids)
        subprocess.run(
            [shutil.which("redis-cli") or "redis-cli", "--cluster", "create",
             *(f"127.0.0.1:{port}" for port in self.ports), "--cluster-replicas",
             str(self.replicas), "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        while not all(self._ok(port) for port in self.ports):
            if time.monotonic() > deadline:
                raise AssertionError(f"the cluster on {self.ports} is not ok after 30 s")
            time.sleep(0.1)
        return self.url

    @staticmethod
    def _ok(port: int) -> bool:
        node = redis.Redis(host="127.0.0.1", port=port, protocol=2, socket_timeout=5)
        try:
            info = node.execute_command("CLUSTER", "INFO").decode()
        finally:
            node.close()
        return "cluster_state:ok" in info and "cluster_slots_ok:16384" in info

    def stop(self) -> None:
        for process in self.processes.values():
            process.kill()
            process.wait()
        self.processes.clear()


def main(argv: list[str]) -> None:
    """``cluster DIR``: start one and print its URL; ``stop DIR``: end the pids it wrote."""
    verb, directory = argv
    if verb == "cluster":
        cluster = private_cluster(directory)
        try:
            print(cluster.start())
        except BaseException:
            cluster.stop()
            raise
    elif verb == "stop":
        pids = Path(directory, "pids")
        for pid in pids.read_text().split() if pids.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    else:
        raise SystemExit(f"unknown verb {verb!r}: cluster DIR | stop DIR")


if __name__ == "__main__":
    main(sys.argv[1:])
