"""Database servers of the fault suite's own, and the faults they suffer.

A PostgreSQL 15 cluster (``initdb`` as the ``postgres`` user into a temporary folder), a MariaDB
server (``mariadb-install-db`` and ``mariadbd`` with their own data folder, socket and pid file)
and a SQLite file another process holds with ``BEGIN EXCLUSIVE``. Each listens on a port of the
range in ``IDEMPOTENCY_FAULT_PORTS`` (``26100-26199``: each engineer, and CI, has a range of
its own, below the kernel's ephemeral ports), never on the machine's shared servers (5432, 3306).

Only the processes started here are ever stopped, by their pid: at the end of a fixture, and
at exit whatever happened (:func:`track` records them, an ``atexit`` hook ends the living).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tests import ports as ports_module

PORTS_VARIABLE = "IDEMPOTENCY_FAULT_PORTS"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
DATABASE = "idem_faults"
#: The replication slot of a primary's standby.
SLOT = "standby"
#: The app's own MariaDB user: ``read_only`` does not hold back root (it has SUPER).
APP_USER, APP_PASSWORD = "idem", "idem"

# Processes started here (pid -> what, and when it started: the kernel's pids wrap within
# minutes of a long run, so a pid is ours only while its start time is), ended at exit if
# still alive.
_started: dict[int, tuple[str, int | None]] = {}
_reserved: set[int] = set()


class FaultHarnessError(RuntimeError):
    """A server of the harness did not start, stop or obey in time."""


def track(pid: int, what: str) -> None:
    _started[pid] = (what, started_at(pid))


def untrack(pid: int) -> None:
    _started.pop(pid, None)


def started_at(pid: int) -> int | None:
    """When the process ``pid`` started (clock ticks since boot); ``None`` when ``pid`` names
    no live process: gone, a zombie, or a thread of another process (``/proc`` shows a
    thread's id too, and ``kill`` of it signals its whole process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat.rsplit(")", 1)[1].split()
    tgid = next((line.split()[1] for line in status.splitlines() if line.startswith("Tgid:")), "")
    if len(fields) < 20 or fields[0] == "Z" or tgid != str(pid):
        return None
    return int(fields[19])  # the 22nd field: starttime


def alive(pid: int) -> bool:
    """Whether ``pid`` runs, and is still the process tracked under it if it is tracked (a
    zombie child of ours is reaped and counts as gone; so does a pid the kernel has given to
    another process or thread since)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    began = started_at(pid)
    if began is None:
        return False
    tracked = _started.get(pid)
    return tracked is None or tracked[1] is None or tracked[1] == began


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return not alive(pid)


def end(pid: int, *, grace: float = STOP_TIMEOUT) -> None:
    """SIGTERM ``pid`` (one of ours), SIGKILL it if it outlives ``grace``; nothing if it is
    gone already (its pid may be another process's by now)."""
    if alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not wait_gone(pid, grace) and alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            wait_gone(pid, 10)
    untrack(pid)


@atexit.register
def _end_started() -> None:
    for pid, _what in list(_started.items()):
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    _started.clear()


def port_range() -> range:
    """The ports this run may use: ``IDEMPOTENCY_FAULT_PORTS=first-last``, outside the kernel's
    ephemeral range (:mod:`tests.ports` says why)."""
    value = os.environ.get(PORTS_VARIABLE, "")
    try:
        first, last = (int(part) for part in value.split("-"))
    except ValueError:
        raise FaultHarnessError(
            f"set {PORTS_VARIABLE}=first-last to the port range this run may use (got {value!r})"
        ) from None
    if not 1024 < first <= last < 65536:
        raise FaultHarnessError(f"{PORTS_VARIABLE}={value!r} is not a port range")
    ports = range(first, last + 1)
    inside = ports_module.overlap(ports)
    if inside:
        kernel = ports_module.ephemeral()
        raise FaultHarnessError(
            f"{PORTS_VARIABLE}={value!r} reaches into the kernel's ephemeral ports "
            f"({kernel.start}-{kernel.stop - 1}): a stopped server's port could be taken by a "
            "client dialling it, and the server could not start again; choose ports below "
            f"{kernel.start}"
        )
    return ports


def free_port() -> int:
    """A port of the range that nothing listens on and this run has not handed out yet."""
    try:
        return ports_module.free(1, port_range(), _reserved)[0]
    except OSError:
        raise FaultHarnessError(f"no free port left in {os.environ.get(PORTS_VARIABLE)}") from None


def _as_user(name: str) -> tuple[list[str], str | None]:
    """The command prefix that runs a program as ``name`` when we are root, and that user."""
    if os.geteuid() != 0:
        return [], None
    pwd.getpwnam(name)  # KeyError: the user is missing
    return ["runuser", "-u", name, "--"], name


def _children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(FileNotFoundError, IndexError, ValueError, ProcessLookupError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def _run(command: list[str], what: str, timeout: float = START_TIMEOUT) -> str:
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    if result.returncode != 0:
        raise FaultHarnessError(
            f"{what} failed ({result.returncode}): {' '.join(command)}\n"
            f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result.stdout


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return f"({path} missing)"


@dataclass
class _Server:
    """What both servers share: a port of the range, a folder of their own, the server's pid."""

    port: int = field(default_factory=free_port)
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="idem-faults-")))
    pid: int | None = None

    LOG: ClassVar[str] = "server.log"
    NAME: ClassVar[str]

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    @property
    def log_path(self) -> Path:
        return self.root / self.LOG

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def stop_for(self, seconds: float) -> None:
        """Down for ``seconds`` (from the stop's end to the start's), then up again."""
        self.stop()
        time.sleep(seconds)
        self.start()

    def destroy(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def log_tail(self) -> str:
        return _tail(self.log_path)


# PostgreSQL ----------------------------------------------------------------------------------


def postgresql_bin() -> Path:
    """PostgreSQL 15's programs (the release the issue measured); the newest one otherwise."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    preferred = [path for path in found if path.parts[-3] == "15"]
    if not (preferred or found):
        raise FaultHarnessError("PostgreSQL's initdb not found under /usr/lib/postgresql")
    return (preferred or found)[-1].parent


@dataclass
class PostgresCluster(_Server):
    """One cluster in a temporary folder, trust authentication, on ``port`` over TCP."""

    bin: Path = field(default_factory=postgresql_bin)
    #: Its streaming standby, made by :meth:`create` with ``replication``.
    standby: PostgresCluster | None = None
    #: The port a standby streams from: a proxy's, standing for the distance between two
    #: machines (:meth:`fail_over` has it pointed at the new primary); this one's otherwise.
    via: int | None = None

    NAME: ClassVar[str] = "postgresql"

    def destroy(self) -> None:
        try:
            super().destroy()
        finally:
            if self.standby is not None:
                self.standby.destroy()

    def url(self, port: int | None = None, database: str = DATABASE) -> str:
        """A ``DATABASE_URL`` (through ``port``, a proxy's, when given)."""
        return f"postgres://postgres@127.0.0.1:{port or self.port}/{database}"

    def _pg(self, program: str, *args: str, timeout: float = START_TIMEOUT) -> str:
        prefix, _ = _as_user("postgres")
        return _run([*prefix, str(self.bin / program), *args], program, timeout)

    def create(self, replication: str = "") -> None:
        """``initdb`` and start; then the database the app uses. With ``replication``
        (``"sync"`` or ``"async"``), a streaming standby first (:meth:`make_standby`), and for
        ``"sync"`` every commit waits until the standby has flushed it (``'*'``: whichever
        standby streams; copied into each standby, so a promoted one keeps the rule)."""
        _, user = _as_user("postgres")
        if user is not None:
            shutil.chown(self.root, user)
        self._pg("initdb", "-D", str(self.datadir), "--auth=trust", "-U", "postgres", "-E", "UTF8")
        with (self.datadir / "postgresql.conf").open("a") as conf:
            conf.write(
                f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.root}'\nmax_connections = 200\n"
                # A test cluster: no waiting for the disk.
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
                "shared_buffers = 32MB\n"
            )
            if replication:
                # A commit is acknowledged once it is in the primary's WAL (and, with "sync",
                # the standby's), as a deployment's would be: losses are replication's only.
                conf.write(
                    "wal_level = replica\nmax_wal_senders = 10\nmax_replication_slots = 10\n"
                    "wal_keep_size = 64MB\nhot_standby = on\nsynchronous_commit = on\n"
                    # A standby whose primary restarted streams again within 0.2 s, not 5 s.
                    "wal_retrieve_retry_interval = 200ms\n"
                )
                if replication == "sync":
                    conf.write("synchronous_standby_names = '*'\n")
        self.start()
        if replication:
            # Before any commit: with "sync", a commit waits for a standby.
            self.standby = self.make_standby()
        self.execute(f"CREATE DATABASE {DATABASE}", database="postgres")

    def make_standby(self) -> PostgresCluster:
        """A streaming standby of this primary: ``pg_basebackup -R`` (as ``postgres``) through
        a replication slot of its own, on a port and in a folder of its own, started, and
        streaming (synchronous, when the primary asks for it) before this returns."""
        standby = PostgresCluster(bin=self.bin, via=self.via)
        _, user = _as_user("postgres")
        if user is not None:
            shutil.chown(standby.root, user)
        # Slots are not copied to a standby: a promoted one has none, so the name is free.
        self._pg("pg_basebackup", "-h", "127.0.0.1", "-p", str(self.via or self.port),
                 "-U", "postgres", "-D", str(standby.datadir), "-R", "-X", "stream", "-c", "fast",
                 "-C", "-S", SLOT)  # fmt: skip
        with (standby.datadir / "postgresql.conf").open("a") as conf:
            conf.write(f"\nport = {standby.port}\nunix_socket_directories = '{standby.root}'\n")
        standby.start()
        self.wait_streaming()
        return standby

    def wait_streaming(self, timeout: float = START_TIMEOUT) -> None:
        """Until a standby streams from this primary (and is its synchronous one, when the
        primary has ``synchronous_standby_names``)."""
        deadline = time.monotonic() + timeout
        while True:
            names = self.setting("synchronous_standby_names")
            rows = self.execute("SELECT state, sync_state FROM pg_stat_replication",
                                database="postgres")  # fmt: skip
            if any(s == "streaming" and (sync == "sync" or not names) for s, sync in rows):
                return
            if time.monotonic() > deadline:
                raise FaultHarnessError(f"no standby streaming after {timeout}s: {rows}")
            time.sleep(0.05)

    def setting(self, name: str) -> str:
        return str(self.execute("SELECT current_setting(%s)", [name], database="postgres")[0][0])

    def synchronous(self, on: bool) -> None:
        """Commits wait for a standby (``synchronous_standby_names`` of ``postgresql.conf``)
        or not (``''``), from every new transaction on."""
        if on:
            self.execute("ALTER SYSTEM RESET synchronous_standby_names", database="postgres")
        else:
            self.execute("ALTER SYSTEM SET synchronous_standby_names = ''", database="postgres")
        self.execute("SELECT pg_reload_conf()", database="postgres")
        # The reload is asynchronous: wait until a new session sees it.
        deadline = time.monotonic() + 10
        while bool(self.setting("synchronous_standby_names")) != on:
            if time.monotonic() > deadline:
                raise FaultHarnessError(f"synchronous_standby_names not {on} after 10 s")
            time.sleep(0.05)

    def kill(self) -> None:
        """The primary's machine gone: SIGKILL the postmaster and every process of it at once
        (no shutdown: nothing more reaches a standby or a client)."""
        assert self.pid is not None
        pid, self.pid = self.pid, None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)  # it forks no more while its children are read
        children = _children(pid)
        for each in [pid, *children]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, signal.SIGKILL)
        for each in [pid, *children]:
            wait_gone(each, STOP_TIMEOUT)
        untrack(pid)

    def promote(self) -> None:
        """``pg_ctl promote``: this standby becomes a primary (on a new timeline)."""
        self._pg("pg_ctl", "promote", "-w", "-t", "60", "-D", str(self.datadir))

    def fail_over(
        self, pause: float, repoint: Callable[[int], None], sever: Callable[[], object] = list
    ) -> tuple[PostgresCluster, float, int]:
        """This primary cut off from its standby (``sever``: what was on its way to the
        standby is lost) and killed at once (:meth:`kill`), its standby promoted ``pause``
        seconds later (a failover manager's time to notice), ``repoint`` given the new
        primary's port (a proxy's upstream, an address moved: the app's, and :attr:`via`'s),
        this cluster's folder removed, and a fresh standby made of the new primary, so that
        another failover has a target. The new primary, when (``time.time()``) it was
        promoted and pointed at, and how many bytes of the WAL the primary had flushed (read
        just before the kill: a lower bound) the standby had not received when it was
        promoted: what asynchronous replication may lose.

        With synchronous replication the new primary commits alone until its new standby is
        synchronous, as Patroni's ``synchronous_mode`` does (its strict mode would refuse every
        commit meanwhile: they wait for a standby, and each one the app's bound gives up on
        keeps its session, until ``max_connections`` is reached): nothing is lost unless the
        new primary fails before then, which the nemesis never does, the failover's end
        being that moment."""
        standby, self.standby = self.standby, None
        assert standby is not None, "a failover needs a standby: create(replication=...)"
        flushed = self.execute("SELECT pg_current_wal_flush_lsn()::text", database="postgres")
        sever()
        self.kill()
        time.sleep(pause)
        behind = standby.execute(
            "SELECT pg_wal_lsn_diff(%s::pg_lsn, pg_last_wal_receive_lsn())::bigint",
            [flushed[0][0]],
            database="postgres",
        )[0][0]
        standby.promote()
        synchronous = bool(standby.setting("synchronous_standby_names"))
        if synchronous:
            standby.synchronous(False)
        repoint(standby.port)
        promoted = time.time()
        self.destroy()
        standby.standby = standby.make_standby()
        if synchronous:
            standby.synchronous(True)
            standby.wait_streaming()
        return standby, promoted, max(0, int(behind))

    def start(self) -> None:
        try:
            self._pg("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.datadir), "-l",
                     str(self.log_path))  # fmt: skip
        except FaultHarnessError as exc:
            raise FaultHarnessError(f"{exc}\nthe server's log:\n{self.log_tail()}") from None
        self.pid = int((self.datadir / "postmaster.pid").read_text().split()[0])
        track(self.pid, "postgres")

    def stop(self, mode: str = "fast") -> None:
        if self.pid is None:
            return
        pid = self.pid
        try:
            self._pg("pg_ctl", "stop", "-w", "-t", "30", "-m", mode, "-D", str(self.datadir))
        except (FaultHarnessError, subprocess.TimeoutExpired):
            end(pid)
        wait_gone(pid, STOP_TIMEOUT)
        untrack(pid)
        self.pid = None

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every connection dies, the server is back at once."""
        assert self.pid is not None
        untrack(self.pid)
        self._pg("pg_ctl", "restart", "-w", "-t", "60", "-m", "fast", "-D", str(self.datadir),
                 "-l", str(self.log_path))  # fmt: skip
        self.pid = int((self.datadir / "postmaster.pid").read_text().split()[0])
        track(self.pid, "postgres")

    def terminate_backends(self, database: str = DATABASE) -> int:
        """``pg_terminate_backend`` on every client backend of ``database``: how many."""
        rows = self.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
            [database],
            database="postgres",
        )
        return sum(1 for (done,) in rows if done)

    def read_only(self, on: bool) -> None:
        """Refuse writes in every new transaction (sessions pick the setting up at once)."""
        if on:
            self.execute("ALTER SYSTEM SET default_transaction_read_only = on", database="postgres")
        else:
            self.execute("ALTER SYSTEM RESET default_transaction_read_only", database="postgres")
        self.execute("SELECT pg_reload_conf()", database="postgres")
        # The reload is asynchronous: wait until a new session sees it.
        wanted = "on" if on else "off"
        deadline = time.monotonic() + 10
        while self.execute("SHOW default_transaction_read_only")[0][0] != wanted:
            if time.monotonic() > deadline:
                raise FaultHarnessError(f"default_transaction_read_only not {wanted} after 10 s")
            time.sleep(0.05)

    def connect(self, database: str = DATABASE, port: int | None = None) -> Any:
        """A connection of the suite's own (through ``port``, a proxy's, when given)."""
        import psycopg

        return psycopg.connect(
            host="127.0.0.1", port=port or self.port, user="postgres", dbname=database,
            autocommit=True, connect_timeout=5,
        )  # fmt: skip

    def execute(
        self,
        sql: str,
        params: list[Any] | None = None,
        *,
        database: str = DATABASE,
        port: int | None = None,
    ) -> list[tuple[Any, ...]]:
        with self.connect(database, port) as conn, conn.cursor() as cursor:
            cursor.execute(sql, params)
            return list(cursor.fetchall()) if cursor.description else []


# MariaDB -------------------------------------------------------------------------------------

MARIADBD = shutil.which("mariadbd", path="/usr/sbin:/usr/bin") or "mariadbd"
INSTALL_DB = shutil.which("mariadb-install-db") or "mariadb-install-db"


@dataclass
class MariaDBServer(_Server):
    """One ``mariadbd`` with its own data folder, socket, pid file and port; no option file."""

    LOG: ClassVar[str] = "server.err"
    NAME: ClassVar[str] = "mariadb"

    def url(self, port: int | None = None, database: str = DATABASE) -> str:
        """The app's ``DATABASE_URL`` (its own user; through ``port``, a proxy's, when given)."""
        return f"mysql://{APP_USER}:{APP_PASSWORD}@127.0.0.1:{port or self.port}/{database}"

    def _user_option(self) -> list[str]:
        _, user = _as_user("mysql")
        return [] if user is None else [f"--user={user}"]

    def create(self) -> None:
        _, user = _as_user("mysql")
        if user is not None:
            shutil.chown(self.root, user)
        _run(
            [INSTALL_DB, "--no-defaults", *self._user_option(), f"--datadir={self.datadir}",
             "--auth-root-authentication-method=normal", "--skip-test-db"],
            "mariadb-install-db",
        )  # fmt: skip
        self.start()
        for statement in (
            f"CREATE DATABASE {DATABASE} CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci",
            f"CREATE USER '{APP_USER}'@'127.0.0.1' IDENTIFIED BY '{APP_PASSWORD}'",
            f"GRANT ALL ON {DATABASE}.* TO '{APP_USER}'@'127.0.0.1'",
            # Django's test runner is not used: the suite migrates the database itself.
        ):
            self.execute(statement, database=None)

    def command(self) -> list[str]:
        return [
            MARIADBD, "--no-defaults", *self._user_option(), f"--datadir={self.datadir}",
            f"--socket={self.root / 'mariadbd.sock'}", f"--pid-file={self.root / 'mariadbd.pid'}",
            f"--log-error={self.log_path}", f"--port={self.port}", "--bind-address=127.0.0.1",
            "--skip-name-resolve", "--innodb-buffer-pool-size=64M", "--innodb-log-file-size=48M",
            "--innodb-flush-log-at-trx-commit=2", "--max-connections=300",
        ]  # fmt: skip

    def start(self) -> None:
        process = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.pid = process.pid
        track(self.pid, "mariadbd")
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if not alive(self.pid):
                raise FaultHarnessError(f"mariadbd exited at start:\n{self.log_tail()}")
            try:
                self.execute("SELECT 1", database=None)
                return
            except Exception as exc:
                if time.monotonic() > deadline:
                    raise FaultHarnessError(
                        f"mariadbd not up after {START_TIMEOUT}s ({exc}):\n{self.log_tail()}"
                    ) from exc
            time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM, as ``systemctl stop`` does: a clean shutdown."""
        if self.pid is not None:
            end(self.pid, grace=STOP_TIMEOUT)
            self.pid = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def terminate_backends(self, user: str = APP_USER) -> int:
        """``KILL CONNECTION`` on every connection of the app's user: how many."""
        killed = 0
        for (thread_id,) in self.execute(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = %s", [user]
        ):
            try:
                self.execute(f"KILL CONNECTION {int(thread_id)}")
                killed += 1
            except Exception as exc:  # it ended meanwhile: "Unknown thread id"
                if "Unknown thread id" not in str(exc):
                    raise
        return killed

    def read_only(self, on: bool) -> None:
        """``SET GLOBAL read_only``: it waits for transactions that hold write locks to end."""
        self.execute(f"SET GLOBAL read_only = {1 if on else 0}")

    def connect(self, database: str | None = DATABASE, port: int | None = None) -> Any:
        """A connection of the suite's own (through ``port``, a proxy's, when given)."""
        import MySQLdb

        extra = {"database": database} if database else {}
        return MySQLdb.connect(
            host="127.0.0.1", port=port or self.port, user="root", connect_timeout=5,
            autocommit=True, **extra,
        )  # fmt: skip

    def execute(
        self,
        sql: str,
        params: list[Any] | None = None,
        *,
        database: str | None = DATABASE,
        port: int | None = None,
    ) -> list[tuple[Any, ...]]:
        conn = self.connect(database, port)
        try:
            cursor = conn.cursor()
            cursor.execute(sql, params)
            return list(cursor.fetchall()) if cursor.description else []
        finally:
            conn.close()


