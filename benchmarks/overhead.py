#!/usr/bin/env python
"""What the protection costs, on PostgreSQL or MySQL/MariaDB.

One view (``benchmarks/overhead_project/``: authenticate the user by one query, parse a JSON
body, insert a row, render it as JSON; keys scoped per user) is served bare, protected in
two-phase mode and protected in atomic mode. In one process, through Django's WSGI handler
(URL resolution, signals, the view; no HTTP parsing), the script

1. prints the SQL statements each path runs, and how many it adds to the bare view;
2. measures the latency of bare requests, first executions and replays, interleaved in random
   order in every round so the machine's noise falls on all of them alike, and prints medians
   and their ratios; with them, a view that authenticates and answers a constant ("django
   only": Django's request handling and the auth query), and a round trip, an indexed read of
   a record and a durable commit on the server; from those it prints each path's floor (the
   least its ratio could be on this server), its distance to it and its goal, and a summary
   line for the database;
3. serves the same views under gunicorn (4 sync workers) and prints the requests per second a
   concurrent client (httpx) gets from each;
4. with ``--telemetry`` (needs ``opentelemetry-sdk``), times a two-phase first execution and
   a replay with OpenTelemetry's SDK recording every metric and span into no-op exporters,
   interleaved with the same requests with the app's telemetry off (the code path it takes
   when ``opentelemetry-api`` is not installed).

It creates its own database (``bench_overhead``) on the server given and drops it at the end.
Run it from the repository root::

    .venv/bin/python benchmarks/overhead.py --server postgres://postgres@127.0.0.1:5432/postgres
    .venv/bin/python benchmarks/overhead.py --server mysql://root@127.0.0.1:3306/test
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.databases import create_database, drop_database, is_mysql  # noqa: E402

USER = "bench"  # every request authenticates as this user (overhead_project/middleware.py)
BODY = b'{"amount": 4200, "currency": "usd", "description": "benchmark"}'
PATHS = {
    "bare": "/bare/",
    "two-phase": "/two-phase/",
    "atomic": "/atomic/",
    "django only": "/django-only/",
}
#: The peer's paths (drf-idempotency's decorator, alone and inside ``transaction.atomic``), timed
#: in the same rounds when it is installed (``pip install drf-idempotency``).
PEER_PATHS = {"two-phase": "/peer-two-phase/", "atomic": "/peer-atomic/"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--server",
        default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
        help="a PostgreSQL or MySQL URL whose server gets the benchmark database "
        "(default: DATABASE_URL)",
    )
    parser.add_argument("--database", default="bench_overhead", help="created, then dropped")
    parser.add_argument("--rounds", type=int, default=2000, help="latency rounds (default 2000)")
    parser.add_argument("--requests", type=int, default=2000, help="per path per throughput run")
    parser.add_argument("--runs", type=int, default=3, help="throughput runs per path")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent client requests")
    parser.add_argument("--workers", type=int, default=4, help="gunicorn workers")
    parser.add_argument("--no-gunicorn", action="store_true", help="skip the throughput part")
    parser.add_argument(
        "--telemetry",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="also time what OpenTelemetry's SDK costs, in this many rounds",
    )
    parser.add_argument(
        "--auth",
        choices=["eager", "lazy"],
        default="eager",
        help="eager: the user read by the middleware (default); lazy: when first used, as "
        "Django's AuthenticationMiddleware reads it (a replay that needs no user reads none)",
    )
    parser.add_argument(
        "--prepared-statements",
        action="store_true",
        help="connect with server-side binding and prepared statements (psycopg's threshold, 5)",
    )
    args = parser.parse_args()
    if args.rounds < 1 or args.requests < 1 or args.runs < 1 or args.concurrency < 1:
        parser.error("--rounds, --requests, --runs and --concurrency must be positive")
    if not args.database.isidentifier():
        parser.error("--database must be a plain identifier")

    server = urlsplit(args.server)
    if not server.scheme.startswith(("postgres", "mysql")):
        parser.error("--server must be a postgres:// or mysql:// URL")
    if args.prepared_statements and is_mysql(args.server):
        parser.error("--prepared-statements is for PostgreSQL (psycopg)")
    bench_url = urlunsplit(server._replace(path=f"/{args.database}"))
    create_database(args.server, args.database)
    try:
        os.environ["BENCH_DATABASE_URL"] = bench_url
        os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.overhead_project.settings"
        if args.prepared_statements:
            os.environ["BENCH_PREPARED_STATEMENTS"] = "1"
        os.environ["BENCH_AUTH"] = args.auth
        run(args, bench_url)
    finally:
        from django.db import connections

        connections.close_all()
        drop_database(args.server, args.database)


def run(args: argparse.Namespace, bench_url: str) -> None:
    import django
    from django.core.management import call_command
    from django.db import connection

    django.setup()
    from django.contrib.auth.models import User

    call_command("migrate", verbosity=0)
    User.objects.create(username=USER)
    with connection.cursor() as cursor:
        cursor.execute("SELECT version()")
        (version,) = cursor.fetchone()
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"# django-idempotency overhead benchmark ({now})")
    print(
        f"Python {platform.python_version()}, Django {django.get_version()}, {os.cpu_count()} CPUs"
    )
    print(f"{version.split(',')[0]}, database {args.database!r} on {urlsplit(bench_url).hostname}")
    options = connection.settings_dict.get("OPTIONS") or "none (Django's defaults)"
    print(f"Connection OPTIONS: {options}")
    print("View: authenticate the user (one query), parse a JSON body, INSERT one row, render it")
    print("as JSON (benchmarks/overhead_project/), through Django's WSGI handler; keys per user.")
    when = "when first read" if args.auth == "lazy" else "by the middleware, every request"
    print(f"Authentication ({args.auth}): the user is read {when}.")
    print()
    statements()
    kind = "prepared statements" if args.prepared_statements else "Django's default connection"
    # PostgreSQL's version() is a sentence ("PostgreSQL 15.4 (Debian ...) on ..."), MySQL's a
    # number ("8.0.36") and MariaDB's one with its name ("10.11.6-MariaDB-0+deb12u1").
    if is_mysql(bench_url):
        number = version.split("-")[0]
        server = f"MariaDB {number}" if "MariaDB" in version else f"MySQL {number}"
    else:
        server = f"PostgreSQL {version.split()[1]}"
    latency(args.rounds, f"{server}, {kind}")
    if args.telemetry:
        telemetry_cost(args.telemetry)
    if not args.no_gunicorn:
        throughput(args, bench_url)


# --- one process: Django's WSGI handler, called directly ---------------------------------------


def wsgi_call(path: str, key: str | None = None) -> int:
    from django.core.handlers.wsgi import WSGIHandler

    environ: dict[str, Any] = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": path,
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "bench",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "HTTP_AUTHORIZATION": f"Bearer {USER}",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(BODY)),
        "wsgi.input": io.BytesIO(BODY),
        "wsgi.errors": sys.stderr,
        "wsgi.url_scheme": "http",
        "wsgi.version": (1, 0),
        "wsgi.multithread": False,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    if key is not None:
        environ["HTTP_IDEMPOTENCY_KEY"] = key
    statuses: list[str] = []
    handler = _handler.get("handler") or _handler.setdefault("handler", WSGIHandler())
    result = handler(environ, lambda status, headers, exc_info=None: statuses.append(status))
    try:
        b"".join(result)
    finally:
        result.close()
    return int(statuses[0][:3])


_handler: dict[str, Any] = {}


@dataclass
class Trace:
    statements: list[str] = field(default_factory=list)
    transactions: int = 0

    @property
    def round_trips(self) -> int:
        """Statements, plus the BEGIN and COMMIT of each transaction."""
        return len(self.statements) + 2 * self.transactions


@contextmanager
def tracing() -> Iterator[Trace]:
    """Every statement Django sends, and every transaction it commits (psycopg sends BEGIN)."""
    from django.db import connection

    trace = Trace()

    def record(execute: Callable[..., Any], sql: str, *args: Any) -> Any:
        trace.statements.append(" ".join(sql.split()))
        return execute(sql, *args)

    original_commit = connection._commit

    def commit() -> None:
        trace.transactions += 1
        original_commit()

    connection._commit = commit  # type: ignore[method-assign]
    try:
        with connection.execute_wrapper(record):
            yield trace
    finally:
        connection._commit = original_commit  # type: ignore[method-assign]


@dataclass
class Captured:
    """The app's own claim and result write, as one request sent them (SQL and parameters)."""

    claim: tuple[str, list[Any]]
    write: tuple[str, list[Any]]
    #: Where the key's hash and the lock token are among the claim's parameters, and the
    #: record's id and the token among the write's (found by value: each store orders them
    #: its own way).
    claim_key: int
    claim_token: int
    write_pk: int
    write_token: int
    #: Atomic mode's read of a finished record before its transaction (issue 42), with where
    #: the key's hash is among its parameters; ``None``: the path sends none.
    read: tuple[str, list[Any]] | None = None
    read_key: int = 0


