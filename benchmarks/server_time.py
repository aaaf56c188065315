#!/usr/bin/env python
"""The database server's side of each path: its statements, and the time each one takes.

``benchmarks/instructions.py`` counts the app's process; the server is another process. This
script runs the wall-clock benchmark's paths (``benchmarks/overhead_project/``: bare, ours in
two-phase and atomic mode, first executions and replays, and drf-idempotency's when it is
installed), each ``--requests`` times, and reports per request, for each path, every statement
it sent and the time it took:

- **on PostgreSQL, the server's own time**, from ``pg_stat_statements`` (planning and execution,
  ``track = all`` also shows the statements inside the claim function), when the server has
  the extension loaded (``shared_preload_libraries``; the script creates the extension in its
  own database). ``--private-cluster DIR`` starts a PostgreSQL of its own for that (``initdb``
  as the ``postgres`` user, ``--port``), with the extension loaded and
  ``pg_stat_statements.track_planning`` on, and stops it at the end;
- **everywhere, the time as the client sees it**: each statement timed around the driver's
  call in Django's cursor (an ``execute_wrapper``), with ``BEGIN``/``COMMIT`` timed apart. That
  is the server's time plus a round trip and the driver's work, so a round trip (``SELECT 1``)
  is timed too.

Run from the repository root, in the instruction benchmark's environment (the peer installed)::

    python3.11 benchmarks/instructions.py --server postgres://postgres@127.0.0.1:5432/test
    /tmp/django-idempotency-instructions-py3.11/bin/python benchmarks/server_time.py \\
        --private-cluster /tmp/bench-pg --port 27642
    /tmp/django-idempotency-instructions-py3.11/bin/python benchmarks/server_time.py \\
        --server mysql://root@127.0.0.1:3306/test

``--auth lazy`` reads the user only when something reads ``request.user`` (see
``overhead.py --auth``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.databases import create_database, drop_database, is_mysql  # noqa: E402
from benchmarks.instructions import uptime  # noqa: E402

#: Each path: its name, its URL, and its key: fresh (a first execution), the previous path's
#: (its replay), or none.
PATHS = [
    ("bare", "/bare/", None),
    ("two-phase first", "/two-phase/", "first"),
    ("two-phase replay", "/two-phase/", "replay"),
    ("atomic first", "/atomic/", "first"),
    ("atomic replay", "/atomic/", "replay"),
]
PEER_PATHS = [
    ("peer two-phase first", "/peer-two-phase/", "first"),
    ("peer two-phase replay", "/peer-two-phase/", "replay"),
    ("peer atomic first", "/peer-atomic/", "first"),
    ("peer atomic replay", "/peer-atomic/", "replay"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--server",
        default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
        help="a PostgreSQL or MySQL URL (default: DATABASE_URL)",
    )
    parser.add_argument("--database", default="bench_server_time", help="created, then dropped")
    parser.add_argument("--requests", type=int, default=200, help="requests per path")
    parser.add_argument("--auth", choices=["eager", "lazy"], default="eager")
    parser.add_argument(
        "--private-cluster",
        type=Path,
        metavar="DIR",
        help="start a PostgreSQL of its own in DIR (initdb), pg_stat_statements loaded",
    )
    parser.add_argument("--port", type=int, default=27642, help="the private cluster's port")
    args = parser.parse_args()
    if not args.database.isidentifier():
        parser.error("--database must be a plain identifier")
    os.environ["BENCH_AUTH"] = args.auth
    with private_cluster(args) as server:
        bench_url = urlunsplit(urlsplit(server)._replace(path=f"/{args.database}"))
        create_database(server, args.database)
        try:
            os.environ["BENCH_DATABASE_URL"] = bench_url
            os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.overhead_project.settings"
            run(args, bench_url)
        finally:
            from django.db import connections

            connections.close_all()
            drop_database(server, args.database)


@contextmanager
def private_cluster(args: argparse.Namespace) -> Iterator[str]:
    """The server to use: ``--server``, or a cluster of its own (``--private-cluster``)."""
    if args.private_cluster is None:
        yield args.server
        return
    bin_dir = _postgresql_bin()
    data = args.private_cluster
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_postgres:
        shutil.chown(data, "postgres", "postgres")
    subprocess.run(
        [*as_postgres, str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    options = (
        f"-p {args.port} -k {data} -c listen_addresses=127.0.0.1 "
        "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all "
        "-c pg_stat_statements.track_planning=on -c pg_stat_statements.track_utility=on"
    )
    ctl = [*as_postgres, str(bin_dir / "pg_ctl"), "-D", str(data)]
    subprocess.run(
        [*ctl, "-o", options, "-l", str(data / "log"), "-w", "start"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    try:
        yield f"postgres://postgres@127.0.0.1:{args.port}/postgres"
    finally:
        subprocess.run([*ctl, "-m", "fast", "-w", "stop"], check=False, stdout=subprocess.DEVNULL)
        shutil.rmtree(data, ignore_errors=True)


def _postgresql_bin() -> Path:
    found = shutil.which("pg_config")
    if found:
        bindir = subprocess.run([found, "--bindir"], capture_output=True, text=True).stdout
        if Path(bindir.strip(), "initdb").exists():
            return Path(bindir.strip())
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "initdb").exists():
            return candidate
    raise SystemExit("initdb not found (Debian: apt-get install postgresql)")


def run(args: argparse.Namespace, bench_url: str) -> None:
    import django
    from django.core.management import call_command
    from django.db import connection

    django.setup()
    from django.contrib.auth.models import User

    from benchmarks.overhead import USER, has_peer, wsgi_call

    call_command("migrate", verbosity=0)
    User.objects.create(username=USER)
    paths = PATHS + (PEER_PATHS if has_peer() else [])
    with connection.cursor() as cursor:
        cursor.execute("SELECT version()")
        (version,) = cursor.fetchone()
    print("# Server time per statement, per path")
    print(f"{version.split(',')[0]}; {args.requests} requests per path; auth {args.auth}")
    print(f"uptime: {uptime()}")
    print()

    def keys(kind: str | None, previous: list[str | None]) -> list[str | None]:
        if kind is None:
            return [None] * args.requests
        return previous if kind == "replay" else [str(uuid.uuid4()) for _ in range(args.requests)]

    def send(path: str, these: list[str | None]) -> None:
        for key in these:
            status = wsgi_call(path, key)
            assert status == 201, f"{path}: {status}"

    warm: list[str | None] = []
    for _, path, kind in paths:
        warm = keys(kind, warm)
        send(path, warm[:20])
    stats = _pg_stat_statements() if connection.vendor == "postgresql" else None
    if connection.vendor == "postgresql" and stats is None:
        print("pg_stat_statements is not loaded on this server: client-side times only")
        print("(--private-cluster DIR starts a server of its own with it).")
        print()
    print(f"round trip (SELECT 1), client side: {_round_trip():.3f} ms")
    print()
    client_count = max(1, args.requests // 4)
    previous: list[str | None] = []  # the server pass's keys of the path before
    previous_client: list[str | None] = []  # the client pass's
    for name, path, kind in paths:
        these = keys(kind, previous)
        these_client = (
            previous_client if kind == "replay" else keys(kind, previous_client)[:client_count]
        )
        with client_timed() as timed:
            send(path, these_client)
        if stats is not None:
            stats.reset()
        send(path, these)
        previous, previous_client = these, these_client
        print(f"## {name} ({path})")
        print("client side (the driver's call, Django's cursor):")
        _print_client(timed, client_count)
        if stats is not None:
            print("server side (pg_stat_statements; planning + execution, ms per request):")
            stats.show(args.requests)
        print()


@contextmanager
def client_timed() -> Iterator[dict[str, list[float]]]:
    """Each statement's time around the driver's call, and each commit's, by statement text."""
    from django.db import connection

    timed: dict[str, list[float]] = defaultdict(list)

    def wrapper(execute: Callable[..., Any], sql: str, *args: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, *args)
        finally:
            timed[_short(sql)].append((time.perf_counter() - started) * 1000)

    original_commit = connection._commit
    original_begin = connection._set_autocommit

    def commit() -> None:
        started = time.perf_counter()
        original_commit()
        timed["COMMIT"].append((time.perf_counter() - started) * 1000)

    def set_autocommit(autocommit: bool) -> None:
        started = time.perf_counter()
        original_begin(autocommit)
        if connection.vendor == "mysql":  # SET autocommit: a round trip on MySQL
            timed[f"SET autocommit={int(autocommit)}"].append(
                (time.perf_counter() - started) * 1000
            )

    connection._commit = commit  # type: ignore[method-assign]
    connection._set_autocommit = set_autocommit  # type: ignore[method-assign]
    try:
        with connection.execute_wrapper(wrapper):
            yield timed
    finally:
        connection._commit = original_commit  # type: ignore[method-assign]
        connection._set_autocommit = original_begin  # type: ignore[method-assign]


