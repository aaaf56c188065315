"""Start a three-node MariaDB Galera cluster on loopback, wait until it is Synced, stop it.

Three ``mariadbd`` processes, each with its own data folder, client port and socket under one
temporary folder, and their own group communication, IST and SST ports, all picked free at
start (the machine's own MariaDB on 3306 is never touched: ``--no-defaults`` keeps its
configuration out too). The first node bootstraps the cluster (``--wsrep-new-cluster``); the
others join it and receive its state by ``rsync`` SST. A node can be SIGKILLed and restarted:
it recovers its position from InnoDB first (as ``galera_recovery`` does), so it rejoins by IST.
Every wait is bounded, and a node that cannot start fails with the tail of its error log.

Run it by hand with ``python -m tests.galera.harness start|status|stop``: ``start`` leaves the
cluster running and writes its description to ``$TMPDIR/idempotency-galera.json``, which
``status`` and ``stop`` read.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests import ports
from tests.conftest import NEEDS_MYSQLCLIENT

MySQLdb = pytest.importorskip("MySQLdb", reason=NEEDS_MYSQLCLIENT)

MARIADBD = shutil.which("mariadbd", path="/usr/sbin:/usr/bin") or "mariadbd"
INSTALL_DB = shutil.which("mariadb-install-db") or "mariadb-install-db"
PROVIDER = "/usr/lib/galera/libgalera_smm.so"
START_TIMEOUT = 120.0
STOP_TIMEOUT = 60.0
STATE_FILE = Path(tempfile.gettempdir()) / "idempotency-galera.json"
LOG_TAIL = 40


def _server_user() -> str | None:
    """The user the nodes run as: ``mysql`` when we are root. Not root itself: a joiner's
    rsync SST daemon started by root drops to ``nobody``, which cannot write the data folder."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("mysql").pw_name
    except KeyError:
        return "root"


class ClusterError(RuntimeError):
    """The cluster (or one node) did not reach the state asked for in time."""


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on loopback now, below the kernel's ephemeral ports: a
    killed node's ports must be free when it restarts (:mod:`tests.ports` says why). Taken from
    ``IDEMPOTENCY_GALERA_PORTS=first-last`` when set: a range of one's own on a shared machine."""
    within = ports.below_ephemeral()
    if chosen := os.environ.get("IDEMPOTENCY_GALERA_PORTS"):
        first, last = (int(port) for port in chosen.split("-"))
        within = range(first, last + 1)
    return ports.free(count, within)


@dataclass
class Node:
    """One ``mariadbd``: its folder, its ports, and the process this harness started."""

    name: str
    datadir: str
    port: int
    group_port: int
    ist_port: int
    sst_port: int
    pid: int | None = None

    @property
    def socket(self) -> str:
        return str(Path(self.datadir) / "mariadbd.sock")

    @property
    def error_log(self) -> Path:
        return Path(self.datadir).parent / f"{self.name}.err"

    @property
    def url(self) -> str:
        """A ``DATABASE_URL`` for this node (database ``name`` to be appended)."""
        return f"mysql://root@127.0.0.1:{self.port}/"

    def connect(self, database: str | None = None, **options: Any) -> Any:
        """A MySQLdb connection as root over TCP, autocommit off (MySQLdb's default)."""
        extra = {"database": database} if database else {}
        return MySQLdb.connect(
            host="127.0.0.1", port=self.port, user="root", connect_timeout=5, **extra, **options
        )

    def status(self) -> dict[str, str]:
        """This node's ``wsrep_%`` status variables."""
        with closing(self.connect()) as conn, conn.cursor() as cursor:
            cursor.execute("SHOW STATUS LIKE 'wsrep_%'")
            return {str(name): str(value) for name, value in cursor.fetchall()}

    def running(self) -> bool:
        if self.pid is None:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        # A zombie of ours still answers kill(0): reap it if it has exited.
        try:
            done, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return _alive_not_zombie(self.pid)
        return done == 0

    def log_tail(self, lines: int = LOG_TAIL) -> str:
        try:
            text = self.error_log.read_text(errors="replace")
        except FileNotFoundError:
            return "(no error log)"
        return "\n".join(text.splitlines()[-lines:])


