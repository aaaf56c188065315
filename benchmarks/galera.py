"""Benchmark: the store on a three-node MariaDB Galera cluster, against one MariaDB server.

A script, not a test: it prints figures and asserts only that the store answered as expected.
It creates its own database (``--name``) on the cluster and on the single server, and drops
both at the end. Two parts:

``latency``
    The p50/p99 of a claim of a new key and of a claim of a completed key (what a replay reads)
    through each node and through the single server, the same number of rounds each,
    interleaved: every round visits every target once, in a rotating order, so that the noise
    of a shared machine falls on all alike. The nodes' connections use causal reads
    (``wsrep_sync_wait``, as ``docs/scale.rst`` recommends).

``cleanup``
    ``idempotency_cleanup`` through node 1 on ``--rows`` expired rows, in ``--rounds`` runs of
    ``--limit rows/rounds``, alternating with the same claim stream alone; the stream (one
    process, one claim of a fresh key after another) goes through ``--stream-node``. Then the
    same rows again, deleted by two cleanups at once through nodes 1 and 2: the time, the rows
    each deleted and the deadlocks (1213) each met and retried. It reports the writesets the
    cleanup replicated (``wsrep_replicated``, ``wsrep_replicated_bytes`` on node 1).

The cluster is the one ``python -m tests.galera.harness start`` left running (its state file),
unless ``--nodes`` names three URLs::

    python -m tests.galera.harness start
    python benchmarks/galera.py --single mysql://root@127.0.0.1:3306/test
    python -m tests.galera.harness stop
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import sys
import time
import uuid
from collections.abc import Callable
from io import StringIO
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dj_database_url

from benchmarks.cleanup import FILL_SQL_MYSQL, p99, summary
from benchmarks.cleanup import claim as cleanup_claim
from benchmarks.databases import create_database, drop_database

NODES = ("node1", "node2", "node3")
FILL_CHUNK = 10_000  # rows per fill statement: a writeset of a few MB, not one of 200,000 rows


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--nodes", nargs=3, metavar="URL", help="the three nodes (default: the harness's cluster)"
    )
    parser.add_argument(
        "--single",
        default="mysql://root@127.0.0.1:3306/test",
        help="the single MariaDB server to compare with",
    )
    parser.add_argument("--name", default="bench_galera", help="the database to create on both")
    parser.add_argument(
        "--part", choices=["all", "latency", "cleanup"], default="all", help="what to measure"
    )
    parser.add_argument("--latency-rounds", type=int, default=1000, help="claims per target")
    parser.add_argument("--sync-wait", type=int, default=7, help="the nodes' wsrep_sync_wait")
    parser.add_argument("--rows", type=int, default=200_000, help="expired rows to clean up")
    parser.add_argument("--batch-size", type=int, default=1000, help="the cleanup's")
    parser.add_argument("--rounds", type=int, default=4, help="alternations with/without")
    parser.add_argument("--stream-node", choices=NODES, default="node2", help="the claims' node")
    return parser.parse_args()


def node_urls(args: argparse.Namespace) -> list[str]:
    if args.nodes:
        return list(args.nodes)
    from tests.galera.harness import Cluster

    return [node.url for node in Cluster.load().nodes]


def setup_django(urls: dict[str, str], name: str, sync_wait: int) -> None:
    import django
    from django.conf import settings

    databases = {}
    for alias, url in urls.items():
        config = dj_database_url.parse(url)
        config["NAME"] = name
        if alias != "single":
            config["OPTIONS"] = {"init_command": f"SET SESSION wsrep_sync_wait = {sync_wait}"}
        databases[alias] = config
    databases["default"] = databases["node1"]
    settings.configure(
        DATABASES=databases,
        INSTALLED_APPS=["django_idempotency"],
        USE_TZ=True,
        TIME_ZONE="UTC",
        LOGGING_CONFIG=None,
    )
    django.setup()


def wait_for_database(alias: str, timeout: float = 30.0) -> None:
    """A node may apply the ``CREATE DATABASE`` a moment after node 1 has answered."""
    from django.db import connections

    deadline = time.monotonic() + timeout
    while True:
        try:
            connections[alias].ensure_connection()
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def claim(alias: str, key_hash: str, scope: str = "bench:galera") -> Any:
    return cleanup_claim(alias, key_hash, scope)


def fresh_hash() -> str:
    return hashlib.sha256(uuid.uuid4().bytes).hexdigest()


def completed_key(alias: str) -> str:
    """A key claimed and completed through ``alias``: claiming it again is a replay."""
    from django_idempotency import Claim
    from django_idempotency import _store as store

    key_hash = fresh_hash()
    claimed = claim(alias, key_hash)
    assert isinstance(claimed, Claim), claimed
    stored = store.StoredResponse(201, [["Content-Type", "application/json"]], b'{"id": 1}')
    assert store.using(alias).store_response(claimed.pk, claimed.lock_token, stored)
    return key_hash


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = call()
    return time.perf_counter() - started, result


def latency(targets: list[str], rounds: int) -> None:
    from django_idempotency import Claim, IdempotencyKey

    replayed = {alias: completed_key(alias) for alias in targets}
    samples: dict[str, dict[str, list[float]]] = {a: {"claim": [], "replay": []} for a in targets}
    warmup = 20
    for round_ in range(warmup + rounds):
        shift = round_ % len(targets)
        for alias in targets[shift:] + targets[:shift]:
            elapsed, outcome = timed(lambda: claim(alias, fresh_hash()))  # noqa: B023
            assert isinstance(outcome, Claim), outcome
            if round_ >= warmup:
                samples[alias]["claim"].append(elapsed)
            elapsed, outcome = timed(lambda: claim(alias, replayed[alias]))  # noqa: B023
            assert isinstance(outcome, IdempotencyKey) and outcome.status == "completed"
            if round_ >= warmup:
                samples[alias]["replay"].append(elapsed)
    print(f"latency: {rounds} rounds, each target once a round in a rotating order")
    for alias in targets:
        for kind in ("claim", "replay"):
            print(f"  {alias:<7} {kind:<7} {summary(samples[alias][kind])}")


# The cleanup ---------------------------------------------------------------------------------


def fill(alias: str, first: int, last: int) -> float:
    from django.db import connections

    started = time.perf_counter()
    with connections[alias].cursor() as cursor:
        for start in range(first, last + 1, FILL_CHUNK):
            cursor.execute(FILL_SQL_MYSQL, [start, min(last, start + FILL_CHUNK - 1)])
    return time.perf_counter() - started


def expired(alias: str) -> int:
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT COUNT(*) FROM django_idempotency_idempotencykey"
            " WHERE expires_at <= UTC_TIMESTAMP(6)"
        )
        return int(cursor.fetchone()[0])


def replicated(alias: str) -> tuple[int, int]:
    """Writesets this node has replicated so far, and their bytes."""
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute("SHOW GLOBAL STATUS LIKE 'wsrep_replicated%'")
        status = dict(cursor.fetchall())
    return int(status["wsrep_replicated"]), int(status["wsrep_replicated_bytes"])


def stream(alias: str, stop: Any, results: Any) -> None:
    """In a child process: claim fresh keys through ``alias`` until told to stop."""
    from django.db import connections

    connections.close_all()  # never share the parent's socket
    latencies: list[float] = []
    while not stop.is_set():
        latencies.append(timed(lambda: claim(alias, fresh_hash(), "bench:stream"))[0])
    connections.close_all()
    results.put(latencies)


def cleanup(alias: str, batch_size: int, limit: int | None) -> dict[str, Any]:
    """``idempotency_cleanup`` through ``alias``: its time, its output and the deadlocks
    (1213, at a statement or at ``COMMIT``) its batches met; the store runs the victim's batch
    again, a few times, and then fails the command (``error``)."""
    from django.core.management import call_command
    from django.db import connections

    from django_idempotency._store.mysql import DEADLOCK, MySQLStore, error_code

    deadlocks = [0]
    original = MySQLStore._delete_batch

    def counted(self: MySQLStore, connection: Any, batch: Any) -> Any:
        try:
            return original(self, connection, batch)
        except Exception as exc:
            if error_code(exc) == DEADLOCK:
                deadlocks[0] += 1
            raise

    out = StringIO()
    options: dict[str, Any] = {"batch_size": batch_size, "database": alias, "stdout": out}
    if limit is not None:
        options["limit"] = limit
    MySQLStore._delete_batch = counted  # type: ignore[method-assign]
    started = time.perf_counter()
    error = None
    try:
        call_command("idempotency_cleanup", **options)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        MySQLStore._delete_batch = original  # type: ignore[method-assign]
    elapsed = time.perf_counter() - started
    connections[alias].close()
    output = out.getvalue().strip()
    deleted = next((int(line.split()[1]) for line in output.splitlines() if "Deleted" in line), 0)
    return {
        "alias": alias,
        "elapsed": elapsed,
        "deleted": deleted,
        "deadlocks": deadlocks[0],
        "error": error,
    }


def in_child(target: Callable[..., Any], *args: Any) -> tuple[Any, Any]:
    """``target(*args, results)`` in a forked process; the process and its result queue."""
    from django.db import connections

    connections.close_all()
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=target, args=(*args, results))
    child.start()
    return child, results


def cleanup_into(alias: str, batch_size: int, limit: int | None, results: Any) -> None:
    results.put(cleanup(alias, batch_size, limit))


def run_stream(alias: str, during: Callable[[], Any] | None, seconds: float) -> tuple[list, Any]:
    from django.db import connections

    connections.close_all()
    context = multiprocessing.get_context("fork")
    stop, results = context.Event(), context.Queue()
    child = context.Process(target=stream, args=(alias, stop, results))
    child.start()
    time.sleep(0.5)  # the stream is warm
    outcome = during() if during is not None else time.sleep(seconds)
    stop.set()
    latencies = results.get(timeout=600)
    child.join(timeout=60)
    return latencies, outcome


def cleanup_figures(args: argparse.Namespace) -> None:
    from django.db import connections

    with connections["node1"].cursor() as cursor:
        cursor.execute("SELECT @@wsrep_max_ws_rows, @@wsrep_max_ws_size")
        max_rows, max_size = cursor.fetchone()
    print(f"cleanup: wsrep_max_ws_rows={max_rows} wsrep_max_ws_size={max_size}")

    seconds = fill("node1", 1, args.rows)
    print(f"filled {args.rows:,} expired rows through node1 in {seconds:.1f} s")
    slice_size = -(-args.rows // args.rounds)
    without: list[float] = []
    during: list[float] = []
    runs = []
    before = replicated("node1")
    for _round in range(args.rounds):
        run = lambda: cleanup("node1", args.batch_size, slice_size)  # noqa: E731
        latencies, outcome = run_stream(args.stream_node, run, 0)
        during += latencies
        runs.append(outcome)
        latencies, _ = run_stream(args.stream_node, None, outcome["elapsed"])
        without += latencies
    now = replicated("node1")
    writesets, written = now[0] - before[0], now[1] - before[1]
    deleted = sum(run["deleted"] for run in runs)
    elapsed = sum(run["elapsed"] for run in runs)
    print(
        f"idempotency_cleanup --batch-size {args.batch_size} through node1: "
        f"{deleted:,} rows in {elapsed:.1f} s = {deleted / elapsed:,.0f} rows/s "
        f"({args.rounds} runs of --limit {slice_size})"
    )
    print(
        f"  writesets replicated by node1: {writesets:,}, {written / max(writesets, 1) / 1024:.0f}"
        f" KiB each on average ({written / 1024 / 1024:.1f} MiB)"
    )
    print(f"  claims through {args.stream_node} without cleanup: {summary(without)}")
    print(f"  claims through {args.stream_node} during cleanup:  {summary(during)}")
    print(f"  p99 ratio during/without: {p99(during) / p99(without):.2f}")
    print(f"  expired rows left: {expired('node3')}")

    live = completed_key("node3")
    seconds = fill("node1", 1, args.rows)
    print(f"filled {args.rows:,} expired rows again in {seconds:.1f} s")
    started = time.perf_counter()
    children = [in_child(cleanup_into, alias, args.batch_size, None) for alias in NODES[:2]]
    outcomes = [results.get(timeout=1200) for _child, results in children]
    elapsed = time.perf_counter() - started
    for child, _results in children:
        child.join(timeout=60)
    left = expired("node3")
    print(
        f"two cleanups at once, through node1 and node2: {args.rows - left:,} rows deleted"
        f" in {elapsed:.1f} s in all"
    )
    for outcome in outcomes:
        print(
            f"  {outcome['alias']}: {outcome['deleted']:,} rows in {outcome['elapsed']:.1f} s, "
            f"{outcome['deadlocks']} deadlocks (1213) met"
            + (f"; FAILED: {outcome['error']}" if outcome["error"] else "")
        )
    from django_idempotency import IdempotencyKey

    held = claim("node2", live)
    assert isinstance(held, IdempotencyKey) and held.status == "completed", held
    print(f"  expired rows left: {left}; the live record is still there")
    if any(outcome["error"] for outcome in outcomes):
        print("  (the rows a failed run left are deleted by the next run)")


def main() -> None:
    args = parse_args()
    nodes = node_urls(args)
    urls = {"single": args.single, **dict(zip(NODES, nodes, strict=True))}
    for url in (args.single, nodes[0]):
        create_database(url, args.name)
    try:
        setup_django(urls, args.name, args.sync_wait)
        from django.core.management import call_command
        from django.db import connections

        for alias in NODES[1:]:
            wait_for_database(alias)
        for alias in ("single", "node1"):
            call_command("migrate", database=alias, verbosity=0)
        with connections["node1"].cursor() as cursor:
            cursor.execute("SELECT VERSION()")
            (version,) = cursor.fetchone()
            cursor.execute("SHOW STATUS LIKE 'wsrep_cluster_size'")
            size = cursor.fetchone()[1]
        print(
            f"Galera cluster of {size} ({version}) vs single server; {os.cpu_count()} CPUs; "
            f"wsrep_sync_wait={args.sync_wait} on the nodes"
        )
        if args.part in ("all", "latency"):
            latency(["single", *NODES], args.latency_rounds)
        if args.part in ("all", "cleanup"):
            cleanup_figures(args)
        connections.close_all()
    finally:
        for url in (args.single, nodes[0]):
            drop_database(url, args.name)


if __name__ == "__main__":
    main()
