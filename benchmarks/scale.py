#!/usr/bin/env python
"""What the protection costs as the work grows: table size, cleanup under traffic, churn over
days, concurrency (``docs/scale.rst``).

Run on demand, never in CI: a part fills tens of millions of rows. Each part creates its own
database (``bench_scale``) on the server given, and drops it at the end (``--keep`` leaves it).
Every figure line ends with the load average at the time (``load 1.20``), since the machine's
other work moves the tails. The view is the overhead benchmark's (``benchmarks/overhead_project``:
authenticate by one query, parse a JSON body, insert a row, render it; keys per user).

Parts (give one or more, in order)::

    latency      first executions, replays and the bare view, interleaved in one process, with
                 the table filled to each of --sizes finished records (expiry spread over a day)
    outbox       the relay's take and the cleanup's pass over delivered messages, with the
                 outbox holding --messages sent messages
    cleanup      idempotency_cleanup (a subprocess, as cron runs it) deleting --expired expired
                 records while gunicorn serves --rate keyed requests a second; lock waits; on
                 PostgreSQL, what dropping a day's partition of the same rows would cost. With
                 --cleanup-args given more than once, its variants alternate, side by side
    churn        --days simulated days of --per-day records (a day lasts --day-seconds), claimed
                 then completed then expired and cleaned up hourly, with PostgreSQL's default
                 autovacuum and with the table settings docs/scale.rst recommends, side by side
    throughput   gunicorn (threads) and uvicorn (the async view): requests/s bare, first
                 executions and replays at each of --connections; one hot key hit by 100 clients
    redis        the Redis store's memory per record (--redis)

    python benchmarks/scale.py --server postgres://postgres@127.0.0.1:5432/postgres latency
    python benchmarks/scale.py --server mysql://root@127.0.0.1:3306/test cleanup throughput
    python benchmarks/scale.py --redis redis://127.0.0.1:6379/0 redis
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.databases import create_database, drop_database  # noqa: E402
from benchmarks.overhead import (  # noqa: E402
    BODY,
    USER,
    free_port,
    no_control_socket,
    wsgi_call,
)

PARTS = ("latency", "outbox", "cleanup", "churn", "throughput", "redis")
TABLE = "django_idempotency_idempotencykey"
OUTBOX = "django_idempotency_outboxmessage"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("parts", nargs="+", choices=PARTS)
    parser.add_argument(
        "--server",
        default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
        help="a PostgreSQL or MySQL URL whose server gets the benchmark database",
    )
    parser.add_argument("--database", default="bench_scale", help="created, then dropped")
    parser.add_argument("--keep", action="store_true", help="leave the database at the end")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="use the database --keep left, and leave it (its records stay; latency fills from "
        "there on): sizes filled once measured again, alternating with another database",
    )
    parser.add_argument("--sizes", default="0,1000000,10000000", help="latency: table sizes")
    parser.add_argument("--rounds", type=int, default=2000, help="latency: rounds per size")
    parser.add_argument("--messages", type=int, default=3_000_000, help="outbox: sent messages")
    parser.add_argument("--expired", type=int, default=3_000_000, help="cleanup: expired rows")
    parser.add_argument("--live", type=int, default=1_000_000, help="cleanup: live rows beside")
    parser.add_argument("--rate", type=float, default=200.0, help="cleanup: requests a second")
    parser.add_argument("--idle", type=float, default=30.0, help="cleanup: seconds without it")
    parser.add_argument(
        "--cleanup-args",
        action="append",
        help="cleanup: idempotency_cleanup's options for a variant (\"--batch-size 200 --sleep "
        '0.02"); given more than once, the variants alternate in random order, each run '
        "deleting its share (--limit) after an idle window of its own",
    )
    parser.add_argument(
        "--cleanup-rounds", type=int, default=1, help="cleanup: runs of each variant"
    )
    parser.add_argument("--per-day", type=int, default=1_000_000, help="churn: records a day")
    parser.add_argument("--days", type=int, default=3, help="churn: simulated days")
    parser.add_argument("--day-seconds", type=float, default=240.0, help="churn: a day, compressed")
    parser.add_argument("--connections", default="1,8,32,128", help="throughput: client counts")
    parser.add_argument("--seconds", type=float, default=8.0, help="throughput: per measurement")
    parser.add_argument(
        "--servers", default="gunicorn,uvicorn,hot", help="throughput: which servers, hot key"
    )
    parser.add_argument("--threads", type=int, default=64, help="gunicorn threads per worker")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn and uvicorn workers")
    parser.add_argument("--redis", default=os.environ.get("BENCH_REDIS_URL", ""))
    parser.add_argument("--records", type=int, default=20_000, help="redis: records to store")
    args = parser.parse_args()
    server = urlsplit(args.server)
    if not server.scheme.startswith(("postgres", "mysql")):
        parser.error("--server must be a postgres:// or mysql:// URL")
    if "redis" in args.parts and not args.redis:
        parser.error("the redis part needs --redis")
    bench_url = urlunsplit(server._replace(path=f"/{args.database}"))
    os.environ["BENCH_DATABASE_URL"] = bench_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.overhead_project.settings"
    if args.redis:
        os.environ["BENCH_REDIS_URL"] = args.redis
    if not args.reuse:
        create_database(args.server, args.database)
    try:
        bench = Bench(args, bench_url)
        bench.setup()
        if args.reuse:  # a fill numbers its records from 1 up: the next one goes on from there
            bench.top = count()
        for part in args.parts:
            getattr(bench, part)()
    finally:
        from django.db import connections

        connections.close_all()
        if not (args.keep or args.reuse):
            drop_database(args.server, args.database)


def load() -> str:
    """The load average now (1 minute), as every figure line ends."""
    return f"load {os.getloadavg()[0]:.2f}"


def say(line: str) -> None:
    print(f"{line}  [{load()}]", flush=True)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def ms(values: list[float]) -> str:
    """p50 and p99 of ``values`` (seconds) in milliseconds."""
    p50, p99 = statistics.median(values) * 1000, percentile(values, 0.99) * 1000
    return f"p50 {p50:6.2f} ms  p99 {p99:6.2f} ms"


# --- filling the tables fast ----------------------------------------------------------------

#: A finished record as the view stores it: a 64-hex key hash, a per-user scope, the charge's
#: JSON (about 140 bytes) and its Content-Type. ``{expiry}`` is an SQL expression of ``i``.
RECORD_PG = """
INSERT INTO django_idempotency_idempotencykey
    (scope, key_hash, method, path, request_hash, response_headers, recovery_point, attempt,
     created_at, updated_at, expires_at, status, response_status, response_body, lock_token,
     unlock_at)