def capture(path: str) -> Captured | None:
    """The claim function's (or procedure's) call and the fenced result ``UPDATE`` of a first
    execution on ``path``; ``None`` where the claim is not one statement (no function or
    procedure)."""
    from django.db import connection

    sent: list[tuple[str, list[Any]]] = []

    def record(execute: Callable[..., Any], sql: str, params: Any, *args: Any) -> Any:
        sent.append((sql, list(params or [])))
        return execute(sql, params, *args)

    from django_idempotency import IdempotencyKey
    from django_idempotency._base.keys import hash_key

    key = str(uuid.uuid4())
    with connection.execute_wrapper(record):
        assert wsgi_call(path, key) == 201
    claims = [one for one in sent if "django_idempotency_claim(" in one[0]]
    reads = [
        one for one in sent if FINISHED_READ in one[0] and "django_idempotency_claim(" not in one[0]
    ]
    writes = [one for one in sent if one[0].startswith("UPDATE") and "idempotencykey" in one[0]]
    if len(claims) != 1 or len(writes) != 1:
        return None
    made = IdempotencyKey.objects.get(key_hash=hash_key(key))

    def token_at(params: list[Any]) -> int:
        return next(i for i, value in enumerate(params) if _is_token(value, made.lock_token))

    return Captured(
        claims[0],
        writes[0],
        claim_key=claims[0][1].index(made.key_hash),
        claim_token=token_at(claims[0][1]),
        write_pk=writes[0][1].index(made.pk),
        write_token=token_at(writes[0][1]),
        read=reads[0] if reads else None,
        read_key=reads[0][1].index(made.key_hash) if reads else 0,
    )


