"""Database servers of a test's own, to restart, stop and make read-only (issue 25).

The machine's shared servers are never restarted: each server here is made in a temporary
directory (``initdb`` run as the ``postgres`` user; ``mariadb-install-db``), listens on its own
port on loopback, and is stopped and removed at the end. The ports are this branch's range
(``IDEMPOTENCY_FAULT_PORT``, 56000 by default). :func:`register` adds a database alias for it
to Django's connections at run time, with the app's table migrated, so that a test can make it
the idempotency store.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from django.core.management import call_command
from django.db import connections

#: The first of this suite's ports; each server takes the next free one.
BASE_PORT = int(os.environ.get("IDEMPOTENCY_FAULT_PORT", "56000"))
PG_BIN = Path(os.environ.get("IDEMPOTENCY_PG_BIN", "/usr/lib/postgresql/15/bin"))
START_TIMEOUT = 60


def _port_free(port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port(offset: int) -> int:
    for port in range(BASE_PORT + offset, BASE_PORT + 100):
        if _port_free(port):
            return port
    raise RuntimeError(f"no free port in {BASE_PORT}-{BASE_PORT + 99}")


def _as_user(user: str, command: list[str]) -> list[str]:
    """Run as ``user`` when we are root (PostgreSQL and MariaDB refuse to run as root)."""
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", user, "--", *command]


def available() -> str | None:
    """Why these servers cannot be made here (``None``: they can)."""
    if not (PG_BIN / "initdb").exists():
        return f"no initdb in {PG_BIN}"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "no runuser to drop root"
    return None


class Server:
    """A server of our own: what the fault tests do to it."""

    vendor = ""
    port = 0
    directory: Path

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def restart(self) -> None:
        self.stop()
        self.start()

    def settings(self, database: str) -> dict[str, Any]:
        raise NotImplementedError

    def set_read_only(self, on: bool) -> None:
        """Every session refuses writes (on) or takes them again (off), without a restart."""
        raise NotImplementedError

    def terminate_others(self, database: str) -> int:
        """End every other session on ``database``; returns how many."""
        raise NotImplementedError

    @contextmanager
    def down_for(self, seconds: float) -> Iterator[threading.Thread]:
        """Stop now, start again ``seconds`` later in a thread (joined when the block ends)."""
        self.stop()
        thread = threading.Thread(target=lambda: (time.sleep(seconds), self.start()))
        thread.start()
        try:
            yield thread
        finally:
            thread.join(START_TIMEOUT)

    def admin(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        """Run one statement on a connection of its own, as the server's superuser."""
        raise NotImplementedError

    def remove(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)


