"""What the store will rely on in a Galera cluster, shown with MySQLdb on three real nodes.

A write through one node is read through another; two transactions claiming the same key (or
fencing the same row) through two nodes at once are resolved at commit by certification: one
commits, the other's ``COMMIT`` fails with 1213, and looking again shows the winner.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import closing
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests import ports
from tests.galera.harness import Cluster, MySQLdb, Node

pytestmark = pytest.mark.galera

DEADLOCK = 1213
ROUNDS = 5
TIMEOUT = 30.0
# Causal reads for SELECT, UPDATE/DELETE and INSERT (1 + 2 + 4): a statement first waits until
# this node has applied every write the cluster committed before it.
SYNC_WAIT_ALL = 7


def connect(node: Node, database: str, *, sync_wait: int = SYNC_WAIT_ALL) -> Any:
    conn = node.connect(database)
    with conn.cursor() as cursor:
        cursor.execute("SET SESSION wsrep_sync_wait = %s", (sync_wait,))
    return conn


@pytest.fixture
def claims(galera: Cluster, galera_database: str) -> Iterator[str]:
    with closing(connect(galera.nodes[0], galera_database)) as conn, conn.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE claims (id VARCHAR(64) PRIMARY KEY, owner VARCHAR(16) NOT NULL,"
            " lock_token CHAR(36) NOT NULL)"
        )
    yield galera_database


def error_code(exc: BaseException) -> int:
    assert isinstance(exc, MySQLdb.OperationalError), repr(exc)
    return int(exc.args[0])


def race(cluster: Cluster, *steps: Callable[[threading.Barrier], str]) -> list[str | BaseException]:
    """Run each step in its own thread; they share a barrier. Each returns what it did, or the
    exception it raised; a step still running after ``TIMEOUT`` fails the test with what every
    node is doing."""
    barrier = threading.Barrier(len(steps))

    def run(step: Callable[[threading.Barrier], str]) -> str | BaseException:
        try:
            return step(barrier)
        except Exception as exc:
            return exc

    pool = ThreadPoolExecutor(max_workers=len(steps))
    try:
        futures = [pool.submit(run, step) for step in steps]
        hanging = wait(futures, timeout=TIMEOUT).not_done
        if hanging:
            raise AssertionError(f"{len(hanging)} step(s) still running:\n{activity(cluster)}")
        return [future.result() for future in futures]
    finally:
        pool.shutdown(wait=False)  # a hanging step must not hang the test too


def activity(cluster: Cluster) -> str:
    """Every node's state and statements, for a failure message."""
    lines = []
    for node in cluster.nodes:
        with closing(node.connect()) as conn, conn.cursor() as cursor:
            cursor.execute("SHOW STATUS LIKE 'wsrep_local_state_comment'")
            lines.append(f"{node.name}: {cursor.fetchall()}")
            cursor.execute("SHOW FULL PROCESSLIST")
            lines.extend(f"  {row}" for row in cursor.fetchall())
    return "\n".join(lines)


def one_commits(results: list[str | BaseException], first: Node, second: Node) -> tuple[str, Node]:
    """Of two raced transactions, exactly one committed and the other's commit failed with
    1213: the winner's name and the losing node."""
    winners = [result for result in results if isinstance(result, str)]
    losers = [result for result in results if isinstance(result, BaseException)]
    assert len(winners) == 1, results
    assert [error_code(loser) for loser in losers] == [DEADLOCK]
    return winners[0], second if winners == [first.name] else first


def test_the_cluster_has_three_synced_nodes(galera: Cluster) -> None:
    for node in galera.nodes:
        status = node.status()
        assert status["wsrep_cluster_size"] == "3"
        assert status["wsrep_local_state_comment"] == "Synced"
        assert status["wsrep_cluster_status"] == "Primary"


def test_the_nodes_listen_below_the_ephemeral_ports(galera: Cluster) -> None:
    """A killed node must find its ports free when it restarts (:mod:`tests.ports`)."""
    listening = [port for node in galera.nodes for port in (node.port, node.group_port,
                 node.ist_port, node.sst_port)]  # fmt: skip
    assert len(set(listening)) == 12
    assert not any(port in ports.ephemeral() for port in listening)


def test_a_write_through_node_1_is_read_through_node_3(galera: Cluster, claims: str) -> None:
    first, _, third = galera.nodes
    with closing(connect(first, claims)) as conn, conn.cursor() as cursor:
        cursor.execute("INSERT INTO claims VALUES ('replicated', 'node1', 't')")
        conn.commit()
    with closing(connect(third, claims)) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT owner FROM claims WHERE id = 'replicated'")
        assert cursor.fetchall() == (("node1",),)


def claim_step(node: Node, database: str, key: str) -> Callable[[threading.Barrier], str]:
    """Insert ``key`` in a transaction, wait for the other node to have done as much, commit."""

    def step(barrier: threading.Barrier) -> str:
        with closing(connect(node, database)) as conn, conn.cursor() as cursor:
            cursor.execute("INSERT INTO claims VALUES (%s, %s, 't')", (key, node.name))
            barrier.wait(timeout=TIMEOUT)
            conn.commit()
            return node.name

    return step


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_the_same_key_claimed_through_two_nodes_at_once(
    galera: Cluster, claims: str, round_: int
) -> None:
    """Both inserts succeed locally (no lock spans nodes); certification lets one commit and
    fails the other's COMMIT with 1213. The loser, looking again, finds the winner's row."""
    first, second, third = galera.nodes
    key = f"same-{round_}"
    results = race(galera, claim_step(first, claims, key), claim_step(second, claims, key))

    winner, loser = one_commits(results, first, second)
    with closing(connect(loser, claims)) as conn, conn.cursor() as cursor:
        cursor.execute("INSERT IGNORE INTO claims VALUES (%s, %s, 't')", (key, loser.name))
        assert cursor.rowcount == 0
        cursor.execute("SELECT owner FROM claims WHERE id = %s", (key,))
        assert cursor.fetchall() == ((winner,),)
        conn.commit()
    with closing(connect(third, claims)) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT owner FROM claims WHERE id = %s", (key,))
        assert cursor.fetchall() == ((winner,),)


