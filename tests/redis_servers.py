"""``redis-server`` processes of the tests' own (issue 44): one server, or a Redis Cluster of
three primaries, each in a folder of its own, on ports below the kernel's ephemeral range
(:mod:`tests.ports`). Never the machine's shared Redis; only their own pids are signalled. A
server or a cluster may ask for a password (:func:`auth_options`) and speak TLS only
(:func:`tls_files`, :func:`tls_options`).

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
from typing import Any

import redis

from tests import ports

#: How long a server or the cluster has to answer (seconds).
START_TIMEOUT = 30.0


def _within(chosen: str) -> range:
    first, last = (int(port) for port in chosen.split("-"))
    return range(first, last + 1)


def free_port() -> int:
    """A port for a private ``redis-server``, below the kernel's ephemeral ports: a probe of a
    server not listening yet (or restarting) on one of those may connect to itself and read its
    own ``HELLO`` back (:mod:`tests.ports`; the Sentinel test's probe once, on 47300-47399).
    ``IDEMPOTENCY_REDIS_PORTS=first-last``: a range of one's own."""
    within = ports.below_ephemeral()
    if chosen := os.environ.get("IDEMPOTENCY_REDIS_PORTS"):
        within = _within(chosen)
    return ports.free(1, within)[0]


def start_server(
    port: int,
    directory: str,
    *options: str,
    config: str | None = None,
    client: dict[str, Any] | None = None,
) -> subprocess.Popen[bytes]:
    """A ``redis-server`` on ``port`` with its files and its log in ``directory``, returned once
    it answers a ``PING``; if it ends or stays silent 30 s, a failure with its log's tail (a
    restart's probe once gave up after 10 s on a loaded machine, its cause unknown). The probe
    speaks RESP2 (no ``HELLO``): on a port of the ephemeral range one connected to itself
    before the replica listened and read its own ``HELLO 3`` back (CI, the redis leg);
    :func:`free_port` no longer gives one. ``client``: the probe's options (a password, TLS)."""
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
            redis.Redis(
                host="127.0.0.1", port=port, protocol=2, socket_timeout=5, **(client or {})
            ).ping()
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


def auth_options(password: str, user: str = "", user_password: str = "") -> list[str]:
    """A server's options that ask for ``password`` (the default user's: ``requirepass``, and
    ``masterauth`` for its replicas), and an ACL ``user`` with ``user_password`` if given."""
    found = ["--requirepass", password, "--masterauth", password]
    if user:
        found += ["--user", user, "on", f">{user_password}", "~*", "&*", "+@all"]
    return found


def tls_files(directory: str | Path) -> dict[str, str]:
    """A CA and a certificate of 127.0.0.1 it signed, made by ``openssl`` in ``directory``
    (valid two days): the files' paths by the name of redis-server's option."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = folder / "ca.crt", folder / "ca.key"
    cert, key, request = folder / "server.crt", folder / "server.key", folder / "server.csr"
    extensions = folder / "san.ext"
    extensions.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl = shutil.which("openssl") or "openssl"
    for command in (
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca,
         "-days", "2", "-subj", "/CN=idempotency-test-ca"],
        ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", request,
         "-subj", "/CN=127.0.0.1"],
        ["x509", "-req", "-in", request, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
         "-out", cert, "-days", "2", "-extfile", extensions],
    ):  # fmt: skip
        subprocess.run([openssl, *map(str, command)], check=True, capture_output=True)
    return {"tls-ca-cert-file": str(ca), "tls-cert-file": str(cert), "tls-key-file": str(key)}


def tls_options(port: int, files: dict[str, str]) -> list[str]:
    """A server's options that make it speak TLS only, on ``port`` (no plain port), without
    client certificates, TLS for its replication and its cluster bus too."""
    found = ["--tls-port", str(port), "--port", "0", "--tls-auth-clients", "no"]
    found += ["--tls-replication", "yes", "--tls-cluster", "yes"]
    for name, path in files.items():
        found += [f"--{name}", path]
    return found


def tls_client(files: dict[str, str]) -> dict[str, Any]:
    """A redis-py client's options for a server of :func:`tls_options`."""
    return {"ssl": True, "ssl_ca_certs": files["tls-ca-cert-file"]}


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
    ``directory/pids``; ``processes`` maps each node's port to its process. With ``password``
    every node asks for it (and ``user`` with ``user_password``, an ACL user); with ``tls``
    (:func:`tls_files`) every node speaks TLS only, its bus too. With
    ``IDEMPOTENCY_REDIS_PORTS`` the nodes and their buses (``cluster-port``) are in that
    range."""

    def __init__(
        self,
        directory: str | Path,
        *options: str,
        replicas: int = 0,
        password: str = "",
        user: str = "",
        user_password: str = "",
        tls: dict[str, str] | None = None,
    ) -> None:
        self.dir = Path(directory)
        self.options = options
        self.replicas = replicas
        self.password, self.user, self.user_password, self.tls = password, user, user_password, tls
        self.ports: list[int] = []
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def client(self) -> dict[str, Any]:
        """A raw client's options for a node: the default user's password, TLS."""
        return {
            **({"password": self.password} if self.password else {}),
            **(tls_client(self.tls) if self.tls else {}),
        }

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
        """Its URL, with the ACL user's credentials if it has one, else the password's."""
        scheme = "rediss+cluster://" if self.tls else "redis+cluster://"
        auth = ""
        if self.user:
            auth = f"{self.user}:{self.user_password}@"
        elif self.password:
            auth = f":{self.password}@"
        query = f"?ssl_ca_certs={self.tls['tls-ca-cert-file']}" if self.tls else ""
        return scheme + auth + ",".join(f"127.0.0.1:{port}" for port in self.ports) + query

    def start(self) -> str:
        taken: set[int] = set()
        within = os.environ.get("IDEMPOTENCY_REDIS_PORTS")
        for _ in range(3 * (1 + self.replicas)):
            options = list(self.options)
            if within:
                port, bus = ports.free(2, _within(within), taken)
                taken.update({port, bus})
                options += ["--cluster-port", str(bus)]
            else:
                port = _cluster_port(taken)
            if self.password:
                options += auth_options(self.password, self.user, self.user_password)
            if self.tls:
                options += tls_options(port, self.tls)
            folder = self.dir / str(port)
            folder.mkdir(parents=True)
            self.processes[port] = start_server(
                port, str(folder), "--cluster-enabled", "yes", "--appendonly", "yes",
                "--cluster-node-timeout", "1000", *options, client=self.client,
            )  # fmt: skip
            self.ports.append(port)
            pids = " ".join(str(p.pid) for p in self.processes.values())
            (self.dir / "pids").write_text(pids)
        cli = [shutil.which("redis-cli") or "redis-cli"]
        if self.password:
            cli += ["-a", self.password, "--no-auth-warning"]
        if self.tls:
            cli += ["--tls", "--cacert", self.tls["tls-ca-cert-file"]]
        subprocess.run(
            [*cli, "--cluster", "create",
             *(f"127.0.0.1:{port}" for port in self.ports), "--cluster-replicas",
             str(self.replicas), "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        while not all(self._ok(port, self.client) for port in self.ports):
            if time.monotonic() > deadline:
                raise AssertionError(f"the cluster on {self.ports} is not ok after 30 s")
            time.sleep(0.1)
        return self.url

    @staticmethod
    def _ok(port: int, client: dict[str, Any]) -> bool:
        node = redis.Redis(host="127.0.0.1", port=port, protocol=2, socket_timeout=5, **client)
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
