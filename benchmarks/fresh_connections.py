"""The claim on a fresh server connection (``CONN_MAX_AGE = 0``): the function and the statement.

Each case opens a new connection, then times the claim alone, sent as Django sends it (client-side
binding); cases are interleaved in a random order per round. The database needs the app's
migrations (the tests' settings, with DATABASE_URL naming it)::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/scratch python -m django migrate \\
        --settings tests.settings
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/scratch python -m benchmarks.fresh_connections
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
import uuid
from datetime import timedelta
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    rounds = parser.parse_args().rounds
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    import psycopg
    from django.db import connection
    from django.utils import timezone

    from django_idempotency._store.postgresql import (
        PostgreSQLStatements,
        PostgreSQLStore,
        interval,
    )

    connection.ensure_connection()
    statements = PostgreSQLStore("default").statements(connection)
    assert isinstance(statements, PostgreSQLStatements)
    url = os.environ["DATABASE_URL"]

    def claim(key: str, function: bool) -> tuple[str, list[Any]]:
        identity = ["bench", key, "POST", "/x/", "f" * 64, str(uuid.uuid4())]
        if function:  # as PostgreSQLStore.insert_or_load sends it: the clock, then the rest
            clock = time.time_ns() // 1000
            durations = [interval(timedelta(minutes=1)), interval(timedelta(hours=1))]
            return statements.call, [clock, *identity, *durations, None]
        now = timezone.now()
        times = [now, now, now + timedelta(minutes=1), now + timedelta(hours=1)]
        return statements.insert_or_select, [*identity, *times, "bench", key]

    def connect() -> psycopg.Connection[Any]:
        return psycopg.connect(url, autocommit=True, cursor_factory=psycopg.ClientCursor)

    replayed = uuid.uuid4().hex
    with connect() as conn:
        conn.execute(*claim(replayed, function=True))
    cases = ["function, first", "statement, first", "function, replay", "statement, replay"]
    times: dict[str, list[float]] = {case: [] for case in [*cases, "connect + SELECT 1"]}
    for _ in range(rounds):
        for case in random.sample(cases, len(cases)):
            sql, params = claim(
                replayed if "replay" in case else uuid.uuid4().hex, case.startswith("function")
            )
            started = time.perf_counter()
            with connect() as conn:
                conn.execute("SELECT 1")
                connected = time.perf_counter()
                conn.execute(sql, params).fetchall()
                done = time.perf_counter()
            times["connect + SELECT 1"].append((connected - started) * 1000)
            times[case].append((done - connected) * 1000)
    print(f"{rounds} rounds, a fresh connection per case; medians:")
    for case, values in times.items():
        print(f"  {case:<20} {statistics.median(values):7.3f} ms")


if __name__ == "__main__":
    main()
