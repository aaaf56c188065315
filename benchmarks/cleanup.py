"""Benchmark: ``idempotency_cleanup`` on a million expired rows, and claims running meanwhile.

A script, not a test: it prints figures and asserts nothing. It creates its own PostgreSQL or
MySQL/MariaDB database (``bench_cleanup`` by default), drops it at the end, and reports:

* the claim's latency with 10,000 rows in the table and with 1,000,000 (goal: flat);
* cleanup rows per second (goal: at least 50,000) and its longest single statement;
* the p99 latency of a stream of claims while the cleanup runs, against the same stream
  without it (goal: a ratio of at most 2). The two alternate in ``--rounds`` rounds (each
  cleanup run deleting its share with ``--limit``), so that the noise of a shared machine
  falls on both alike.

The claim stream runs in a process of its own (an app server), sequentially, one autocommit
claim of a fresh key after another.

    python benchmarks/cleanup.py --url postgres://postgres@127.0.0.1:5432/test
    python benchmarks/cleanup.py --url mysql://root@127.0.0.1:3306/test
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dj_database_url

from benchmarks.databases import create_database, drop_database, is_mysql


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url",
        default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"),
        help="Any database on the server; the benchmark creates its own next to it.",
    )
    parser.add_argument("--name", default="bench_cleanup", help="The database to create.")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--small", type=int, default=10_000, help="Rows for the flat check.")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--sleep", type=float, default=0.0, help="The cleanup's --sleep.")
    parser.add_argument("--rounds", type=int, default=5, help="Alternations with/without.")
    parser.add_argument("--claims", type=int, default=3000, help="Claims per latency sample.")
    return parser.parse_args()


def setup_django(url: str) -> None:
    import django
    from django.conf import settings

    settings.configure(
        DATABASES={"default": dj_database_url.parse(url)},
        INSTALLED_APPS=["django_idempotency"],
        USE_TZ=True,
        TIME_ZONE="UTC",
        LOGGING_CONFIG=None,
    )
    django.setup()


FILL_SQL = """
INSERT INTO django_idempotency_idempotencykey
    (scope, key_hash, method, path, request_hash, status, response_status, response_headers,
     response_body, recovery_point, lock_token, attempt, created_at, updated_at, unlock_at,
     expires_at)
SELECT 'user:' || (i %% 5000), encode(sha256(('bench-' || i)::bytea), 'hex'), 'POST',
       '/orders/', encode(sha256(('body-' || i)::bytea), 'hex'), 'completed', 201,
       '[["Content-Type", "application/json"]]'::jsonb, convert_to('{"id": ' || i || '}', 'UTF8'),
       '', NULL, 1, e - interval '24 hours', e - interval '24 hours', NULL, e
FROM (
    SELECT i, now() - interval '20 hours' + i * interval '50 milliseconds' AS e
    FROM generate_series(%s, %s) AS i
) AS rows
"""

#: The same rows on MySQL/MariaDB: numbers from six cross-joined digit tables (no
#: generate_series), times in UTC as Django stores them.
_DIGITS = (
    "(SELECT 0 AS d UNION ALL " + " UNION ALL ".join(f"SELECT {n}" for n in range(1, 10)) + ")"
)
FILL_SQL_MYSQL = f"""
INSERT INTO django_idempotency_idempotencykey
    (scope, key_hash, method, path, request_hash, status, response_status, response_headers,
     response_body, recovery_point, lock_token, attempt, created_at, updated_at, unlock_at,
     expires_at)
SELECT CONCAT('user:', i MOD 5000), SHA2(CONCAT('bench-', i), 256), 'POST',
       '/orders/', SHA2(CONCAT('body-', i), 256), 'completed', 201,
       '[["Content-Type", "application/json"]]', CONCAT('{{"id": ', i, '}}'),
       '', NULL, 1, e - INTERVAL 24 HOUR, e - INTERVAL 24 HOUR, NULL, e