SELECT 'user:' || (i %% 100000), encode(sha256(('scale-' || i)::bytea), 'hex'), 'POST',
       '/charges/', encode(sha256(('body-' || i)::bytea), 'hex'),
       '[["Content-Type", "application/json"]]'::jsonb, '', 1,
       e - interval '24 hours', e - interval '24 hours', e, {state}
FROM (SELECT i, {expiry} AS e FROM generate_series(%s, %s) AS i) AS rows_
"""
#: The last five columns of a finished record and of one just claimed (processing, locked).
#: The body is the charge's JSON, about 140 bytes.
FINISHED = {
    "postgresql": "'completed', 201, convert_to('{{\"id\": ' || i || ', \"amount\": 4200, "
    '"currency": "usd", "description": "benchmark", "created": '
    "\"2026-01-01T12:00:00.123456+00:00\"}}', 'UTF8'), NULL, NULL",
    "mysql": "'completed', 201, CONCAT('{{\"id\": ', i, ', \"amount\": 4200, "
    '"currency": "usd", "description": "benchmark", "created": '
    '"2026-01-01T12:00:00.123456+00:00"}}\'), NULL, NULL',
}
CLAIMED = {
    "postgresql": "'processing', NULL, NULL, gen_random_uuid(), now() + interval '30 seconds'",
    "mysql": "'processing', NULL, NULL, UUID(), UTC_TIMESTAMP(6) + INTERVAL 30 SECOND",
}
#: The store's result write, for every record claimed (the churn's hour, in one statement).
COMPLETE = {
    "postgresql": f"UPDATE {TABLE} SET status = 'completed', response_status = 201, "
    "response_body = convert_to(request_hash || request_hash, 'UTF8'), lock_token = NULL, "
    "unlock_at = NULL WHERE unlock_at IS NOT NULL",
    "mysql": f"UPDATE {TABLE} SET status = 'completed', response_status = 201, "
    "response_body = CONCAT(request_hash, request_hash), lock_token = NULL, "
    "unlock_at = NULL WHERE unlock_at IS NOT NULL",
}
#: MySQL/MariaDB have no generate_series: numbers from six cross-joined digit tables.
_DIGITS = (
    "(SELECT 0 AS d UNION ALL " + " UNION ALL ".join(f"SELECT {n}" for n in range(1, 10)) + ")"
)
RECORD_MYSQL = f"""
INSERT INTO django_idempotency_idempotencykey
    (scope, key_hash, method, path, request_hash, response_headers, recovery_point, attempt,
     created_at, updated_at, expires_at, status, response_status, response_body, lock_token,
     unlock_at)
SELECT CONCAT('user:', i MOD 100000), SHA2(CONCAT('scale-', i), 256), 'POST',
       '/charges/', SHA2(CONCAT('body-', i), 256),
       '[["Content-Type", "application/json"]]', '', 1,
       e - INTERVAL 24 HOUR, e - INTERVAL 24 HOUR, e, {{state}}
FROM (
    SELECT i, {{expiry}} AS e FROM (
        SELECT %s + d0.d + 10 * d1.d + 100 * d2.d + 1000 * d3.d + 10000 * d4.d
            + 100000 * d5.d AS i
        FROM {_DIGITS} AS d0, {_DIGITS} AS d1, {_DIGITS} AS d2, {_DIGITS} AS d3,
            {_DIGITS} AS d4, {_DIGITS} AS d5
    ) AS numbers WHERE i <= %s
) AS rows_
"""
#: Expiry spread over the day ahead (live) or the day behind (expired), 8.64 s apart by ``i``.
LIVE = {
    "postgresql": "now() + ((i::bigint * 8640) %% 86400000) * interval '1 millisecond'",
    "mysql": "UTC_TIMESTAMP(6) + INTERVAL ((i * 8640) MOD 86400000) * 1000 MICROSECOND",
}
EXPIRED = {
    "postgresql": "now() - interval '1 second' - ((i::bigint * 8640) %% 86400000) "
    "* interval '1 millisecond'",
    "mysql": "UTC_TIMESTAMP(6) - INTERVAL 1 SECOND "
    "- INTERVAL ((i * 8640) MOD 86400000) * 1000 MICROSECOND",
}
#: A sent outbox message of record ``i``: a Celery task's name and JSON arguments.
MESSAGE_PG = """
INSERT INTO django_idempotency_outboxmessage
    (record_id, message_id, engine, task, arguments, state, attempts, last_error, released_at,
     available_at, sent_at)
SELECT i, md5('m' || i)::uuid::text, 'celery', 'payments.tasks.notify_charge',
       '{"args": [' || i || '], "kwargs": {"currency": "usd"}}', 'sent', 1, '', now(), now(), now()