def _print_client(timed: dict[str, list[float]], requests: int) -> None:
    total = 0.0
    for sql, values in timed.items():
        per_request = len(values) / requests
        median = statistics.median(values)
        total += median * per_request
        print(f"  {per_request:4.1f} x {median:7.3f} ms  {sql}")
    print(
        f"  total {total:.3f} ms per request "
        "(on PostgreSQL psycopg sends BEGIN before a transaction's first statement, in its time)"
    )


class _Stats:
    def __init__(self) -> None:
        from django.db import connection

        self.connection = connection

    def reset(self) -> None:
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_statements_reset()")

    def show(self, requests: int) -> None:
        with self.connection.cursor() as cursor:
            cursor.execute(
                "SELECT query, calls, total_plan_time, total_exec_time, toplevel "
                "FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database "
                "WHERE datname = current_database()) AND query NOT LIKE '%pg_stat_statements%' "
                "ORDER BY toplevel DESC, total_exec_time DESC"
            )
            found = cursor.fetchall()
        # Each savepoint has a name of its own: counted together, as one statement.
        merged: dict[tuple[str, bool], list[float]] = {}
        for query, calls, plan, execution, toplevel in found:
            sums = merged.setdefault((_short(query), toplevel), [0, 0.0, 0.0])
            sums[0] += calls
            sums[1] += plan
            sums[2] += execution
        total = 0.0
        for (query, toplevel), (calls, plan, execution) in merged.items():
            if calls < requests / 2:
                continue  # the warm-up's or the reset's
            per_request = calls / requests
            each = (plan + execution) / calls
            if toplevel:
                total += each * per_request
            where = "" if toplevel else " (inside the function)"
            print(
                f"  {per_request:4.1f} x {each:7.3f} ms (plan {plan / calls:.3f}, "
                f"run {execution / calls:.3f}){where}  {query}"
            )
        print(f"  total {total:.3f} ms per request (statements sent by the client)")


def _pg_stat_statements() -> _Stats | None:
    from django.db import DatabaseError, connection

    try:
        with connection.cursor() as cursor:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            cursor.execute("SELECT pg_stat_statements_reset()")
    except DatabaseError:
        connection.close()
        return None
    return _Stats()


def _round_trip() -> float:
    from django.db import connection

    values = []
    with connection.cursor() as cursor:
        for _ in range(200):
            started = time.perf_counter()
            cursor.execute("SELECT 1")
            cursor.fetchone()
            values.append((time.perf_counter() - started) * 1000)
    return statistics.median(values)


def _short(sql: str) -> str:
    """A statement on one line: its head and its tail (where two reads of the record differ),
    savepoints' names left out (each has its own)."""
    text = re.sub(r'(SAVEPOINT [`"]?)s\d+_x\d+', r"\1…", " ".join(sql.split()))
    return text if len(text) <= 110 else f"{text[:55]} … {text[-50:]}"


if __name__ == "__main__":
    if is_mysql(sys.argv[-1]) and "--private-cluster" in sys.argv:
        raise SystemExit("--private-cluster starts PostgreSQL: not with a mysql:// server")
    main()