def fenced_step(node: Node, database: str, key: str) -> Callable[[threading.Barrier], str]:
    """Take the row over from token ``old`` in a transaction; commit once the other has too."""

    def step(barrier: threading.Barrier) -> str:
        with closing(connect(node, database)) as conn, conn.cursor() as cursor:
            affected = cursor.execute(
                "UPDATE claims SET owner = %s, lock_token = %s WHERE id = %s AND lock_token = %s",
                (node.name, f"new-{node.name}", key, "old"),
            )
            assert affected == 1  # locally, each sees the old token
            barrier.wait(timeout=TIMEOUT)
            conn.commit()
            return node.name

    return step


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_a_fenced_update_raced_through_two_nodes(galera: Cluster, claims: str, round_: int) -> None:
    first, second, third = galera.nodes
    key = f"fenced-{round_}"
    with closing(connect(third, claims)) as conn, conn.cursor() as cursor:
        cursor.execute("INSERT INTO claims VALUES (%s, 'dead', 'old')", (key,))
        conn.commit()

    results = race(galera, fenced_step(first, claims, key), fenced_step(second, claims, key))

    winner, loser = one_commits(results, first, second)
    with closing(connect(loser, claims)) as conn, conn.cursor() as cursor:
        # The retry of the fenced write: the token moved on, so it affects nothing.
        affected = cursor.execute(
            "UPDATE claims SET owner = %s WHERE id = %s AND lock_token = 'old'", (loser.name, key)
        )
        assert affected == 0
        conn.commit()
    for node in galera.nodes:
        with closing(connect(node, claims)) as conn, conn.cursor() as cursor:
            cursor.execute("SELECT owner, lock_token FROM claims WHERE id = %s", (key,))
            assert cursor.fetchall() == ((winner, f"new-{winner}"),)


def test_autocommit_fenced_updates_through_three_nodes_affect_one_row_in_all(
    galera: Cluster, claims: str
) -> None:
    """The store's own pattern: one autocommit statement, retried when certification fails.
    Across every node and every retry, exactly one UPDATE affects the row."""
    keys = [f"storm-{index}" for index in range(20)]
    with closing(connect(galera.nodes[0], claims)) as conn, conn.cursor() as cursor:
        cursor.executemany("INSERT INTO claims VALUES (%s, 'dead', 'old')", [(k,) for k in keys])
        conn.commit()

    def take_over(node: Node) -> Callable[[threading.Barrier], str]:
        def step(barrier: threading.Barrier) -> str:
            affected = conflicts = 0
            with closing(connect(node, claims)) as conn, conn.cursor() as cursor:
                conn.autocommit(True)
                barrier.wait(timeout=TIMEOUT)
                for key in keys:
                    while True:
                        try:
                            affected += cursor.execute(
                                "UPDATE claims SET owner = %s, lock_token = %s"
                                " WHERE id = %s AND lock_token = 'old'",
                                (node.name, f"new-{node.name}", key),
                            )
                            break
                        except MySQLdb.OperationalError as exc:
                            assert error_code(exc) == DEADLOCK
                            conflicts += 1
            return f"{affected}:{conflicts}"

        return step

    results = race(galera, *(take_over(node) for node in galera.nodes))
    assert all(isinstance(result, str) for result in results), results
    affected = [int(str(result).split(":")[0]) for result in results]
    assert sum(affected) == len(keys), results
    with closing(connect(galera.nodes[2], claims)) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM claims WHERE lock_token = CONCAT('new-', owner)")
        assert cursor.fetchall() == ((len(keys),),)


# --- W003 on a real node (issue 38) ---------------------------------------------------------


def test_each_node_tells_its_suspect_timeout(galera: Cluster) -> None:
    """What the system check W003 reads: the harness starts the nodes with Galera's default,
    ``evs.suspect_timeout=PT5S``."""
    from django_idempotency._store import galera as galera_settings

    for node in galera.nodes:
        with closing(node.connect()) as conn, conn.cursor() as cursor:
            assert galera_settings.suspect_timeout(cursor) == timedelta(seconds=5)


def test_check_database_warns_of_a_lock_shorter_than_the_eviction(
    galera: Cluster, galera_database: str, tmp_path: Path
) -> None:
    """``manage.py check --database default`` through a node: the test app's views with a 1 s
    lock, and a ``LOCK_TIMEOUT`` of 7 s, are each W003; the default of 30 s is not."""
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "galera_check_settings.py").write_text(
        "from tests.settings import *  # noqa: F403\nIDEMPOTENCY = {'LOCK_TIMEOUT': 7}\n"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "galera_check_settings",
        "DATABASE_URL": galera.nodes[1].url + galera_database,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)]),
    }
    checked = subprocess.run(
        [sys.executable, "-m", "django", "check", "--database", "default"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = checked.stdout + checked.stderr
    assert checked.returncode == 0, output
    warned = re.findall(r"\(django_idempotency\.W003\) (.+?) is ", output)
    assert sorted(warned) == [
        "IDEMPOTENCY['LOCK_TIMEOUT']",
        "tests.testapp.ninja_api.short_lock: lock_timeout",
        "tests.testapp.views.short_lock: lock_timeout",
    ], output
    assert "evs.suspect_timeout (0:00:05)" in output
