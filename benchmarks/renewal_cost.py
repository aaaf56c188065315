"""Benchmark: renewing the locks of 100 attempts in flight, one statement against one each.

A script, not a test: it prints figures and asserts nothing. The shared renewer of
``django_idempotency._call.heartbeat`` renews every live attempt of a process in one ``UPDATE``; a
thread per attempt would send one ``UPDATE`` per attempt. It creates its own PostgreSQL
database (``bench_renewal`` by default), drops it at the end, and prints the time of each way
per renewal interval.

    python benchmarks/renewal_cost.py --url postgres://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="postgres://postgres@127.0.0.1:5432/test")
    parser.add_argument("--database", default="bench_renewal")
    parser.add_argument("--attempts", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    with psycopg.connect(args.url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{args.database}"')
        admin.execute(f'CREATE DATABASE "{args.database}"')
    try:
        run(args.url.rsplit("/", 1)[0] + "/" + args.database, args.attempts, args.rounds)
    finally:
        with psycopg.connect(args.url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')


def run(url: str, attempts: int, rounds: int) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from django_idempotency import IdempotencyKey
    from django_idempotency import _store as store

    call_command("migrate", verbosity=0)
    now = timezone.now()
    IdempotencyKey.objects.bulk_create(
        IdempotencyKey(
            scope="bench",
            key_hash=uuid.uuid4().hex * 2,
            method="POST",
            path="/",
            request_hash="x",
            status=IdempotencyKey.Status.PROCESSING,
            lock_token=uuid.uuid4(),
            unlock_at=now + timedelta(seconds=30),
            expires_at=now + timedelta(days=1),
        )
        for _ in range(attempts)
    )
    leases = list(IdempotencyKey.objects.values_list("pk", "lock_token"))
    lock_timeout = timedelta(seconds=30)

    def shared() -> None:
        assert len(store.using("default").renew(leases, lock_timeout)) == attempts

    def per_attempt() -> None:
        for lease in leases:
            assert store.using("default").renew([lease], lock_timeout)

    ways: list[tuple[str, Callable[[], None]]] = [
        ("one statement for all (shared renewer)", shared),
        (f"{attempts} statements (a thread per attempt)", per_attempt),
    ]
    for name, renew in ways:
        renew()
        begun = time.perf_counter()
        for _ in range(rounds):
            renew()
        per_interval = (time.perf_counter() - begun) / rounds * 1000
        print(f"{connection.vendor}, {attempts} attempts, {name}: {per_interval:.2f} ms")
    connection.close()


if __name__ == "__main__":
    main()