FROM (
    SELECT i, UTC_TIMESTAMP(6) - INTERVAL 20 HOUR + INTERVAL (i * 50000) MICROSECOND AS e
    FROM (
        SELECT %s + d0.d + 10 * d1.d + 100 * d2.d + 1000 * d3.d + 10000 * d4.d
            + 100000 * d5.d AS i
        FROM {_DIGITS} AS d0, {_DIGITS} AS d1, {_DIGITS} AS d2, {_DIGITS} AS d3,
            {_DIGITS} AS d4, {_DIGITS} AS d5
    ) AS numbers
    WHERE i <= %s
) AS rows_
"""


def fill(first: int, last: int) -> float:
    from django.db import connection

    started = time.perf_counter()
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":  # at most a million rows a statement
            for start in range(first, last + 1, 1_000_000):
                cursor.execute(FILL_SQL_MYSQL, [start, min(last, start + 999_999)])
            cursor.execute("ANALYZE TABLE django_idempotency_idempotencykey")
            cursor.fetchall()
            return time.perf_counter() - started
        cursor.execute(FILL_SQL, [first, last])
        cursor.execute("VACUUM ANALYZE django_idempotency_idempotencykey")
        cursor.execute("CHECKPOINT")  # the fill's writes are flushed before anything is timed
    return time.perf_counter() - started


def claim(alias: str, key_hash: str, scope: str) -> Any:
    """One claim of ``key_hash`` through the database ``alias``, as a ``POST`` would make it."""
    from django_idempotency import _store as store
    from django_idempotency._call.identity import Identity

    identity = Identity(
        key="",
        scope=scope,
        key_hash=key_hash,
        fingerprint=key_hash,
        method="POST",
        path="/orders/",
    )
    return store.using(alias).claim(
        identity, ttl=timedelta(hours=24), lock_timeout=timedelta(minutes=1)
    )


def claim_stream(count: int | None, stop: Any, results: Any) -> None:
    """In a child process: claim fresh keys one after another, timing each claim."""
    from django.db import connections

    from django_idempotency import Claim

    connections.close_all()  # never share the parent's socket
    latencies: list[float] = []
    while (count is None and not stop.is_set()) or (count is not None and len(latencies) < count):
        key_hash = hashlib.sha256(uuid.uuid4().bytes).hexdigest()
        started = time.perf_counter()
        claimed = claim("default", key_hash, "bench:stream")
        latencies.append(time.perf_counter() - started)
        assert isinstance(claimed, Claim)
    connections.close_all()
    results.put(latencies)


def run_stream(
    count: int | None, during: Callable[[], Any] | None = None
) -> tuple[list[float], Any]:
    from django.db import connections

    connections.close_all()
    context = multiprocessing.get_context("fork")
    stop, results = context.Event(), context.Queue()
    child = context.Process(target=claim_stream, args=(count, stop, results))
    child.start()
    outcome = None
    if during is not None:
        time.sleep(0.5)  # the stream is warm before the cleanup starts
        outcome = during()
        stop.set()
    latencies = results.get(timeout=600)
    child.join(timeout=60)
    return latencies, outcome


def summary(latencies: list[float]) -> str:
    ms = sorted(value * 1000 for value in latencies)
    p50 = statistics.median(ms)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"n={len(ms)} p50={p50:.2f} ms p99={p99:.2f} ms max={ms[-1]:.2f} ms"


def p99(latencies: list[float]) -> float:
    ms = sorted(latencies)
    return ms[min(len(ms) - 1, int(len(ms) * 0.99))] * 1000


def timed_cleanup(batch_size: int, sleep: float, limit: int) -> dict[str, Any]:
    from django.core.management import call_command
    from django.db import connection

    longest = [0.0, ""]
    durations: list[float] = []

    def timer(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            elapsed = time.perf_counter() - started
            if not sql.startswith("SET"):
                durations.append(elapsed)
            if elapsed > longest[0]:
                longest[:] = [elapsed, sql.split()[0]]

    out = StringIO()
    started = time.perf_counter()
    with connection.execute_wrapper(timer):
        call_command(
            "idempotency_cleanup", batch_size=batch_size, sleep=sleep, limit=limit, stdout=out
        )
    elapsed = time.perf_counter() - started
    connection.close()
    return {
        "elapsed": elapsed,
        "longest": longest,
        "durations": durations,
        "output": out.getvalue().strip(),
    }


def main() -> None:
    args = parse_args()
    admin_url = args.url
    bench_url = dj_database_url.parse(admin_url)
    mysql = is_mysql(admin_url)
    scheme = "mysql" if mysql else "postgres"
    bench = f"{scheme}://{bench_url['USER']}@{bench_url['HOST']}:{bench_url['PORT']}/{args.name}"
    create_database(admin_url, args.name)
    try:
        setup_django(bench)
        from django.core.management import call_command
        from django.db import connection, connections

        call_command("migrate", verbosity=0)
        with connection.cursor() as cursor:
            cursor.execute("SELECT VERSION()" if mysql else "SHOW server_version")
            version = cursor.fetchone()[0]
        print(
            f"{'MySQL/MariaDB' if mysql else 'PostgreSQL'} {version}, {os.cpu_count()} CPUs; "
            f"idempotency_cleanup --batch-size {args.batch_size} --sleep {args.sleep}"
        )

        seconds = fill(1, args.small)
        print(f"filled {args.small:,} expired rows in {seconds:.1f} s")
        small, _ = run_stream(args.claims)
        print(f"claims, {args.small:,} rows in the table: {summary(small)}")

        seconds = fill(args.small + 1, args.rows)
        print(f"filled up to {args.rows:,} expired rows in {seconds:.1f} s")
        large, _ = run_stream(args.claims)
        print(f"claims, {args.rows:,} rows in the table:  {summary(large)}")
        print(
            "claim latency ratio, large/small table: "
            f"p50 {statistics.median(large) / statistics.median(small):.2f}, "
            f"p99 {p99(large) / p99(small):.2f}"
        )

        # The shared machine's noise drifts, so "with" and "without" alternate: each round is a
        # stream alone, then the same stream while the cleanup deletes a slice of the rows.
        without: list[float] = []
        during: list[float] = []
        deleted = 0
        elapsed = 0.0
        longest = [0.0, ""]
        statements: list[float] = []
        slice_size = -(-args.rows // args.rounds)
        for _round in range(args.rounds):
            alone, _ = run_stream(args.claims // args.rounds)
            without += alone
            with_cleanup, cleanup = run_stream(
                None, lambda: timed_cleanup(args.batch_size, args.sleep, slice_size)
            )
            during += with_cleanup
            final = next(
                line for line in cleanup["output"].splitlines() if line.startswith("Deleted ")
            )
            deleted += int(final.split()[1])
            elapsed += cleanup["elapsed"]
            longest = max(longest, cleanup["longest"])
            statements += cleanup["durations"]
        print(f"claims without cleanup ({args.rounds} rounds): {summary(without)}")
        print(f"claims during the cleanup:           {summary(during)}")
        print(f"p99 ratio with/without cleanup: {p99(during) / p99(without):.2f}")
        print(
            f"cleanup rows per second: {deleted / elapsed:,.0f} "
            f"({deleted:,} rows in {elapsed:.1f} s, {args.rounds} runs of --limit {slice_size})"
        )
        print(f"cleanup statements: {summary(statements)}")
        print(f"longest single statement: {longest[0] * 1000:.1f} ms ({longest[1]})")
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM django_idempotency_idempotencykey WHERE expires_at <= "
                + ("UTC_TIMESTAMP(6)" if mysql else "now()")
            )
            print(f"expired rows left: {cursor.fetchone()[0]}")
        connections.close_all()
    finally:
        drop_database(admin_url, args.name)


if __name__ == "__main__":
    main()