FROM generate_series(%s, %s) AS i
"""
MESSAGE_MYSQL = f"""
INSERT INTO django_idempotency_outboxmessage
    (record_id, message_id, engine, task, arguments, state, attempts, last_error, released_at,
     available_at, sent_at)
SELECT i, MD5(CONCAT('m', i)), 'celery', 'payments.tasks.notify_charge',
       CONCAT('{{"args": [', i, '], "kwargs": {{"currency": "usd"}}}}'), 'sent', 1, '',
       UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)
FROM (
    SELECT %s + d0.d + 10 * d1.d + 100 * d2.d + 1000 * d3.d + 10000 * d4.d + 100000 * d5.d AS i
    FROM {_DIGITS} AS d0, {_DIGITS} AS d1, {_DIGITS} AS d2, {_DIGITS} AS d3, {_DIGITS} AS d4,
        {_DIGITS} AS d5
) AS numbers WHERE i <= %s
"""
CHUNK = 1_000_000  # rows a statement (the digit tables make a million numbers)


def fill(first: int, last: int, *, expired: bool = False, messages: bool = False) -> float:
    """Insert records (or sent messages) ``first`` to ``last``, a million a transaction; then
    analyze, and on PostgreSQL vacuum (the visibility map) and checkpoint, so nothing of the
    fill is left for the timed part to pay. Returns the seconds taken."""
    from django.db import connection

    vendor = connection.vendor
    if messages:
        sql = MESSAGE_PG if vendor == "postgresql" else MESSAGE_MYSQL
    else:
        expiry = (EXPIRED if expired else LIVE)[vendor]
        sql = records_sql(vendor, expiry, FINISHED[vendor])
    started = time.perf_counter()
    with connection.cursor() as cursor:
        for start in range(first, last + 1, CHUNK):
            cursor.execute(sql, [start, min(last, start + CHUNK - 1)])
        settle(cursor, OUTBOX if messages else TABLE)
    return time.perf_counter() - started


def records_sql(vendor: str, expiry: str, state: str) -> str:
    return (RECORD_PG if vendor == "postgresql" else RECORD_MYSQL).format(
        expiry=expiry, state=state
    )


def settle(cursor: Any, table: str) -> None:
    if cursor.db.vendor == "postgresql":
        cursor.execute(f"VACUUM ANALYZE {table}")
        cursor.execute("CHECKPOINT")
    else:
        cursor.execute(f"ANALYZE TABLE {table}")
        cursor.fetchall()


def count(table: str = TABLE) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table}")
        return int(cursor.fetchone()[0])


def table_bytes(table: str = TABLE) -> tuple[int, int]:
    """The table's bytes and its indexes' (PostgreSQL: exact; InnoDB: its statistics)."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT pg_table_size(%s::regclass), pg_indexes_size(%s::regclass)", [table, table]
            )
        else:
            cursor.execute(f"ANALYZE TABLE {table}")
            cursor.fetchall()
            cursor.execute(
                "SELECT data_length, index_length FROM information_schema.tables "
                "WHERE table_schema = DATABASE() AND table_name = %s",
                [table],
            )
        heap, indexes = cursor.fetchone()
    return int(heap), int(indexes)


def per_record(rows: int, table: str = TABLE) -> str:
    heap, indexes = table_bytes(table)
    if not rows:
        return f"{heap / 2**20:.0f} MiB table, {indexes / 2**20:.0f} MiB indexes"
    return (
        f"{heap / 2**20:,.0f} MiB table + {indexes / 2**20:,.0f} MiB indexes: "
        f"{heap / rows:.0f} + {indexes / rows:.0f} = {(heap + indexes) / rows:.0f} bytes a record"
    )


# --- the benchmark --------------------------------------------------------------------------