def _alive_not_zombie(pid: int) -> bool:
    """For a node started by another process (``python -m ... start``, then ``stop``)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


@dataclass
class Cluster:
    """Three nodes under ``root``; ``start()`` brings them up, ``stop()`` ends what it started."""

    root: str
    name: str
    nodes: list[Node] = field(default_factory=list)

    @classmethod
    def create(cls, size: int = 3) -> Cluster:
        root = tempfile.mkdtemp(prefix="idempotency-galera-")
        user = _server_user()
        if user is not None:
            shutil.chown(root, user)
        ports = free_ports(4 * size)
        nodes = [
            Node(f"node{i + 1}", str(Path(root) / f"node{i + 1}"), *ports[4 * i : 4 * i + 4])
            for i in range(size)
        ]
        return cls(root, f"idempotency-{uuid.uuid4().hex[:8]}", nodes)

    # Starting and stopping ------------------------------------------------------------------

    def start(self) -> None:
        """Bootstrap the first node, join the others one by one, wait until all are Synced."""
        try:
            first, *others = self.nodes
            self._install(first)
            self._launch(first, bootstrap=True)
            self.wait_synced([first])
            for joined, node in enumerate(others, start=2):
                self._make_datadir(node)
                self._launch(node)
                # One joiner at a time: a donor serves one SST at a time.
                self.wait_synced([first, node], size=joined)
            self.wait_synced()
        except BaseException:
            self.stop()
            raise

    def stop(self, *, remove: bool = True) -> None:
        """SIGTERM the nodes this harness started (joiners first), SIGKILL what outlives the
        bound, and remove the folder."""
        for node in reversed(self.nodes):
            self._terminate(node)
        if remove:
            shutil.rmtree(self.root, ignore_errors=True)

    def kill(self, node: Node) -> None:
        """SIGKILL ``node``, as an OOM kill or a power cut does, and wait until it is gone."""
        assert node.pid is not None
        os.kill(node.pid, signal.SIGKILL)
        self._wait_gone(node, STOP_TIMEOUT)
        node.pid = None

    def restart(self, node: Node) -> str | None:
        """Start a stopped or killed ``node`` again at the position it recovers from InnoDB, so
        it rejoins by IST; once the whole cluster is Synced, return that position (``None``:
        none recovered, the node was given a full state transfer)."""
        assert not node.running(), f"{node.name} is still running"
        position = self._recover_position(node)
        self._launch(node, start_position=position)
        self.wait_synced()
        return position

    def _make_datadir(self, node: Node) -> None:
        """An empty data folder: a joiner receives everything by SST."""
        Path(node.datadir).mkdir()
        if (user := _server_user()) is not None:
            shutil.chown(node.datadir, user)

    def _install(self, node: Node) -> None:
        result = subprocess.run(
            [
                INSTALL_DB,
                "--no-defaults",
                *_user_option(),
                f"--datadir={node.datadir}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT,
        )
        if result.returncode != 0:
            raise ClusterError(
                f"mariadb-install-db failed for {node.name} ({node.datadir}):\n"
                f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            )

    def command(self, node: Node, *extra: str) -> list[str]:
        """The ``mariadbd`` command line of ``node`` (no option file: all of it is here)."""
        members = ",".join(f"127.0.0.1:{other.group_port}" for other in self.nodes)
        provider_options = ";".join(
            [
                f"gmcast.listen_addr=tcp://127.0.0.1:{node.group_port}",
                f"ist.recv_addr=127.0.0.1:{node.ist_port}",
                "gcache.size=128M",
                # Loopback never partitions: declare a silent node dead in seconds, not 30+.
                "evs.suspect_timeout=PT5S",
                "evs.inactive_timeout=PT10S",
                "evs.install_timeout=PT10S",
            ]
        )
        return [
            MARIADBD,
            "--no-defaults",
            *_user_option(),
            f"--datadir={node.datadir}",
            f"--socket={node.socket}",
            f"--pid-file={Path(node.datadir) / 'mariadbd.pid'}",
            f"--log-error={node.error_log}",
            f"--port={node.port}",
            "--bind-address=127.0.0.1",
            "--skip-name-resolve",
            # What Galera requires of every node.
            "--binlog-format=ROW",
            "--default-storage-engine=InnoDB",
            "--innodb-autoinc-lock-mode=2",
            # Small and quick to start: this is a test cluster on a shared machine.
            "--innodb-buffer-pool-size=64M",
            "--innodb-log-file-size=48M",
            "--innodb-flush-log-at-trx-commit=2",
            "--max-connections=300",
            "--wsrep-on=ON",
            f"--wsrep-provider={PROVIDER}",
            f"--wsrep-cluster-name={self.name}",
            f"--wsrep-cluster-address=gcomm://{members}",
            f"--wsrep-node-name={node.name}",
            f"--wsrep-node-address=127.0.0.1:{node.group_port}",
            f"--wsrep-node-incoming-address=127.0.0.1:{node.port}",
            f"--wsrep-provider-options={provider_options}",
            "--wsrep-sst-method=rsync",
            f"--wsrep-sst-receive-address=127.0.0.1:{node.sst_port}",
            *extra,
        ]

    def _launch(
        self, node: Node, *, bootstrap: bool = False, start_position: str | None = None
    ) -> None:
        extra = ["--wsrep-new-cluster"] if bootstrap else []
        if start_position:
            extra.append(f"--wsrep-start-position={start_position}")
        process = subprocess.Popen(
            self.command(node, *extra),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        node.pid = process.pid
        # The Popen object is dropped on purpose: running() and the waits reap the pid.

    def _recover_position(self, node: Node) -> str | None:
        """``mariadbd --wsrep-recover``: the last committed ``uuid:seqno`` InnoDB holds."""
        recover_log = Path(self.root) / f"{node.name}-recover.err"
        command = [
            arg if not arg.startswith("--log-error=") else f"--log-error={recover_log}"
            for arg in self.command(node, "--wsrep-recover")
        ]
        subprocess.run(command, capture_output=True, timeout=START_TIMEOUT, check=False)
        text = recover_log.read_text(errors="replace") if recover_log.exists() else ""
        found = re.findall(r"WSREP: Recovered position:\s*(\S+:-?\d+)", text)
        return found[-1] if found else None

    def _terminate(self, node: Node) -> None:
        if not node.running():
            node.pid = None
            return
        assert node.pid is not None
        os.kill(node.pid, signal.SIGTERM)
        try:
            self._wait_gone(node, STOP_TIMEOUT)
        except ClusterError:
            os.kill(node.pid, signal.SIGKILL)
            self._wait_gone(node, STOP_TIMEOUT)
        node.pid = None

    @staticmethod
    def _wait_gone(node: Node, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not node.running():
                return
            time.sleep(0.05)
        raise ClusterError(f"{node.name} (pid {node.pid}) still running after {timeout}s")

    # Waiting ----------------------------------------------------------------------------------

    def wait_synced(
        self,
        nodes: list[Node] | None = None,
        *,
        size: int | None = None,
        timeout: float = START_TIMEOUT,
    ) -> None:
        """Wait until every node in ``nodes`` (all by default) is Synced in a primary component
        of exactly ``size`` members (by default, as many as ``nodes``): after a kill, until the
        survivors have evicted the dead node."""
        nodes = self.nodes if nodes is None else nodes
        wanted = len(nodes) if size is None else size
        deadline = time.monotonic() + timeout
        last: dict[str, str] = {}
        while time.monotonic() < deadline:
            for node in nodes:
                if not node.running():
                    raise ClusterError(f"{node.name} exited:\n{self.log_tails()}")
            try:
                states = {node.name: node.status() for node in nodes}
            except MySQLdb.OperationalError as exc:
                last = {"error": str(exc)}
            else:
                last = {
                    name: f"{s.get('wsrep_local_state_comment')}, size "
                    f"{s.get('wsrep_cluster_size')}, {s.get('wsrep_cluster_status')}"
                    for name, s in states.items()
                }
                if all(_synced(s, wanted) for s in states.values()):
                    return
            time.sleep(0.2)
        raise ClusterError(f"cluster not Synced after {timeout:.0f}s: {last}\n{self.log_tails()}")

    def log_tails(self) -> str:
        """The end of every started node's error log: a joiner's failure is often its donor's."""
        return "\n".join(
            f"--- {node.name} ({node.error_log}) ---\n{node.log_tail()}"
            for node in self.nodes
            if node.error_log.exists()
        )

    def create_database(self, name: str, timeout: float = 30.0) -> None:
        """Create it through the first node and wait until every node has it: connecting to a
        database names it before any causal read (``wsrep_sync_wait``) could wait for it, and
        ``SHOW DATABASES`` does not wait for a DDL being applied (seen here)."""
        with closing(self.nodes[0].connect()) as conn, conn.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            with closing(node.connect()) as conn, conn.cursor() as cursor:
                while True:
                    cursor.execute(
                        "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s",
                        (name,),
                    )
                    if cursor.fetchall() == ((1,),):
                        break
                    if time.monotonic() > deadline:
                        raise ClusterError(f"database {name} missing on {node.name}")
                    time.sleep(0.05)

    # Persistence for the command line ---------------------------------------------------------

    def save(self, path: Path = STATE_FILE) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path = STATE_FILE) -> Cluster:
        data = json.loads(path.read_text())
        return cls(data["root"], data["name"], [Node(**node) for node in data.pop("nodes")])