# SQLite --------------------------------------------------------------------------------------

#: Takes the file's lock as an owner's write does (``SQLiteStore.owner_write``): tried every
#: half millisecond with no busy wait. Through SQLite's busy handler (tries 100 ms apart after
#: the first 228 ms) it once ended without the lock beside a crowd of writers (CI's fault leg;
#: its error was not kept, and losing hand-overs for its 30 s is the likeliest cause).
_LOCKER = """
import sqlite3, sys, time
connection = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=0)
deadline = time.monotonic() + 30
while True:
    try:
        connection.execute("BEGIN EXCLUSIVE")
        break
    except sqlite3.OperationalError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.0005)
print("locked", flush=True)
sys.stdin.read()  # until the harness closes our stdin
connection.execute("ROLLBACK")
"""


@dataclass
class SQLiteFile:
    """A SQLite database file, and another process that holds it with ``BEGIN EXCLUSIVE``."""

    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="idem-faults-sqlite-")))
    locker: subprocess.Popen[str] | None = None

    @property
    def path(self) -> Path:
        return self.root / "db.sqlite3"

    def url(self) -> str:
        return f"sqlite:///{self.path}"

    def lock(self) -> None:
        """Hold the file until :meth:`unlock`: every other connection's write (and read, in
        rollback-journal mode) waits for its busy timeout, then fails."""
        assert self.locker is None
        self.locker = subprocess.Popen(
            [sys.executable, "-c", _LOCKER, str(self.path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        track(self.locker.pid, "sqlite locker")
        assert self.locker.stdout is not None and self.locker.stderr is not None
        line = self.locker.stdout.readline()  # it blocks until the lock is taken
        if line.strip() != "locked":
            errors = self.locker.stderr
            self.unlock()
            raise FaultHarnessError(f"the SQLite locker did not lock: {line!r} {errors.read()}")

    def unlock(self) -> None:
        if self.locker is None:
            return
        locker, self.locker = self.locker, None
        assert locker.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            locker.stdin.close()
        try:
            locker.wait(timeout=10)
        except subprocess.TimeoutExpired:
            locker.kill()
            locker.wait(timeout=10)
        untrack(locker.pid)

    def execute(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        import sqlite3

        conn = sqlite3.connect(self.path, timeout=30)
        try:
            return list(conn.execute(sql, params or []).fetchall())
        finally:
            conn.close()

    def destroy(self) -> None:
        try:
            self.unlock()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