def _is_token(value: Any, token: uuid.UUID | None) -> bool:
    """Whether a parameter is ``token`` as the app sent it (a UUID, or its text)."""
    return value == token or (
        isinstance(value, str) and value in (str(token), getattr(token, "hex", None))
    )


def send_claim(cursor: Any, captured: Captured, key_hash: str) -> tuple[int, Any]:
    """The captured claim for ``key_hash`` with a fresh lock token; the record's id and token."""
    sql, params = captured.claim
    token = _as_sent(uuid.uuid4(), params[captured.claim_token])
    params = list(params)
    params[captured.claim_key] = key_hash
    params[captured.claim_token] = token
    cursor.execute(sql, params)
    pk = int(cursor.fetchone()[0])
    while cursor.nextset():  # MySQL's claim procedure: its status follows its row
        pass
    return pk, token


def _as_sent(token: uuid.UUID, sent: Any) -> Any:
    """A lock token in the form the app sent one: a UUID, or its text with or without dashes."""
    if not isinstance(sent, str):
        return token
    return token.hex if len(sent) == 32 else str(token)


#: What atomic mode's read of a finished record says, and no other statement of the app.
FINISHED_READ = "<> 'processing'"


def send_read(cursor: Any, captured: Captured, key_hash: str) -> None:
    """The captured read of a finished record (atomic mode's first statement) for ``key_hash``."""
    assert captured.read is not None
    sql, params = captured.read
    params = list(params)
    params[captured.read_key] = key_hash
    if isinstance(params[-1], int):  # the claim's clock: now
        params[-1] = time.time_ns() // 1000
    cursor.execute(sql, params)
    cursor.fetchall()