class PostgreSQLCluster(Server):
    vendor = "postgresql"

    def __init__(self) -> None:
        self.port = _free_port(0)
        self.directory = Path(tempfile.mkdtemp(prefix="idempotency-pg-"))
        os.chmod(self.directory, 0o755)
        self.data = self.directory / "data"
        self.data.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.directory, "postgres")
            shutil.chown(self.data, "postgres")
        self._run(["initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"])
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                f"port = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.directory}'\nfsync = off\n"
                "synchronous_commit = off\nfull_page_writes = off\nshared_buffers = 16MB\n"
                "max_connections = 40\n"
            )
        self.start()

    def _run(self, command: list[str]) -> None:
        command = [str(PG_BIN / command[0]), *command[1:]]
        subprocess.run(
            _as_user("postgres", command), check=True, capture_output=True, timeout=START_TIMEOUT
        )

    def start(self) -> None:
        log = self.directory / "server.log"
        self._run(["pg_ctl", "-D", str(self.data), "-l", str(log), "-w", "start"])

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(["pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop"])

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every session is ended, the server back at once."""
        log = self.directory / "server.log"
        self._run(["pg_ctl", "-D", str(self.data), "-l", str(log), "-m", "fast", "-w", "restart"])

    def settings(self, database: str) -> dict[str, Any]:
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": database,
            "USER": "postgres",
            "HOST": "127.0.0.1",
            "PORT": str(self.port),
        }

    def admin(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        import psycopg

        dsn = f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"
        with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as connection:
            connection.execute("SET default_transaction_read_only = off")  # the admin writes
            cursor = connection.execute(sql, params)  # type: ignore[arg-type]
            return list(cursor.fetchall()) if cursor.description else []

    def set_read_only(self, on: bool) -> None:
        """``default_transaction_read_only`` for the whole server, reloaded: a session that
        did not set it itself takes it at its next statement (as after a failover to a
        standby, or an operator's read-only spell)."""
        self.admin(f"ALTER SYSTEM SET default_transaction_read_only = {'on' if on else 'off'}")
        self.admin("SELECT pg_reload_conf()")
        # The reload is a signal each backend handles before its next statement: wait until a
        # new session sees it.
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            rows = self.admin(
                "SELECT reset_val FROM pg_settings WHERE name = %s",
                ["default_transaction_read_only"],
            )
            if rows[0][0] == ("on" if on else "off"):
                time.sleep(0.1)
                return
            time.sleep(0.05)

    def terminate_others(self, database: str) -> int:
        rows = self.admin(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            [database],
        )
        return int(rows[0][0])


class MariaDBServer(Server):
    vendor = "mysql"

    def __init__(self) -> None:
        self.port = _free_port(10)
        self.directory = Path(tempfile.mkdtemp(prefix="idempotency-mariadb-"))
        os.chmod(self.directory, 0o755)
        self.data = self.directory / "data"
        self.socket = self.directory / "mysqld.sock"
        self.process: subprocess.Popen[bytes] | None = None
        if os.geteuid() == 0:
            shutil.chown(self.directory, "mysql")
        subprocess.run(
            [
                "mariadb-install-db",
                "--no-defaults",
                f"--datadir={self.data}",
                "--user=mysql",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            check=True,
            capture_output=True,
            timeout=START_TIMEOUT * 2,
        )
        self.start()

    def start(self) -> None:
        with open(self.directory / "server.log", "ab") as log:
            self.process = self._spawn(log)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError((self.directory / "server.log").read_text(errors="replace"))
            try:
                self.admin("SELECT 1")
                return
            except Exception:
                time.sleep(0.1)
        raise RuntimeError("mariadbd did not start")

    def _spawn(self, log: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                "mariadbd",
                "--no-defaults",
                f"--datadir={self.data}",
                f"--port={self.port}",
                f"--socket={self.socket}",
                "--bind-address=127.0.0.1",
                "--user=mysql",
                "--skip-name-resolve",
                "--innodb-buffer-pool-size=16M",
                "--innodb-flush-log-at-trx-commit=0",
                "--skip-log-bin",
                f"--pid-file={self.directory / 'mysqld.pid'}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(START_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(START_TIMEOUT)

    def settings(self, database: str) -> dict[str, Any]:
        return {
            "ENGINE": "django.db.backends.mysql",
            "NAME": database,
            "USER": "app",  # no global privilege: read_only holds for it
            "PASSWORD": "app",
            "HOST": "127.0.0.1",
            "PORT": str(self.port),
            "OPTIONS": {"charset": "utf8mb4"},
        }

    def admin(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        import MySQLdb

        connection = MySQLdb.connect(
            host="127.0.0.1", port=self.port, user="root", connect_timeout=5, autocommit=True
        )
        try:
            cursor = connection.cursor()
            cursor.execute(sql, params)
            return list(cursor.fetchall()) if cursor.description else []
        finally:
            connection.close()

    def set_read_only(self, on: bool) -> None:
        """``read_only``: every session without ``READ ONLY ADMIN`` (the app's) refuses
        writes with error 1290, existing sessions included."""
        self.admin(f"SET GLOBAL read_only = {'ON' if on else 'OFF'}")

    def terminate_others(self, database: str) -> int:
        rows = self.admin(
            "SELECT id FROM information_schema.processlist WHERE db = %s AND id <> CONNECTION_ID()",
            [database],
        )
        for (pid,) in rows:
            with suppress(Exception):  # already gone
                self.admin(f"KILL CONNECTION {int(pid)}")
        return len(rows)


def make(vendor: str) -> Server:
    return PostgreSQLCluster() if vendor == "postgresql" else MariaDBServer()


def register(alias: str, server: Server, database: str, **extra: Any) -> None:
    """Add ``alias`` (a new database on ``server``) to Django's connections, migrated."""
    if server.vendor == "postgresql":
        server.admin(f'CREATE DATABASE "{database}"')
    else:
        server.admin(f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4")
        server.admin("CREATE USER IF NOT EXISTS 'app'@'%' IDENTIFIED BY 'app'")
        server.admin(f"GRANT ALL PRIVILEGES ON `{database}`.* TO 'app'@'%'")
    settings = {
        "default": connections.settings["default"],
        alias: {**server.settings(database), **extra},
    }
    connections.settings[alias] = connections.configure_settings(settings)[alias]
    call_command("migrate", "django_idempotency", database=alias, verbosity=0)


def unregister(alias: str) -> None:
    if alias in connections.settings:
        connections[alias].close()
        del connections.settings[alias]
        with suppress(AttributeError):
            delattr(connections._connections, alias)
