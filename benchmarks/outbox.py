"""The outbox's figures for docs/outbox.rst (issue 41): delivery latency (fast path; relay woken
by LISTEN/NOTIFY; relay polling), the relay's throughput, and what ``enqueue`` adds to a call.

    python benchmarks/outbox.py --server postgres://postgres@127.0.0.1:5432/test \\
        --database bench_outbox_figures [--calls 300]

It makes (and drops) a database of its own on the server, runs ``idempotent_function`` calls
in this process, and hands messages to a stand-in broker that records when it was called (a
real broker's ``apply_async`` adds its own round trip, about a millisecond to a local
RabbitMQ). Latency is from the protected function's return (before its result write) to the
broker's call.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.databases import create_database, drop_database


class Broker:
    """Records when each message reached it (``time.perf_counter()``), by task id."""

    name = "benchmarks.outbox.BROKER"

    def __init__(self) -> None:
        self.at: dict[str, float] = {}

    def apply_async(self, args: Any, kwargs: Any, *, task_id: str) -> None:
        self.at[task_id] = time.perf_counter()


BROKER = Broker()


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--database", default="bench_outbox_figures")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--messages", type=int, default=5000)
    options = parser.parse_args()
    base = options.server.rsplit("/", 1)[0]
    create_database(options.server, options.database)
    os.environ["DATABASE_URL"] = f"{base}/{options.database}"
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    try:
        run(options)
    finally:
        from django.db import connections

        connections.close_all()
        drop_database(options.server, options.database)


def run(options: argparse.Namespace) -> None:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test import override_settings
    from django.test.utils import CaptureQueriesContext

    from django_idempotency import Claim, idempotent_function
    from django_idempotency._ops.relay import Relay
    from django_idempotency._store import outbox as store
    from django_idempotency.models import OutboxMessage

    call_command("migrate", verbosity=0)
    returned: dict[str, float] = {}

    @idempotent_function(key="n", name="benchmarks.outbox.order")
    def order(n: int, stage: bool, *, idempotency: Claim) -> None:
        if stage:
            message = idempotency.enqueue(BROKER, n)
            returned[message] = time.perf_counter()

    counter = iter(range(10**9))

    def latencies(calls: int, pause: float) -> list[float]:
        BROKER.at.clear()
        returned.clear()
        for _ in range(calls):
            order(n=next(counter), stage=True)
            time.sleep(pause)
        deadline = time.monotonic() + 30
        while len(BROKER.at) < calls and time.monotonic() < deadline:
            time.sleep(0.01)
        return [(BROKER.at[m] - returned[m]) * 1000 for m in returned if m in BROKER.at]

    def show(label: str, values: list[float]) -> None:
        print(
            f"{label:<40} p50 {percentile(values, 0.5):8.2f} ms   "
            f"p99 {percentile(values, 0.99):8.2f} ms   (n={len(values)})"
        )

    show("fast path", latencies(options.calls, 0.005))

    with override_settings(IDEMPOTENCY={"OUTBOX_FAST_PATH": False}):
        for label, listen in (("relay, LISTEN/NOTIFY", True), ("relay, polling every 1 s", False)):
            relay = Relay("default", interval=1.0)
            if not listen:
                store_listening = store.listening
                store.listening = lambda connection: None  # type: ignore[assignment]
            thread = threading.Thread(target=relay.run)
            thread.start()
            time.sleep(0.5)
            try:
                show(label, latencies(min(options.calls, 100), 0.02))
            finally:
                relay.stop()
                thread.join()
                if not listen:
                    store.listening = store_listening

        OutboxMessage.objects.all().delete()
        BROKER.at.clear()
        for _ in range(options.messages // 50):
            with_ids = [next(counter) for _ in range(50)]

            @idempotent_function(key="n", name="benchmarks.outbox.bulk")
            def bulk(n: int, *, idempotency: Claim) -> None:
                for index in range(50):
                    idempotency.enqueue(BROKER, n, index)

            bulk(n=with_ids[0])
        pending = OutboxMessage.objects.filter(state="pending").count()
        started = time.perf_counter()
        Relay("default", batch_size=100).run(once=True)
        elapsed = time.perf_counter() - started
        print(
            f"{'relay throughput (batches of 100)':<40} {pending / elapsed:8.0f} messages/s "
            f"({pending} in {elapsed:.2f} s)"
        )

    for stage in (False, True):
        with CaptureQueriesContext(connection) as queries:
            order(n=next(counter), stage=stage)
        print(f"{'statements, ' + ('one message' if stage else 'no message'):<40} {len(queries)}")
    for stage in (False, True):
        started = time.perf_counter()
        for _ in range(200):
            order(n=next(counter), stage=stage)
        per_call = (time.perf_counter() - started) / 200 * 1e6
        print(f"{'call, ' + ('one message' if stage else 'no message'):<40} {per_call:8.0f} us")


if __name__ == "__main__":
    sys.modules["benchmarks.outbox"] = sys.modules["__main__"]  # the relay imports BROKER
    main()