def send_write(cursor: Any, captured: Captured, pk: int, token: Any) -> None:
    """The captured result write, fenced by the record ``pk`` and its lock ``token``."""
    sql, params = captured.write
    params = list(params)
    params[captured.write_pk] = pk
    params[captured.write_token] = token
    cursor.execute(sql, params)
    assert cursor.rowcount == 1, "the result write matched no record"


def traced(path: str, key: str | None, expected: int) -> Trace:
    with tracing() as trace:
        status = wsgi_call(path, key)
    assert status == expected, f"{path} answered {status}, not {expected}"
    return trace


def statements() -> None:
    for _ in range(3):  # warm up: connection, caches, prepared plans, the app's one-time checks
        for path in PATHS.values():
            wsgi_call(path, str(uuid.uuid4()))
    bare = traced(PATHS["bare"], None, 201)
    print("## SQL statements per request")
    print()
    show("bare", bare, bare)
    for mode in ("two-phase", "atomic"):
        key = str(uuid.uuid4())
        show(f"{mode}, first execution", traced(PATHS[mode], key, 201), bare)
        show(f"{mode}, replay", traced(PATHS[mode], key, 201), bare, replay=True)
    if not has_peer():
        print()
        print("drf-idempotency is not installed: its paths are left out (pip install it).")
    for mode, url in PEER_PATHS.items() if has_peer() else ():
        for _ in range(3):
            wsgi_call(url, str(uuid.uuid4()))
        key = str(uuid.uuid4())
        show(f"drf-idempotency {mode}, first execution", traced(url, key, 201), bare)
        show(f"drf-idempotency {mode}, replay", traced(url, key, 201), bare, replay=True)
    print()


def show(label: str, trace: Trace, bare: Trace, *, replay: bool = False) -> None:
    """A path's statements; a replay's cost is all of them (the view does not run)."""
    baseline = Trace() if replay or label == "bare" else bare
    added = len(trace.statements) - len(baseline.statements)
    round_trips = trace.round_trips - baseline.round_trips
    summary = f"{label}: {len(trace.statements)} statements in {trace.transactions} transaction(s)"
    summary += f", {trace.round_trips} round trips"
    if label != "bare":
        verb = "costs" if replay else "adds"
        summary += f"; {verb} {added} statement(s), {round_trips} round trip(s)"
    print(summary)
    for sql in trace.statements:
        print(f"    {sql[:110]}{'...' if len(sql) > 110 else ''}")


#: The app's own statements of each path, timed alone (PostgreSQL): see statement_floors_of.
STATEMENTS = (
    "claim + write",
    "read, BEGIN, claim, write, COMMIT",
    "claim, live key",
    "read of a finished record",
)

#: The issue's goals for each path's ratio over the bare view (median latency).
GOALS = {
    "two-phase first": 1.70,
    "atomic first": 1.50,
    "two-phase replay": 0.85,
    "atomic replay": 1.00,
}