def _user_option() -> list[str]:
    user = _server_user()
    return [] if user is None else [f"--user={user}"]


def _synced(status: dict[str, str], size: int) -> bool:
    return (
        status.get("wsrep_local_state_comment") == "Synced"
        and status.get("wsrep_cluster_status") == "Primary"
        and status.get("wsrep_ready") == "ON"
        and int(status.get("wsrep_cluster_size", 0)) == size
    )


@contextmanager
def running_cluster() -> Iterator[Cluster]:
    """A started cluster, stopped and removed on exit whatever happens."""
    cluster = Cluster.create()
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def main(argv: list[str]) -> int:
    action = argv[0] if argv else ""
    if action == "start":
        started = time.monotonic()
        cluster = Cluster.create()
        cluster.start()
        cluster.save()
        print(f"cluster {cluster.name} Synced in {time.monotonic() - started:.1f} s")
        for node in cluster.nodes:
            print(f"{node.name}: pid {node.pid} {node.url} (socket {node.socket})")
        return 0
    if action in ("status", "stop"):
        if not STATE_FILE.exists():
            print(f"no cluster started by this harness ({STATE_FILE} missing)")
            return 1
        cluster = Cluster.load()
        if action == "stop":
            cluster.stop()
            STATE_FILE.unlink()
            print(f"cluster {cluster.name} stopped and removed")
            return 0
        for node in cluster.nodes:
            if not node.running():
                print(f"{node.name}: not running")
                continue
            s = node.status()
            print(
                f"{node.name}: pid {node.pid} port {node.port} "
                f"{s['wsrep_local_state_comment']} size {s['wsrep_cluster_size']}"
            )
        return 0
    print("usage: python -m tests.galera.harness start|status|stop", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