@dataclass
class Bench:
    args: argparse.Namespace
    url: str
    vendor: str = ""
    #: The highest ``i`` filled so far: each fill takes numbers (so key hashes) of its own.
    top: int = 0

    def grow(self, rows: int, *, expired: bool = False) -> float:
        seconds = fill(self.top + 1, self.top + rows, expired=expired)
        self.top += rows
        return seconds

    def setup(self) -> None:
        import django
        from django.core.management import call_command
        from django.db import connection

        django.setup()
        from django.contrib.auth.models import User

        call_command("migrate", verbosity=0)
        User.objects.get_or_create(username=USER)
        self.vendor = connection.vendor
        with connection.cursor() as cursor:
            cursor.execute("SELECT version()")
            version = cursor.fetchone()[0].split(",")[0]
            if self.vendor == "postgresql":
                cursor.execute("SHOW shared_buffers")
                memory = f"shared_buffers {cursor.fetchone()[0]}"
            else:
                cursor.execute("SELECT @@innodb_buffer_pool_size")
                memory = f"innodb_buffer_pool_size {int(cursor.fetchone()[0]) // 2**20} MB"
        print(f"# {version}, {memory}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}")

    # --- 1. latency against table size ----------------------------------------------------

    def latency(self) -> None:
        sizes = [int(size) for size in self.args.sizes.split(",")]
        print(f"\n## latency: {self.args.rounds} interleaved rounds per size, in one process")
        filled = count()
        p99s: dict[int, dict[str, float]] = {}
        for size in sizes:
            if size > filled:
                seconds = self.grow(size - filled)
                say(f"filled {filled:,} -> {size:,} finished records in {seconds:.0f} s")
                filled = size
            say(f"{size:,} records: {per_record(size)}" if size else "empty table")
            before = self.cache_reads()
            timings = self.rounds(self.args.rounds)
            reads = self.cache_reads() - before
            bare = timings["bare"]
            p99s[size] = {name: percentile(values, 0.99) for name, values in timings.items()}
            for name, values in timings.items():
                p50 = statistics.median(values) / statistics.median(bare)
                p99 = percentile(values, 0.99) / percentile(bare, 0.99)
                ratio = f"  ratio to bare: p50 {p50:.2f} p99 {p99:.2f}"
                say(f"  {size:>11,} {name:<7} {ms(values)}{ratio if name != 'bare' else ''}")
            say(f"  {size:>11,} index depth {self.index_depth()}, {reads} blocks read from disk")
        first, last = sizes[1] if len(sizes) > 1 else sizes[0], sizes[-1]
        for name in ("first", "replay"):
            # The machine's load moves every path's tail alike; the bare view's, measured in
            # the same rounds, takes it out.
            raw = p99s[last][name] / p99s[first][name]
            moved = p99s[last]["bare"] / p99s[first]["bare"]
            say(
                f"p99 {name} at {last:,} / at {first:,}: {raw:.2f}; the bare view's {moved:.2f}; "
                f"{name}'s over bare's {raw / moved:.2f} (goal: at most 1.20)"
            )

    def rounds(self, rounds: int) -> dict[str, list[float]]:
        """Bare requests, first executions and replays (of the previous round's key), in a
        random order each round, so the machine's noise falls on all three alike."""
        timings: dict[str, list[float]] = {"bare": [], "first": [], "replay": []}
        previous = self.first_key()
        for round_ in range(rounds + 200):  # the first 200: warm-up
            key = f"scale-{uuid.uuid4()}"
            calls: list[tuple[str, str, str | None]] = [
                ("bare", "/bare/", None),
                ("first", "/two-phase/", key),
                ("replay", "/two-phase/", previous),
            ]
            for name, path, given in random.sample(calls, 3):
                started = time.perf_counter()
                status = wsgi_call(path, given)
                elapsed = time.perf_counter() - started
                assert status == 201, (name, status)
                if round_ >= 200:
                    timings[name].append(elapsed)
            previous = key
        return timings

    def first_key(self) -> str:
        key = f"scale-{uuid.uuid4()}"
        assert wsgi_call("/two-phase/", key) == 201
        return key

    def cache_reads(self) -> int:
        """Blocks read from outside the database's cache so far, for the record table (PG)
        or the whole buffer pool (InnoDB)."""
        from django.db import connection

        with connection.cursor() as cursor:
            if self.vendor == "postgresql":
                cursor.execute(
                    "SELECT coalesce(heap_blks_read, 0) + coalesce(idx_blks_read, 0) "
                    "FROM pg_statio_user_tables WHERE relname = %s",
                    [TABLE],
                )
                return int(cursor.fetchone()[0])
            cursor.execute("SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_reads'")
            return int(cursor.fetchone()[1])

    def index_depth(self) -> str:
        """The unique (scope, key_hash) index's B-tree levels below its root (PostgreSQL)."""
        from django.db import connection

        if self.vendor != "postgresql":
            return "n/a"
        with connection.cursor() as cursor:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
            cursor.execute("SELECT level FROM bt_metap('django_idempotency_scope_key_uniq')")
            return str(cursor.fetchone()[0])

    # --- the outbox -------------------------------------------------------------------------

    def outbox(self) -> None:
        from django.db import connection
        from django.utils import timezone

        from django_idempotency._ops.relay import delete_delivered
        from django_idempotency._store import outbox as store

        messages = self.args.messages
        print(f"\n## outbox: {messages:,} sent messages, their records live")
        if self.top < messages:
            seconds = self.grow(messages - self.top)
            say(f"filled records to {messages:,} in {seconds:.0f} s")
        seconds = fill(1, messages, messages=True)
        say(f"filled {messages:,} sent messages in {seconds:.0f} s: {per_record(messages, OUTBOX)}")
        # A hundred pending messages due now among them: what the relay's take finds.
        table = OUTBOX
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET state = 'pending', available_at = %s WHERE id <= 100",
                [connection.ops.adapt_datetimefield_value(timezone.now())],
            )
        lease = timedelta(minutes=5)
        takes = []
        for _ in range(20):
            started = time.perf_counter()
            taken = store.take(connection, 5, lease)
            takes.append(time.perf_counter() - started)
            assert taken
        say(f"relay take of 5 due messages (of {messages:,}): {ms(takes)}")
        passes = []
        for _ in range(3):
            started = time.perf_counter()
            assert delete_delivered("default", 1000) == 0
            passes.append(time.perf_counter() - started)
        say(
            f"cleanup's pass over delivered messages, none deletable: median "
            f"{statistics.median(passes) * 1000:,.0f} ms, max {max(passes) * 1000:,.0f} ms"
        )
        gone = messages // 10
        with connection.cursor() as cursor:  # a tenth of the records gone: their messages go
            cursor.execute(f"DELETE FROM {TABLE} WHERE id <= %s", [gone])
            settle(cursor, TABLE)
        started = time.perf_counter()
        deleted = delete_delivered("default", 1000)
        seconds = time.perf_counter() - started
        say(
            f"cleanup's pass deleting {deleted:,} delivered messages of {messages:,}: "
            f"{seconds:.1f} s, {deleted / seconds:,.0f} messages/s"
        )

    # --- 2. cleanup under traffic -----------------------------------------------------------

    def cleanup(self) -> None:
        args = self.args
        variants = args.cleanup_args or [""]
        runs = len(variants) * args.cleanup_rounds
        print(
            f"\n## cleanup: {args.expired:,} expired records beside {args.live:,} live ones, "
            f"while gunicorn serves {args.rate:.0f} keyed requests/s (first executions); "
            f"{runs} run(s) of idempotency_cleanup, variants {variants}"
        )
        seconds = self.grow(args.live) + self.grow(args.expired, expired=True)
        say(f"filled in {seconds:.0f} s: {per_record(count())}")
        share = ["--limit", str(-(-args.expired // runs))] if runs > 1 else []
        windows: dict[str, list[Window]] = {variant: [] for variant in variants}
        with self.server("gunicorn") as url:
            recorder = Paced(url + "/two-phase/", args.rate)
            recorder.start()
            time.sleep(5)  # warm-up: the server's connections and threads, counted in no window
            for _ in range(args.cleanup_rounds):
                for variant in random.sample(variants, len(variants)):
                    self.purged()
                    idle_from = time.monotonic()
                    time.sleep(args.idle)  # the idle window's requests
                    idle_to = time.monotonic()
                    with LockWatch(self.vendor) as locks:
                        output, first, last = self.timed_cleanup([*variant.split(), *share])
                    windows[variant].append(
                        Window(idle_from, idle_to, first, last, output, locks.counts())
                    )
            time.sleep(args.idle / 2)
            recorder.stop()
        for variant, measured in windows.items():
            self.cleanup_figures(variant or "(defaults)", measured, recorder.samples)
        statuses = Counter(status for _, _, status in recorder.samples)
        say(f"statuses of all requests: {dict(statuses)}")
        if self.vendor == "postgresql":
            self.partition_drop(args.expired)

    def cleanup_figures(
        self, variant: str, windows: list[Window], samples: list[tuple[float, float, int]]
    ) -> None:
        """A variant's figures: its runs' idle windows against their cleanups, pooled."""
        idle = [
            lat for at, lat, _ in samples if any(w.idle_from <= at < w.idle_to for w in windows)
        ]
        during = [lat for at, lat, _ in samples if any(w.first <= at < w.last for w in windows)]
        print(f"\n### idempotency_cleanup {variant}: {len(windows)} run(s)")
        for window in windows:
            for line in window.output.splitlines():
                if not line.startswith("Batch "):
                    say(f"idempotency_cleanup: {line}")
            alone = [lat for at, lat, _ in samples if window.idle_from <= at < window.idle_to]
            beside = [lat for at, lat, _ in samples if window.first <= at < window.last]
            if alone and beside:
                say(
                    f"  this run: p99 without {percentile(alone, 0.99) * 1000:.1f} ms, during "
                    f"{percentile(beside, 0.99) * 1000:.1f} ms: "
                    f"{percentile(beside, 0.99) / percentile(alone, 0.99):.2f}"
                )
        say(f"requests without cleanup: n={len(idle)} {ms(idle)}")
        say(f"requests during cleanup:  n={len(during)} {ms(during)}")
        say(
            f"p99 during / without: {percentile(during, 0.99) / percentile(idle, 0.99):.2f} "
            f"(goal: at most 2); p50 {statistics.median(during) / statistics.median(idle):.2f}"
        )
        waiting_samples, total = (sum(w.locks[i] for w in windows) for i in range(2))
        most = max(w.locks[2] for w in windows)
        say(
            f"lock waits during cleanup: {waiting_samples} of {total} samples "
            f"(every 0.1 s) saw a session waiting for a lock, at most {most} at once"
        )

    def purged(self) -> None:
        """On MySQL/MariaDB, wait for InnoDB's purge of the last run's deletes (its history
        list) before an idle window, so that no window "without cleanup" holds the purge of
        the one before: the purge is the cleanup's work, done after its commits."""
        from django.db import connection

        if self.vendor == "postgresql":
            return
        started = time.monotonic()
        with connection.cursor() as cursor:
            while time.monotonic() - started < 600:
                cursor.execute(
                    "SELECT count FROM information_schema.INNODB_METRICS "
                    "WHERE name = 'trx_rseg_history_len'"
                )
                history = int(cursor.fetchone()[0])
                if history < 100:
                    break
                time.sleep(1)
        if time.monotonic() - started > 1:
            say(f"waited {time.monotonic() - started:.0f} s for InnoDB's purge (history {history})")

    def partition_drop(self, rows: int) -> None:
        """What dropping a partition of ``rows`` expired records costs: the same rows in a
        table of the same shape, dropped (a detached partition is a table)."""
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(f"CREATE TABLE day_partition (LIKE {TABLE} INCLUDING ALL)")
            cursor.execute(f"ALTER TABLE {TABLE} RENAME TO {TABLE}_kept")
            cursor.execute(f"ALTER TABLE day_partition RENAME TO {TABLE}")
        self.grow(rows, expired=True)
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {TABLE} RENAME TO day_partition")
            cursor.execute(f"ALTER TABLE {TABLE}_kept RENAME TO {TABLE}")
            started = time.perf_counter()
            cursor.execute("DROP TABLE day_partition")
            seconds = time.perf_counter() - started
        say(f"dropping a table of the same {rows:,} expired records: {seconds * 1000:.0f} ms")

    def timed_cleanup(self, options: list[str]) -> tuple[str, float, float]:
        """``idempotency_cleanup`` in a process of its own, as cron starts it: its output and
        when its first and its last batch of records were reported (its start-up and its
        outbox pass are not the records' deletion)."""
        process = subprocess.Popen(
            [sys.executable, "-m", "django", "idempotency_cleanup", "-v", "2", *options],
            cwd=ROOT,
            env=self.env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert process.stdout is not None
        lines: list[str] = []
        first = last = 0.0
        for line in process.stdout:
            if line.startswith("Batch ") and not first:
                first = time.monotonic()
            if line.startswith("Deleted ") and " expired " in line:
                last = time.monotonic()
            lines.append(line.strip())
        assert process.wait() == 0
        return "\n".join(lines), first, last or time.monotonic()

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }

    @contextmanager
    def server(self, kind: str) -> Iterator[str]:
        """gunicorn (gthread) or uvicorn serving the benchmark project on a port of its own."""
        port = free_port()
        if kind == "gunicorn":
            command = [
                *("-m", "gunicorn", "--worker-class", "gthread"),
                *("--workers", str(self.args.workers), "--threads", str(self.args.threads)),
                *("--keep-alive", "60", "--backlog", "512", "--log-level", "warning"),
                *no_control_socket(),
                *("--bind", f"127.0.0.1:{port}", "benchmarks.overhead_project.wsgi:application"),
            ]
        else:
            command = [
                *("-m", "uvicorn", "--workers", str(self.args.workers)),
                *("--log-level", "warning", "--no-access-log", "--timeout-keep-alive", "60"),
                *("--port", str(port), "benchmarks.overhead_project.asgi:application"),
            ]
        env = self.env()
        if kind == "uvicorn":  # a persistent connection per request's thread would pile up
            env["BENCH_CONN_MAX_AGE"] = "0"
        process = subprocess.Popen(
            [sys.executable, *command], cwd=ROOT, env=env, start_new_session=True
        )
        try:
            url = f"http://127.0.0.1:{port}"
            serving(url, process)
            yield url
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)

    # --- 3. growth over days ----------------------------------------------------------------

    def churn(self) -> None:
        """Fresh databases of their own, churned side by side (the same load on each): on
        PostgreSQL one with its default autovacuum and one with the table settings
        docs/scale.rst recommends; on MySQL/MariaDB one (InnoDB purges on its own)."""
        from django.core.management import call_command
        from django.db import connections

        labels = (
            {"churn_default": "default autovacuum", "churn_tuned": "recommended"}
            if self.vendor == "postgresql"
            else {"churn_default": "InnoDB purge"}
        )
        names = {alias: f"{self.args.database}_{alias}" for alias in labels}
        try:
            for alias, name in names.items():
                create_database(self.args.server, name)
                connections.settings[alias] = {**connections.settings["default"], "NAME": name}
                call_command("migrate", database=alias, verbosity=0)
            if "churn_tuned" in labels:
                with connections["churn_tuned"].cursor() as cursor:
                    cursor.execute(f"ALTER TABLE {TABLE} SET ({RECOMMENDED})")
            self.churn_days(labels)
        finally:
            for alias, name in names.items():
                connections[alias].close()
                drop_database(self.args.server, name)

    def churn_days(self, labels: dict[str, str]) -> None:
        from django.core.management import call_command
        from django.db import connections

        args = self.args
        hour = args.day_seconds / 24
        per_hour = args.per_day // 24
        print(
            f"\n## churn: {args.days} days of {args.per_day:,} records a day, a day lasting "
            f"{args.day_seconds:.0f} s (the TTL a day); each hour claimed, completed, and "
            "the cleanup run"
        )
        first = {alias: 1 for alias in labels}
        for step in range(args.days * 24):
            began = time.monotonic()
            for alias in labels:
                churn_hour(alias, first[alias], per_hour, args.day_seconds)
                first[alias] += per_hour
                call_command("idempotency_cleanup", database=alias, verbosity=0)
            if (step + 1) % 24 == 0:
                for alias, label in labels.items():
                    live, heap, indexes, dead, vacuums = churn_state(alias)
                    say(
                        f"day {(step + 1) // 24} {label:<18}: {live:,} live, "
                        f"{heap / 2**20:,.0f} + {indexes / 2**20:,.0f} MiB = "
                        f"{(heap + indexes) / max(live, 1):.0f} bytes a live record, "
                        f"{dead:,} dead tuples, {vacuums} autovacuums"
                    )
            time.sleep(max(0.0, hour - (time.monotonic() - began)))
        for alias, label in labels.items():
            with connections[alias].cursor() as cursor:
                if self.vendor == "postgresql":
                    cursor.execute(f"VACUUM FULL {TABLE}")
                else:
                    cursor.execute(f"OPTIMIZE TABLE {TABLE}")
                    cursor.fetchall()
            live, heap, indexes, _, _ = churn_state(alias)
            say(
                f"packed {label:<18}: {heap / 2**20:,.0f} + {indexes / 2**20:,.0f} MiB = "
                f"{(heap + indexes) / max(live, 1):.0f} bytes a live record"
            )

    # --- 4. throughput ----------------------------------------------------------------------

    def throughput(self) -> None:
        args = self.args
        conns = [int(n) for n in args.connections.split(",")]
        print(
            f"\n## throughput: {args.seconds:.0f} s per figure, the client (asyncio, HTTP/1.1 "
            "keep-alive) on the same 2 cores"
        )
        servers = {
            "gunicorn": {"bare": "/bare/", "protected": "/two-phase/"},
            "uvicorn": {"bare": "/async-bare/", "protected": "/async-two-phase/"},
        }
        # First executions that commit once, as the bare view does (the sync view only): atomic
        # mode, and the Redis store (the record in Redis, the view's row in the database).
        once = {"atomic": "/atomic/"}
        if args.redis:
            once["redis"] = "/two-phase-redis/"
        for kind, paths in servers.items():
            if kind not in args.servers.split(","):
                continue
            workers = f"{args.workers} workers" + (
                f" x {args.threads} threads" if kind == "gunicorn" else ""
            )
            with self.server(kind) as url:
                replays = [f"replay-{uuid.uuid4()}" for _ in range(256)]
                asyncio.run(closed_loop(url + paths["protected"], 8, 0, keys=replays))
                for n in conns:
                    rates: dict[str, list[float]] = {"bare": [], "first": [], "replay": []}
                    extra = once if kind == "gunicorn" else {}
                    rates.update({name: [] for name in extra})
                    for _ in range(2):
                        for name in random.sample(list(rates), len(rates)):
                            role = "bare" if name == "bare" else "protected"
                            path = extra.get(name) or paths[role]
                            keys = replays if name == "replay" else None
                            result = asyncio.run(
                                closed_loop(
                                    url + path,
                                    n,
                                    args.seconds,
                                    keys=keys,
                                    keyed=name == "first" or name in extra,
                                )
                            )
                            rates[name].append(result)
                    bare = statistics.mean(rates["bare"])
                    errors = f", other answers {dict(ERRORS)}" if ERRORS else ""
                    ERRORS.clear()
                    say(
                        f"{kind} ({workers}) {n:>3} connections: bare {bare:,.0f}/s, "
                        f"first {statistics.mean(rates['first']):,.0f}/s "
                        f"({statistics.mean(rates['first']) / bare:.2f}), "
                        f"replay {statistics.mean(rates['replay']):,.0f}/s "
                        f"({statistics.mean(rates['replay']) / bare:.2f})"
                        + "".join(
                            f", {name} first {statistics.mean(rates[name]):,.0f}/s "
                            f"({statistics.mean(rates[name]) / bare:.2f})"
                            for name in extra
                        )
                        + errors
                    )
        if "hot" not in args.servers.split(","):
            return None
        with self.server("gunicorn") as url:
            for path in ("/hot/", "/hot-wait/"):
                self.hot_key(url, path)
        return None

    def hot_key(self, url: str, path: str) -> None:
        from example_project.payments.models import Charge

        before = Charge._default_manager.count()
        key = f"hot-{uuid.uuid4()}"
        statuses, times = asyncio.run(storm(url + path, key, 100))
        executions = Charge._default_manager.count() - before
        say(
            f"hot key {path}: 100 clients at once: {dict(Counter(statuses))}, {executions} "
            f"execution(s); answers within {ms(times)}, last at {max(times) * 1000:.0f} ms"
        )

    # --- 5. the Redis store's memory --------------------------------------------------------

    def redis(self) -> None:
        import redis

        client = redis.Redis.from_url(self.args.redis)
        client.flushdb()
        # Django's and the app's one-time state, out of the measure.
        assert wsgi_call("/two-phase-redis/", f"scale-{uuid.uuid4()}") == 201
        before = int(client.info("memory")["used_memory"])
        keys_before = int(client.dbsize())
        for _ in range(self.args.records):
            assert wsgi_call("/two-phase-redis/", f"scale-{uuid.uuid4()}") == 201
        after = int(client.info("memory")["used_memory"])
        added = int(client.dbsize()) - keys_before
        sample = next(client.scan_iter(count=100))
        say(
            f"\n## redis: {self.args.records:,} completed records: "
            f"{(after - before) / self.args.records:.0f} bytes a record of used_memory "
            f"({added:,} keys; MEMORY USAGE of one: {client.memory_usage(sample)} bytes)"
        )
        client.flushdb()


#: The table settings docs/scale.rst recommends.
RECOMMENDED = (
    "autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 10000, "
    "autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_limit = 2000"
)


def churn_hour(alias: str, first: int, count_: int, ttl: float) -> None:
    """An hour's records as the app makes them: claimed (processing, locked), then completed
    (the response stored, the lock cleared: an UPDATE of indexed columns), expiring a TTL on."""
    from django.db import connections

    connection = connections[alias]
    vendor = connection.vendor
    expiry = (
        f"now() + interval '{ttl} seconds'"
        if vendor == "postgresql"
        else f"UTC_TIMESTAMP(6) + INTERVAL {ttl} SECOND"
    )
    with connection.cursor() as cursor:
        cursor.execute(records_sql(vendor, expiry, CLAIMED[vendor]), [first, first + count_ - 1])
        cursor.execute(COMPLETE[vendor])


def churn_state(alias: str) -> tuple[int, int, int, int, int]:
    """Live records, table bytes, index bytes, dead tuples and autovacuum runs."""
    from django.db import connections

    connection = connections[alias]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {TABLE}")
        live = int(cursor.fetchone()[0])
        if connection.vendor != "postgresql":
            cursor.execute(f"ANALYZE TABLE {TABLE}")
            cursor.fetchall()
            cursor.execute(
                "SELECT data_length, index_length FROM information_schema.tables "
                "WHERE table_schema = DATABASE() AND table_name = %s",
                [TABLE],
            )
            heap, indexes = cursor.fetchone()
            return live, int(heap), int(indexes), 0, 0
        cursor.execute(
            "SELECT pg_table_size(relid), pg_indexes_size(relid), n_dead_tup, autovacuum_count "
            "FROM pg_stat_user_tables WHERE relname = %s",
            [TABLE],
        )
        heap, indexes, dead, vacuums = cursor.fetchone()
    return live, int(heap), int(indexes), int(dead), int(vacuums)


# --- the load generator: HTTP/1.1 keep-alive on asyncio streams -------------------------------


class Connection:
    """One keep-alive connection: light enough that the client costs far less than httpx."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port, self.path = parts.hostname or "", parts.port or 80, parts.path
        self.replayed = False  # the last answer's Idempotent-Replayed header
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, key: str | None, path: str | None = None) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        header = f"Idempotency-Key: {key}\r\n" if key else ""
        self.writer.write(
            f"POST {path or self.path} HTTP/1.1\r\nHost: bench\r\n"
            f"Authorization: Bearer {USER}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(BODY)}\r\n{header}\r\n".encode()
            + BODY
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").lower().split("\r\n")
        self.replayed = any(line.startswith("idempotent-replayed") for line in lines)
        length = [int(line.split(":", 1)[1]) for line in lines if line.startswith("content-length")]
        if length:
            await self.reader.readexactly(length[0])
        else:  # chunked (gunicorn, when the response names no length)
            while size := int((await self.reader.readuntil(b"\r\n")).strip(), 16):
                await self.reader.readexactly(size + 2)
            await self.reader.readuntil(b"\r\n")
        return int(lines[0].split()[1])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


#: Answers other than 201 in the closed-loop runs, by status, shown (and reset) with each figure.
ERRORS: Counter[int] = Counter()


async def closed_loop(
    url: str, clients: int, seconds: float, *, keys: list[str] | None = None, keyed: bool = False
) -> float:
    """``clients`` connections each sending its next request when the last is answered, for
    ``seconds`` (or, with ``seconds`` 0, each of ``keys`` once): requests a second. With
    ``keys``, each request replays one of them in turn; with ``keyed``, each has a new key."""
    done = 0
    deadline = time.monotonic() + seconds
    queue = iter(keys or [])
    cycle = 0

    async def client() -> None:
        nonlocal done, cycle
        connection = Connection(url)
        try:
            while True:
                if seconds == 0:
                    key = next(queue, None)
                    if key is None:
                        return
                elif time.monotonic() >= deadline:
                    return
                elif keys:
                    cycle += 1
                    key = keys[cycle % len(keys)]
                else:
                    key = f"tp-{uuid.uuid4()}" if keyed else None
                status = await connection.post(key)
                if status == 201:
                    done += 1
                else:  # counted and shown with the figure, not a 201 of the rate
                    ERRORS[status] += 1
        finally:
            connection.close()

    started = time.monotonic()
    await asyncio.gather(*(client() for _ in range(clients)))
    return done / (time.monotonic() - started)


async def storm(url: str, key: str, clients: int) -> tuple[list[str], list[float]]:
    """``clients`` connections, opened first, then all sending ``key`` at the same moment."""
    connections = [Connection(url) for _ in range(clients)]
    for connection in connections:
        connection.reader, connection.writer = await asyncio.open_connection(
            connection.host, connection.port
        )
    started = time.perf_counter()

    async def one(connection: Connection) -> tuple[str, float]:
        status = await connection.post(key)
        answer = f"{status} replayed" if connection.replayed else str(status)
        return answer, time.perf_counter() - started

    answers = await asyncio.gather(*(one(connection) for connection in connections))
    for connection in connections:
        connection.close()
    return [answer for answer, _ in answers], [elapsed for _, elapsed in answers]


class Paced(threading.Thread):
    """An open-loop load generator on a thread of its own: a request with a new key every
    1/``rate`` s, whatever the answers' pace; each latency counted from when it was due, so a
    stall is counted in full (no coordinated omission). ``samples``: (due, latency, status)."""

    def __init__(self, url: str, rate: float) -> None:
        super().__init__(daemon=True)
        self.url, self.rate = url, rate
        self.samples: list[tuple[float, float, int]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        asyncio.run(self.generate())

    def stop(self) -> None:
        self.stopping.set()
        self.join()

    async def generate(self) -> None:
        free: asyncio.Queue[Connection] = asyncio.Queue()
        for _ in range(32):
            free.put_nowait(Connection(self.url))
        pending: set[asyncio.Task[None]] = set()
        start = time.monotonic()
        sent = 0
        while not self.stopping.is_set():
            due = start + sent / self.rate
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            task = asyncio.create_task(self.one(free, due))
            pending.add(task)
            task.add_done_callback(pending.discard)
            sent += 1
        await asyncio.gather(*pending)

    async def one(self, free: asyncio.Queue[Connection], due: float) -> None:
        connection = await free.get()
        try:
            status = await connection.post(f"paced-{uuid.uuid4()}")
        finally:
            free.put_nowait(connection)
        self.samples.append((due, time.monotonic() - due, status))


@dataclass(frozen=True)
class Window:
    """One cleanup run's idle window before it, its first and last batch, its output, and its
    lock waits (:meth:`LockWatch.counts`); times from ``time.monotonic``."""

    idle_from: float
    idle_to: float
    first: float
    last: float
    output: str
    locks: tuple[int, int, int]


class LockWatch:
    """Samples, every 0.1 s on a connection of its own, how many sessions wait for a lock."""

    def __init__(self, vendor: str) -> None:
        self.vendor = vendor
        self.samples = self.waiting_samples = self.most = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def __enter__(self) -> LockWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()

    def counts(self) -> tuple[int, int, int]:
        """Samples that saw a session waiting, samples in all, the most waiting at once."""
        return self.waiting_samples, self.samples, self.most

    def run(self) -> None:
        from django.db import connection

        query = (
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            if self.vendor == "postgresql"
            else "SELECT count(*) FROM information_schema.innodb_lock_waits"
        )
        try:
            with connection.cursor() as cursor:
                while not self.stopping.wait(0.1):
                    cursor.execute(query)
                    waiting = int(cursor.fetchone()[0])
                    self.samples += 1
                    self.waiting_samples += waiting > 0
                    self.most = max(self.most, waiting)
        finally:
            connection.close()


def serving(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit("the server exited at start")
        try:
            asyncio.run(closed_loop(url + "/bare/", 1, 0.01))
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("the server did not serve within 60 s")


if __name__ == "__main__":
    main()