def latency(rounds: int, database: str) -> None:
    from django.db import connection

    from django_idempotency import IdempotencyKey
    from django_idempotency._base.keys import hash_key

    operations = [
        "bare",
        "two-phase first",
        "atomic first",
        "two-phase replay",
        "atomic replay",
        "django only",
    ]
    server = ["round trip", "indexed read", "durable commit"]
    peer = has_peer()
    if peer:
        operations += [f"peer {mode} {kind}" for kind in ("first", "replay") for mode in PEER_PATHS]
    captured = {mode: capture(PATHS[mode]) for mode in ("two-phase", "atomic")}
    two_phase, atomic = captured["two-phase"], captured["atomic"]
    if two_phase is not None and atomic is not None and atomic.read is not None:
        server += [*STATEMENTS]
    samples: dict[str, list[float]] = {name: [] for name in [*operations, *server]}
    clock = time.perf_counter_ns

    def timed(name: str, path: str, key: str | None) -> None:
        start = clock()
        status = wsgi_call(path, key)
        samples[name].append((clock() - start) / 1e6)
        assert status == 201, f"{name}: {status}"

    def timed_statements(name: str, call: Callable[[], None]) -> None:
        start = clock()
        call()
        samples[name].append((clock() - start) / 1e6)

    def app_statements(cursor: Any, keys: dict[str, str]) -> list[Callable[[], None]]:
        """The app's own statements of each path, sent alone, in the same rounds."""
        from django.db import transaction

        assert two_phase is not None and atomic is not None

        def two_phase_first() -> None:
            pk, token = send_claim(cursor, two_phase, keys["two-phase statements"])
            send_write(cursor, two_phase, pk, token)

        def atomic_first() -> None:
            send_read(cursor, atomic, keys["atomic statements"])  # a new key: no row
            with transaction.atomic():
                pk, token = send_claim(cursor, atomic, keys["atomic statements"])
                send_write(cursor, atomic, pk, token)

        def replay() -> None:
            send_claim(cursor, two_phase, keys["two-phase statements"])

        def atomic_replay() -> None:
            send_read(cursor, atomic, keys["atomic statements"])

        calls = [two_phase_first, atomic_first, replay, atomic_replay]
        return [
            partial(timed_statements, name, call)
            for name, call in zip(STATEMENTS, calls, strict=True)
        ]

    def timed_sql(cursor: Any, name: str, sql: str, params: list[Any] | None = None) -> None:
        start = clock()
        cursor.execute(sql, params)
        if cursor.description:
            cursor.fetchall()
        samples[name].append((clock() - start) / 1e6)

    # The replay's read, as Django sends it: a record by its scope and key, every column.
    wsgi_call(PATHS["two-phase"], "indexed-read")
    record = IdempotencyKey.objects.get(key_hash=hash_key("indexed-read"))
    read = f"SELECT * FROM {IdempotencyKey._meta.db_table} WHERE scope = %s AND key_hash = %s"
    warmup = 200
    started = time.monotonic()
    with connection.cursor() as cursor:
        serial = "bigint AUTO_INCREMENT" if connection.vendor == "mysql" else "bigserial"
        cursor.execute(f"CREATE TABLE bench_baseline (id {serial} PRIMARY KEY, n integer)")
        for index in range(warmup + rounds):
            keys = {"two-phase": str(uuid.uuid4()), "atomic": str(uuid.uuid4())}
            firsts = [
                partial(timed, "bare", PATHS["bare"], None),
                partial(timed, "django only", PATHS["django only"], None),
                partial(timed, "two-phase first", PATHS["two-phase"], keys["two-phase"]),
                partial(timed, "atomic first", PATHS["atomic"], keys["atomic"]),
                partial(timed_sql, cursor, "round trip", "SELECT 1"),
                partial(timed_sql, cursor, "indexed read", read, [record.scope, record.key_hash]),
                partial(
                    timed_sql, cursor, "durable commit", "INSERT INTO bench_baseline (n) VALUES (1)"
                ),
            ]
            replays = [
                partial(timed, "two-phase replay", PATHS["two-phase"], keys["two-phase"]),
                partial(timed, "atomic replay", PATHS["atomic"], keys["atomic"]),
            ]
            if peer:
                for mode, url in PEER_PATHS.items():
                    peer_key = str(uuid.uuid4())
                    firsts.append(partial(timed, f"peer {mode} first", url, peer_key))
                    replays.append(partial(timed, f"peer {mode} replay", url, peer_key))
            if "claim + write" in server:
                keys |= {
                    f"{mode} statements": uuid.uuid4().hex * 2 for mode in ("two-phase", "atomic")
                }
                statements_ = app_statements(cursor, keys)
                firsts += statements_[:2]
                replays += statements_[2:]
            one_round(firsts, replays, samples if index == warmup - 1 else None)
        cursor.execute("DROP TABLE bench_baseline")
    elapsed = time.monotonic() - started

    medians = {name: statistics.median(values) for name, values in samples.items()}
    bare = medians["bare"]
    floors = floors_of(medians)
    print(f"## Latency, one process, {rounds} interleaved rounds ({elapsed:.0f} s)")
    print()
    print(
        f"{'path':<22} {'median ms':>10} {'p90 ms':>8} {'/ bare':>7} {'floor':>6} "
        f"{'above it':>8}  goal"
    )
    for name in operations:
        p90 = statistics.quantiles(samples[name], n=10)[-1]
        line = f"{name:<22} {medians[name]:>10.3f} {p90:>8.3f} {medians[name] / bare:>7.2f}"
        if name in floors:
            ratio, floor = medians[name] / bare, floors[name][0] / bare
            verdict = "met" if ratio <= GOALS[name] else "MISSED"
            line += f" {floor:>6.2f} {ratio - floor:>+8.2f}  <= {GOALS[name]:.2f} {verdict}"
        print(line)
    print()
    print("This server, in the same rounds, through Django's cursor:")
    print(f"  round trip (SELECT 1):                       {medians['round trip']:.3f} ms")
    print(f"  indexed read (a record by scope and key):    {medians['indexed read']:.3f} ms")
    print(f"  durable commit (an autocommitted INSERT):    {medians['durable commit']:.3f} ms")
    print()
    print("Floors: the least each ratio can be on this server, from the figures above alone")
    print("(no Python of ours, no planning beyond the read's):")
    for name, (floor, why) in floors.items():
        print(f"  {name:<18} {floor / bare:.2f}  {why}")
    print()
    statement_floors = statement_floors_of(medians)
    if statement_floors:
        print("The app's own statements, sent alone through Django's cursor in the same rounds")
        print("(the claim function's call and the fenced result write, as a request sends them):")
        for name in STATEMENTS:
            print(f"  {name:<30} {medians[name]:.3f} ms")
        print()
        print("Floors with those statements: the least each ratio can be with no Python of the")
        print("app at all, and what the app's Python (and Django's cursor work for it) adds:")
        for name, (floor, why) in statement_floors.items():
            python = medians[name] - floor
            print(f"  {name:<18} {floor / bare:.2f}  app Python {python:+.3f} ms  ({why})")
        print()
    if peer:
        print(peer_table(medians))
    print(summary(database, medians))
    print()


