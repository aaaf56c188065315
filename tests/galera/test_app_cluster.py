"""The app on a Galera cluster: three gunicorn servers, each writing through its own node.

Gated on the MySQL/MariaDB store (issue 15): these tests run only with ``IDEMPOTENCY_GALERA=1``
and ``IDEMPOTENCY_GALERA_APP=1`` (``.ci/leg-galera`` passes the latter through). The servers are
``tests/servers`` under ``tests.galera.app_settings`` (Django's ``mysql`` backend, causal reads);
the test process reads the outcome through the nodes with MySQLdb.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from typing import Any

import httpx
import pytest

from django_idempotency._base.keys import hash_key
from tests.galera.harness import Cluster, Node
from tests.galera.test_cluster import connect
from tests.servers import harness
from tests.test_servers_postgresql import (
    TIMEOUT,
    assert_409,
    assert_replay_of,
    in_background,
    outcome,
    post,
    problem_slug,
)
from tests.waiting import wait_for

pytestmark = pytest.mark.galera_app

STORM = 36  # twelve through each node
EXPIRED_ROWS = 60_000  # enough for the two runs to overlap on the same rows


@pytest.fixture(scope="module")
def app_database(galera: Cluster) -> Iterator[str]:
    if os.environ.get("IDEMPOTENCY_GALERA_APP") != "1":
        pytest.skip("needs the MySQL/MariaDB store (issue 15) and IDEMPOTENCY_GALERA_APP=1")
    name = f"idem_app_{uuid.uuid4().hex[:8]}"
    galera.create_database(name)
    manage(galera.nodes[0], name, "migrate", "--noinput")
    yield name
    with closing(galera.nodes[0].connect()) as conn, conn.cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {name}")


def server_environment(node: Node, database: str) -> dict[str, str]:
    return {
        "DJANGO_SETTINGS_MODULE": "tests.galera.app_settings",
        "DATABASE_URL": f"{node.url}{database}",
        "IDEMPOTENCY_SERVER_DB": database,
    }


def manage(node: Node, database: str, *args: str) -> subprocess.CompletedProcess[str]:
    """A management command run in its own process, connected through ``node``."""
    env = {**harness._environment(database, "wsgi"), **server_environment(node, database)}
    result = subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=harness.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"{args}: {result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def servers(
    request: pytest.FixtureRequest, galera: Cluster, app_database: str
) -> Iterator[list[harness.Server]]:
    """One gunicorn (2 sync workers) per node, in the order of the nodes."""
    started: list[harness.Server] = []
    failed_before = request.session.testsfailed
    try:
        for node in galera.nodes:
            server = harness.gunicorn(app_database, workers=2)
            server.env.update(server_environment(node, app_database))
            server.start()
            started.append(server)
        yield started
    finally:
        for server in started:
            server.stop()
            if request.session.testsfailed > failed_before:
                print(f"\n----- {server.name} :{server.port} log -----\n{server.log()}")
            server.discard_log()


def query(node: Node, database: str, sql: str, *params: Any) -> Any:
    with closing(connect(node, database)) as conn, conn.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def executions(galera: Cluster, database: str, label: str) -> int:
    """Counted through the first node still running (causal read: every commit is in)."""
    node = next(node for node in galera.nodes if node.running())
    return int(
        query(node, database, "SELECT COUNT(*) FROM testapp_execution WHERE label = %s", label)[0][
            0
        ]
    )


def record(galera: Cluster, database: str, key: str) -> dict[str, Any]:
    node = next(node for node in galera.nodes if node.running())
    rows = query(
        node,
        database,
        "SELECT status, attempt, unlock_at FROM django_idempotency_idempotencykey"
        " WHERE key_hash = %s",
        hash_key(key),
    )
    assert len(rows) == 1, rows
    status, attempt, unlock_at = rows[0]
    return {"status": status, "attempt": attempt, "unlock_at": unlock_at}


def spread_storm(
    count: int, servers: list[harness.Server], path: str, key: Callable[[int], str], **headers: str
) -> list[httpx.Response | Exception]:
    """``count`` POSTs released together, request ``i`` through ``servers[i % len(servers)]``.
    Each gives its response, or the transport error it met."""
    barrier = threading.Barrier(count)
    clients = [httpx.Client(timeout=TIMEOUT) for _ in range(count)]
    http_headers = {name.replace("_", "-"): value for name, value in headers.items()}

    def send(index: int) -> httpx.Response | Exception:
        barrier.wait(timeout=TIMEOUT)
        try:
            return clients[index].post(
                servers[index % len(servers)].url + path,
                json={"amount": 4200},
                headers={"Idempotency-Key": key(index), **http_headers},
            )
        except httpx.TransportError as exc:
            return exc

    try:
        with ThreadPoolExecutor(max_workers=count) as pool:
            return list(pool.map(send, range(count), timeout=2 * TIMEOUT))
    finally:
        for client in clients:
            client.close()


def responses_only(results: list[httpx.Response | Exception]) -> list[httpx.Response]:
    assert all(isinstance(result, httpx.Response) for result in results), results
    return [result for result in results if isinstance(result, httpx.Response)]


def wait_for_claim(galera: Cluster, database: str, key: str) -> None:
    sql = "SELECT 1 FROM django_idempotency_idempotencykey WHERE key_hash = %s"
    wait_for(lambda: query(galera.nodes[0], database, sql, hash_key(key)), "the claim")


def db_clock_wait_until_stale(galera: Cluster, database: str, key: str) -> None:
    node = galera.nodes[0]
    (late,) = query(
        node,
        database,
        "SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), unlock_at)"
        " FROM django_idempotency_idempotencykey WHERE key_hash = %s",
        hash_key(key),
    )[0]
    time.sleep(max(0.0, int(late) / 1e6) + 0.2)


# 1. Storms: one execution however the duplicates are spread over the nodes ------------------


@pytest.mark.parametrize(
    "path,label,sleep",
    [("/slow/", "slow", "0.5"), ("/wait/", "wait", "1"), ("/atomic/", "atomic", "0.5")],
)
def test_a_storm_spread_over_three_nodes_executes_once(
    galera: Cluster,
    app_database: str,
    servers: list[harness.Server],
    path: str,
    label: str,
    sleep: str,
) -> None:
    before = executions(galera, app_database, label)
    key = str(uuid.uuid4())
    responses = responses_only(spread_storm(STORM, servers, path, lambda _: key, X_Sleep=sleep))
    counts = Counter(outcome(response) for response in responses)  # 500 fails here
    print(f"\n[galera storm {label}] {dict(counts)}")
    assert counts["executed"] == 1, counts
    assert executions(galera, app_database, label) == before + 1
    executed = next(r for r in responses if outcome(r) == "executed")
    for response in responses:
        if outcome(response) == "replay":
            assert_replay_of(response, executed)
    if label == "wait":  # waiters get the replay, not a 409
        assert counts["replay"] == STORM - 1, counts
    for server in servers:
        assert_replay_of(post(server, path, key), executed)
    assert executions(galera, app_database, label) == before + 1


def test_distinct_keys_through_three_nodes_never_conflict(
    galera: Cluster, app_database: str, servers: list[harness.Server]
) -> None:
    before = executions(galera, app_database, "slow")
    prefix = str(uuid.uuid4())
    responses = responses_only(
        spread_storm(STORM, servers, "/slow/", lambda index: f"{prefix}-{index}", X_Sleep="0.1")
    )
    print(f"\n[galera distinct keys] {dict(Counter(r.status_code for r in responses))}")
    assert [response.status_code for response in responses] == [201] * STORM
    assert not any(r.headers.get("Idempotent-Replayed") for r in responses)
    assert executions(galera, app_database, "slow") == before + STORM


# 2. Crashes and late owners across nodes -----------------------------------------------------


def test_a_killed_owner_is_taken_over_through_another_node(
    galera: Cluster, app_database: str, servers: list[harness.Server]
) -> None:
    before = executions(galera, app_database, "crash")
    key = str(uuid.uuid4())
    with pytest.raises(httpx.TransportError):
        post(servers[0], "/crash/", key, X_Kill="1")
    assert record(galera, app_database, key)["status"] == "processing"
    assert_409(post(servers[1], "/crash/", key))  # owned until unlock_at, on every node
    db_clock_wait_until_stale(galera, app_database, key)
    # A burst of retries through the other two nodes: exactly one takes the record over.
    responses = responses_only(spread_storm(8, servers[1:], "/crash/", lambda _: key))
    counts = Counter(outcome(response) for response in responses)
    print(f"\n[galera takeover burst] {dict(counts)}")
    assert counts["executed"] == 1, counts
    taker = next(r for r in responses if outcome(r) == "executed")
    assert taker.json()["attempt"] == 2
    assert executions(galera, app_database, "crash") == before + 2
    assert record(galera, app_database, key)["status"] == "completed"
    assert_replay_of(post(servers[0], "/crash/", key), taker)


def test_a_late_owner_on_one_node_is_fenced_by_a_takeover_on_another(
    galera: Cluster, app_database: str, servers: list[harness.Server]
) -> None:
    before = executions(galera, app_database, "late")
    refused_before = executions(galera, app_database, "late-refused")
    key = str(uuid.uuid4())
    first = in_background(lambda: post(servers[0], "/late/", key, X_Sleep="3"))
    wait_for_claim(galera, app_database, key)
    db_clock_wait_until_stale(galera, app_database, key)
    second = in_background(lambda: post(servers[2], "/late/", key, X_Sleep="3"))
    wait_for(lambda: record(galera, app_database, key)["attempt"] == 2, "the takeover")
    late = first()
    assert late.status_code == 201 and late.json()["attempt"] == 1
    assert executions(galera, app_database, "late-refused") == refused_before + 1
    assert "finished after its lock was taken over" in servers[0].log()
    new_owner = second()
    assert outcome(new_owner) == "executed" and new_owner.json()["attempt"] == 2
    for server in servers:
        assert_replay_of(post(server, "/late/", key), new_owner)
    assert executions(galera, app_database, "late") == before + 2


# 3. A node lost during a storm ------------------------------------------------------------


def test_a_node_killed_during_a_storm(
    galera: Cluster, app_database: str, servers: list[harness.Server]
) -> None:
    """The owner runs through node 1; duplicates arrive through all three nodes before node 3
    is SIGKILLed and after. The two survivors keep the guarantees, the dead node's server
    answers 503 (never 500), and once node 3 is back it replays what it missed."""
    doomed = galera.nodes[2]
    before = executions(galera, app_database, "slow")
    key = str(uuid.uuid4())
    owner = in_background(lambda: post(servers[0], "/slow/", key, X_Sleep="4"))
    wait_for_claim(galera, app_database, key)

    before_kill = responses_only(spread_storm(STORM // 2, servers, "/slow/", lambda _: key))
    assert all(outcome(response) == "409" for response in before_kill), before_kill
    galera.kill(doomed)
    after_kill = spread_storm(STORM // 2, servers, "/slow/", lambda _: key)
    print(
        f"\n[galera node killed] before the kill {dict(Counter(map(outcome, before_kill)))}, "
        "after: "
        + str(dict(Counter(getattr(r, "status_code", type(r).__name__) for r in after_kill)))
    )
    for index, result in enumerate(after_kill):
        assert isinstance(result, httpx.Response), result
        if index % 3 == 2:  # through the dead node
            assert result.status_code == 503, result.text
            assert problem_slug(result) == "idempotency-unavailable"
        else:
            assert outcome(result) in ("409", "replay")  # a 500 fails in outcome()
    original = owner()
    assert outcome(original) == "executed"
    assert executions(galera, app_database, "slow") == before + 1
    for server in servers[:2]:
        assert_replay_of(post(server, "/slow/", key), original)

    galera.restart(doomed)
    assert_replay_of(post(servers[2], "/slow/", key), original)
    assert executions(galera, app_database, "slow") == before + 1
    counted = query(
        doomed, app_database, "SELECT COUNT(*) FROM testapp_execution WHERE label = 'slow'"
    )
    assert counted == ((before + 1,),)


# 4. Cleanup on two nodes at once ------------------------------------------------------------


def test_two_cleanups_on_two_nodes_at_once(
    galera: Cluster, app_database: str, servers: list[harness.Server]
) -> None:
    live_key = str(uuid.uuid4())
    live = post(servers[0], "/slow/", live_key)
    assert outcome(live) == "executed"
    with closing(connect(galera.nodes[0], app_database)) as conn, conn.cursor() as cursor:
        # Expired copies of the live record under new keys, in one statement per thousand.
        for start in range(0, EXPIRED_ROWS, 1000):
            cursor.execute(
                "INSERT INTO django_idempotency_idempotencykey (scope, key_hash, method, path,"
                " request_hash, status, response_status, response_headers, response_body,"
                " recovery_point, recovery_data, lock_token, attempt, created_at, updated_at,"
                " unlock_at, expires_at)"
                " SELECT k.scope, SHA2(CONCAT('expired-', s.seq), 256), k.method, k.path,"
                " k.request_hash, k.status, k.response_status, k.response_headers,"
                " k.response_body, k.recovery_point, k.recovery_data, NULL, 1, k.created_at,"
                " k.updated_at, NULL, UTC_TIMESTAMP(6) - INTERVAL 1 HOUR"
                f" FROM seq_{start + 1}_to_{start + 1000} s"
                " JOIN django_idempotency_idempotencykey k ON k.key_hash = %s",
                (hash_key(live_key),),
            )
            conn.commit()

    def cleanup(node: Node) -> Callable[[], str]:
        return lambda: (
            manage(node, app_database, "idempotency_cleanup", "--batch-size", "200").stdout
        )

    runs = [in_background(cleanup(node)) for node in galera.nodes[:2]]
    outputs = [run() for run in runs]  # manage() asserts each exited 0
    print(f"\n[galera cleanup on two nodes] {outputs}")
    remaining = query(
        galera.nodes[2],
        app_database,
        "SELECT COUNT(*) FROM django_idempotency_idempotencykey"
        " WHERE expires_at < UTC_TIMESTAMP(6)",
    )
    assert remaining == ((0,),)
    for server in servers:
        assert_replay_of(post(server, "/slow/", live_key), live)
