#!/usr/bin/env python
"""The two stores side by side (issue 44): this app's Redis store, its PostgreSQL store, and
drf-idempotency's Redis backend (the peer), in one run, on one view.

The view is the overhead benchmark's (``benchmarks/overhead_project/``: authenticate one user by
a query, parse a JSON body, insert a row into PostgreSQL, render it), served bare, protected by
this app with its records in Redis (``store="redis"``, a Django ``RedisCache`` alias) and in
PostgreSQL (the default store, two-phase), and by drf-idempotency's decorator with its
``RedisBackend`` (``pip install drf-idempotency``). Every request goes through Django's WSGI
handler in this process. In each round the paths run in a random order, each a first execution
with a fresh key, then every path's replay (see :func:`measure`), so the machine's noise
falls on all of them alike; the medians (p50) and 90th percentiles are printed, and the ratio
of ours to the peer's, round by round, with its spread (quartiles, and a bootstrap interval of
its median): the figure that stays put when the machine's load moves the others.

With ``--instructions`` it also counts each path's instructions per request under valgrind's
callgrind, as ``benchmarks/instructions.py`` does (the helper it compiles), in this
interpreter's environment (not the pinned one: compare these figures with each other).

It creates its own database on the server (``--database``) and drops it at the end; Redis keys
go to ``--redis`` (a db number of its own), emptied before and after. From the repository
root::

    /work/venv/bin/python benchmarks/stores.py \\
        --server postgres://postgres@127.0.0.1:5432/test --redis redis://127.0.0.1:6379/9
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.instructions import uptime  # noqa: E402

#: Each path: its name and URL (``None``: the bare view, sent without a key).
PATHS = [
    ("ours, Redis", "/two-phase-redis/"),
    ("ours, PostgreSQL", "/two-phase/"),
    ("drf-idempotency, Redis", "/peer-two-phase/"),
]
BARE = ("bare view", "/bare/")
PEER_PREFIX = "bench-peer:"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default="postgres://postgres@127.0.0.1:5432/test")
    parser.add_argument("--database", default="bench_stores", help="created, then dropped")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/9", help="emptied")
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--instructions", action="store_true", help="callgrind counts too")
    parser.add_argument("--requests", type=int, default=20, help="per path, under callgrind")
    parser.add_argument("--stage", choices=["measure", "count"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.database.isidentifier():
        parser.error("--database must be a plain identifier")
    os.environ["BENCH_DATABASE_URL"] = urlunsplit(
        urlsplit(args.server)._replace(path=f"/{args.database}")
    )
    os.environ["BENCH_REDIS_URL"] = args.redis
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.overhead_project.settings"
    if args.stage == "count":
        count(args)
        return
    from benchmarks.databases import drop_database
    from benchmarks.instructions import prepare

    before = uptime()
    _flush(args.redis)
    prepare(args.server, args.database)
    try:
        timings = measure(args)
        counts = instructions(args) if args.instructions else {}
    finally:
        from django.db import connections

        connections.close_all()
        drop_database(args.server, args.database)
        _flush(args.redis)
    report(args, timings, counts, before, uptime())


def _flush(url: str) -> None:
    import redis

    redis.Redis.from_url(url).flushdb()


def _peer(url: str) -> None:
    """drf-idempotency on its Redis backend (its backend is one per process, set here)."""
    import drf_idempotency.core
    from drf_idempotency.backends.redis import RedisBackend

    drf_idempotency.core._backend_instance = RedisBackend(url=url, key_prefix=PEER_PREFIX)


def _send(path: str, key: str | None) -> float:
    from benchmarks.overhead import wsgi_call

    started = time.perf_counter()
    status = wsgi_call(path, key)
    elapsed = time.perf_counter() - started
    assert status == 201, f"{path}: {status}"
    return elapsed


def measure(args: argparse.Namespace) -> dict[str, list[float]]:
    """Each round: every path's first execution with a fresh key, then every replay, the
    paths in an order reversed from one round to the next (ours and the peer's run side by
    side, each first as often as the other), so that the machine's noise falls on both alike
    and each round's ratio (ours / the peer's) compares requests a millisecond apart."""
    _peer(args.redis)
    timings: dict[str, list[float]] = {BARE[0]: []}
    for name, _ in PATHS:
        timings[f"{name}: first"] = []
        timings[f"{name}: replay"] = []
    order = [*PATHS, BARE]
    for round_ in range(args.warmup + args.rounds):
        random.shuffle(order)
        if round_ % 2:
            order.reverse()
        keys = {path: str(uuid.uuid4()) for _, path in PATHS}
        took: dict[str, float] = {}
        for name, path in order:
            if path == BARE[1]:
                took[name] = _send(path, None)
            else:
                took[f"{name}: first"] = _send(path, keys[path])
        for name, path in reversed(order):
            if path != BARE[1]:
                took[f"{name}: replay"] = _send(path, keys[path])
        if round_ >= args.warmup:
            for name, value in took.items():
                timings[name].append(value)
    return timings


def ratios(ours: list[float], peer: list[float]) -> tuple[float, float, float, float, float]:
    """The rounds' ratios (ours / the peer's, one round's two requests side by side): their
    median, 25th and 75th percentiles, and a bootstrap 95% interval of the median."""
    each = [a / b for a, b in zip(ours, peer, strict=True)]
    q1, median, q3 = statistics.quantiles(each, n=4)
    rng = random.Random(44)
    medians = sorted(statistics.median(rng.choices(each, k=len(each))) for _ in range(1000))
    return median, q1, q3, medians[25], medians[974]


def instructions(args: argparse.Namespace) -> dict[str, float]:
    """Each path's instructions per request, counted by callgrind in a process of its own."""
    from benchmarks.instructions import compile_helper, dumps

    with tempfile.TemporaryDirectory(prefix="stores-") as out:
        helper = compile_helper(Path(out))
        command = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            "--collect-atstart=no",
            f"--callgrind-out-file={out}/callgrind.out.%p",
            sys.executable,
            str(Path(__file__).resolve()),
            "--stage",
            "count",
            "--server",
            args.server,
            "--database",
            args.database,
            "--redis",
            args.redis,
            "--requests",
            str(args.requests),
        ]
        env = {**os.environ, "PYTHONHASHSEED": "0", "BENCH_CALLGRIND_HELPER": str(helper)}
        done = subprocess.run(command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
        if done.returncode:
            sys.stderr.write(done.stderr[-5000:])
            raise SystemExit(f"the counting process failed (exit {done.returncode})")
        totals = dumps(Path(out))
    return {name: value / args.requests for name, value in totals.items()}


def count(args: argparse.Namespace) -> None:
    """Under valgrind: warm every path up, then count each one's requests alone."""
    import ctypes

    import django

    django.setup()
    _peer(args.redis)
    helper = ctypes.CDLL(os.environ["BENCH_CALLGRIND_HELPER"])
    helper.bench_stop.argtypes = [ctypes.c_char_p]
    for _, path in PATHS:
        for _ in range(5):
            key = str(uuid.uuid4())
            _send(path, key)
            _send(path, key)
    for _ in range(5):
        _send(BARE[1], None)
    plan: list[tuple[str, str, list[str | None]]] = [(BARE[0], BARE[1], [None] * args.requests)]
    for name, path in PATHS:
        keys: list[str | None] = [str(uuid.uuid4()) for _ in range(args.requests)]
        plan += [(f"{name}: first", path, keys), (f"{name}: replay", path, keys)]
    for name, path, keys in plan:
        gc.collect()
        gc.disable()
        helper.bench_start()
        for key in keys:
            _send(path, key)
        helper.bench_stop(name.encode())
        gc.enable()


def report(
    args: argparse.Namespace,
    timings: dict[str, list[float]],
    counts: dict[str, float],
    before: str,
    after: str,
) -> None:
    from importlib.metadata import version

    import django
    import redis

    server = redis.Redis.from_url(args.redis).info("server")["redis_version"]
    print(f"# The stores side by side ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
    print(
        f"Python {sys.version.split()[0]}, Django {django.get_version()}, redis-py "
        f"{version('redis')}, Redis {server}, drf-idempotency {version('drf-idempotency')}, "
        f"{args.rounds} rounds after {args.warmup} of warm-up"
    )
    print(f"load before: {before}")
    print(f"load after:  {after}")
    print()
    header = f"{'path':<36}{'p50 ms':>9}{'p90 ms':>9}{'over bare p50':>15}"
    if counts:
        header += f"{'instructions':>15}{'over bare':>12}"
    print(header)
    bare = statistics.median(timings[BARE[0]])
    bare_count = counts.get(BARE[0], 0.0)
    for name, values in timings.items():
        p50 = statistics.median(values)
        p90 = statistics.quantiles(values, n=10)[-1]
        line = f"{name:<36}{p50 * 1e3:>9.3f}{p90 * 1e3:>9.3f}{(p50 - bare) * 1e3:>+15.3f}"
        if counts:
            n = counts.get(name, 0.0)
            line += f"{n / 1e6:>14.2f}M{(n - bare_count) / 1e6:>+11.2f}M"
        print(line)
    print()
    print("ours / drf-idempotency, each round's two requests side by side:")
    for stage in ("first", "replay"):
        median, q1, q3, low, high = ratios(
            timings[f"{PATHS[0][0]}: {stage}"], timings[f"{PATHS[2][0]}: {stage}"]
        )
        print(
            f"  {stage:<7} ratio median {median:.3f} (quartiles {q1:.3f}-{q3:.3f}, "
            f"95% interval of the median {low:.3f}-{high:.3f})"
        )


if __name__ == "__main__":
    main()