def has_peer() -> bool:
    """Whether drf-idempotency is installed (the project then serves its paths)."""
    from benchmarks.overhead_project import views

    return bool(views.PEER)


def peer_table(medians: dict[str, float]) -> str:
    """Each path's ratio to the bare view, ours beside drf-idempotency's, from the same rounds."""
    bare = medians["bare"]
    lines = [
        "drf-idempotency (its decorator alone; inside transaction.atomic for atomic), timed in",
        "the same rounds: each path's median over the bare view's",
        f"  {'path':<18} {'ours':>6} {'drf-idempotency':>16}",
    ]
    for name in GOALS:
        ours, theirs = medians[name] / bare, medians[f"peer {name}"] / bare
        mark = "  (ours higher)" if ours > theirs else ""
        lines.append(f"  {name:<18} {ours:>6.2f} {theirs:>16.2f}{mark}")
    return "\n".join(lines) + "\n"


def telemetry_cost(rounds: int) -> None:
    """First executions and replays with the SDK's metrics and spans, and without any."""
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        MetricExporter,
        MetricExportResult,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    from django_idempotency._call import telemetry

    class NoMetrics(MetricExporter):
        def export(self, metrics_data: Any, timeout_millis: float = 0, **kwargs: Any) -> Any:
            return MetricExportResult.SUCCESS

        def force_flush(self, timeout_millis: float = 0) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 0, **kwargs: Any) -> None:
            pass

    class NoSpans(SpanExporter):
        def export(self, spans: Any) -> Any:
            return SpanExportResult.SUCCESS

    reader = PeriodicExportingMetricReader(NoMetrics(), export_interval_millis=1000)
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(NoSpans()))
    trace.set_tracer_provider(tracer_provider)
    assert telemetry.ENABLED, "opentelemetry-api is not installed"

    names = ["first, off", "first, SDK", "replay, off", "replay, SDK"]
    samples: dict[str, list[float]] = {name: [] for name in names}
    clock = time.perf_counter_ns

    def timed(name: str, key: str, enabled: bool) -> None:
        telemetry.ENABLED = enabled
        start = clock()
        status = wsgi_call(PATHS["two-phase"], key)
        samples[name].append((clock() - start) / 1e6)
        assert status == 201, f"{name}: {status}"

    warmup = 100
    for index in range(warmup + rounds):
        off, on = str(uuid.uuid4()), str(uuid.uuid4())
        firsts = [partial(timed, "first, off", off, False), partial(timed, "first, SDK", on, True)]
        replays = [
            partial(timed, "replay, off", off, False),
            partial(timed, "replay, SDK", on, True),
        ]
        one_round(firsts, replays, samples if index == warmup - 1 else None)
    telemetry.ENABLED = True
    tracer_provider.shutdown()
    medians = {name: statistics.median(values) for name, values in samples.items()}
    print(f"## OpenTelemetry, two-phase, {rounds} interleaved rounds")
    print()
    print(f"{'path':<14} {'median ms':>10} {'p90 ms':>8}  SDK costs")
    for name in names:
        p90 = statistics.quantiles(samples[name], n=10)[-1]
        line = f"{name:<14} {medians[name]:>10.3f} {p90:>8.3f}"
        if name.endswith("SDK"):
            off = medians[name.replace("SDK", "off")]
            line += f"  {medians[name] - off:+.3f} ms ({medians[name] / off - 1:+.1%})"
        print(line)
    print()


def one_round(
    firsts: list[Callable[[], None]],
    replays: list[Callable[[], None]],
    warmed_up: dict[str, list[float]] | None,
) -> None:
    """The first executions in random order, then their replays in random order, so the
    machine's noise falls on every path alike; ``warmed_up``: the samples to forget after it."""
    random.shuffle(firsts)
    random.shuffle(replays)
    for operation in [*firsts, *replays]:
        operation()
    for values in (warmed_up or {}).values():
        values.clear()


def summary(database: str, medians: dict[str, float]) -> str:
    """One line for the database: each path's ratio, its floor, its goal."""
    bare = medians["bare"]
    parts = []
    for name, (floor, _why) in floors_of(medians).items():
        ratio = medians[name] / bare
        mark = "" if ratio <= GOALS[name] else " MISSED"
        peer = medians.get(f"peer {name}")
        versus = "" if peer is None else f", drf-idempotency {peer / bare:.2f}"
        parts.append(
            f"{name} {ratio:.2f} (floor {floor / bare:.2f}, goal {GOALS[name]:.2f}{mark}{versus})"
        )
    return f"summary {database}: " + "; ".join(parts)


def floors_of(medians: dict[str, float]) -> dict[str, tuple[float, str]]:
    """Lower bounds on each protected path's latency, in ms, and what each one counts.

    A two-phase first execution commits the claim before the view and the response after it:
    two more durable commits than the bare view, each at least an autocommitted one-row
    ``INSERT``. An atomic one commits once, as the bare view does, but Django sends ``BEGIN``
    and ``COMMIT`` on their own, and the claim and the stored response are statements of their
    own: four more round trips. A replay is Django's handling with its authentication ("django
    only") and one indexed read of the record; in atomic mode inside ``BEGIN`` and ``COMMIT``.
    """
    bare, trip, commit = medians["bare"], medians["round trip"], medians["durable commit"]
    replay = medians["django only"] + medians["indexed read"]
    return {
        "two-phase first": (bare + 2 * commit, "bare + 2 durable commits"),
        "atomic first": (
            bare + 5 * trip,
            "bare + a read, 2 statements, BEGIN/COMMIT (5 round trips)",
        ),
        "two-phase replay": (replay, "django only (with its auth query) + 1 indexed read"),
        "atomic replay": (replay, "django only + 1 indexed read (no transaction)"),
    }


def statement_floors_of(medians: dict[str, float]) -> dict[str, tuple[float, str]]:
    """Each path's latency with the app's own statements but none of its Python, in ms.

    A two-phase first execution is the bare view plus the claim and the result write, each
    committed. An atomic one runs the view's ``INSERT`` inside the app's transaction, so the
    bare view's own durable commit becomes the transaction's: the transaction's time less a
    durable commit's flush (a durable commit less a round trip). A replay is Django's handling
    and the claim of a live key, in atomic mode inside ``BEGIN`` and ``COMMIT``. Empty where
    the statements were not timed (MySQL/MariaDB).
    """
    if not all(name in medians for name in STATEMENTS):
        return {}
    bare, django = medians["bare"], medians["django only"]
    flush = medians["durable commit"] - medians["round trip"]
    return {
        "two-phase first": (bare + medians["claim + write"], "bare + claim + write"),
        "atomic first": (
            bare + medians["read, BEGIN, claim, write, COMMIT"] - flush,
            "bare + read, BEGIN, claim, write, COMMIT - one flush",
        ),
        "two-phase replay": (django + medians["claim, live key"], "django only + claim"),
        "atomic replay": (
            django + medians["read of a finished record"],
            "django only + the read of a finished record",
        ),
    }


# --- gunicorn: requests per second ---------------------------------------------------------------


def throughput(args: argparse.Namespace, bench_url: str) -> None:
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "benchmarks.overhead_project.settings",
        "BENCH_DATABASE_URL": bench_url,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    command = [
        sys.executable,
        "-m",
        "gunicorn",
        "--workers",
        str(args.workers),
        "--worker-class",
        "sync",
        "--bind",
        f"127.0.0.1:{port}",
        "--log-level",
        "warning",
        *no_control_socket(),
        "benchmarks.overhead_project.wsgi:application",
    ]
    gunicorn = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_serving(url, gunicorn)
        results: dict[str, list[float]] = {name: [] for name in PATHS}
        for _ in range(args.runs):
            for name in random.sample(list(PATHS), len(PATHS)):
                results[name].append(asyncio.run(load(url + PATHS[name], name, args)))
    finally:
        os.killpg(gunicorn.pid, signal.SIGTERM)
        gunicorn.wait(timeout=30)
    print(
        f"## Throughput: gunicorn, {args.workers} sync workers; httpx client with "
        f"{args.concurrency} concurrent requests, on the same machine"
    )
    print(f"({args.runs} runs of {args.requests} requests per path, interleaved; median)")
    print()
    bare = statistics.median(results["bare"])
    for name, values in results.items():
        rps = statistics.median(values)
        label = f"{name} (first executions)" if name in ("two-phase", "atomic") else name
        print(f"{label:<28} {rps:>8.0f} requests/s  ({rps / bare:.2f} of bare)")
    print()


async def load(url: str, name: str, args: argparse.Namespace) -> float:
    import httpx

    remaining = iter(range(args.requests))
    limits = httpx.Limits(max_connections=args.concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:

        async def worker() -> None:
            headers = {"Content-Type": "application/json", "Authorization": f"Bearer {USER}"}
            for _ in remaining:
                if name != "bare":
                    headers["Idempotency-Key"] = str(uuid.uuid4())
                response = await client.post(url, content=BODY, headers=headers)
                assert response.status_code == 201, f"{name}: {response.status_code}"

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        return args.requests / (time.perf_counter() - started)


def wait_until_serving(url: str, process: subprocess.Popen[bytes]) -> None:
    import httpx

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit("gunicorn exited at start")
        try:
            httpx.post(url + PATHS["bare"], content=BODY, timeout=2)
            return
        except httpx.TransportError:
            time.sleep(0.2)
    raise SystemExit("gunicorn did not serve within 30 s")


def no_control_socket() -> list[str]:
    """Recent gunicorns open a control socket shared by every instance; this one needs none."""
    from gunicorn.config import KNOWN_SETTINGS

    if any(setting.name == "control_socket_disable" for setting in KNOWN_SETTINGS):
        return ["--no-control-socket"]
    return []


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- the database ------------------------------------------------------------------------------


if __name__ == "__main__":
    main()
