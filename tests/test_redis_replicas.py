"""``REDIS_REPLICAS`` (issue 50): each claim and result write waits for replicas (``WAIT``,
``WAITAOF`` on Redis 7.2+), on private ``redis-server`` processes: a primary and a replica
(stalled by SIGSTOP, or live: the option's cost, printed), and a Sentinel failover right after
acknowledged claims. Run once in CI's Redis leg (.ci/leg-redis), not with each redis-py there:
they start several servers each."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis
from django.test import override_settings

from django_idempotency import IdempotencyInProgress, idempotent_function
from tests.redis_servers import free_port, start_server

pytestmark = [pytest.mark.redis, pytest.mark.django_db]


@contextlib.contextmanager
def primary_and_replica(*options: str) -> Iterator[tuple[list[subprocess.Popen[bytes]], int]]:
    """A primary (``appendonly yes``) and its replica, private; yields the processes and the
    primary's port, once the replica has synced."""
    directory = tempfile.mkdtemp(prefix="idempotency-replicas-")
    processes: list[subprocess.Popen[bytes]] = []
    try:
        primary = free_port()
        processes.append(start_server(primary, directory, "--appendonly", "yes", *options))
        os.makedirs(f"{directory}/replica")
        replica = free_port()
        processes.append(
            start_server(replica, f"{directory}/replica", "--replicaof", "127.0.0.1", str(primary))
        )
        admin = redis.Redis(port=primary)
        deadline = time.monotonic() + 30
        while admin.wait(1, 100) < 1:  # the replica's first sync is done
            assert time.monotonic() < deadline, "the replica never synced"
        yield processes, primary
    finally:
        for process in processes:
            process.send_signal(signal.SIGCONT)
            process.kill()
            process.wait()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.parametrize("replicas", [0, 1])
def test_redis_replicas_a_stalled_replica_refuses_claims_and_no_view_runs(replicas: int) -> None:
    """The replica is frozen (SIGSTOP). With ``REDIS_REPLICAS: 1`` every claim answers
    ``StoreUnavailable`` (a view's ``503``) within its bound and its function never runs; its
    lock is let go, so once the replica is back the key's retry runs it, once. Without the
    option the claims pass on the primary alone (what a failover then loses)."""
    from django_idempotency import StoreUnavailable

    runs: list[str] = []
    with primary_and_replica() as (processes, primary):
        url = f"redis://127.0.0.1:{primary}/0"

        @idempotent_function(key="event_id", store=url, lock_timeout=6)
        def handle(event_id: str) -> str:
            runs.append(event_id)
            return event_id

        with override_settings(IDEMPOTENCY={"REDIS_REPLICAS": replicas}):
            assert handle("before") == "before"
            processes[1].send_signal(signal.SIGSTOP)
            outcomes: list[Any] = []
            for n in range(3):
                started = time.monotonic()
                try:
                    outcomes.append(handle(f"k{n}"))
                except StoreUnavailable as exc:
                    outcomes.append(exc)
                assert time.monotonic() - started < 2.5  # its bound: 1 s, tried twice within
            processes[1].send_signal(signal.SIGCONT)
            if replicas:
                assert all(isinstance(each, StoreUnavailable) for each in outcomes), outcomes
                assert "0 of 1 replica(s)" in str(outcomes[0])
                assert runs == ["before"]
                assert [handle(f"k{n}") for n in range(3)] == ["k0", "k1", "k2"]
            else:
                assert outcomes == ["k0", "k1", "k2"]
    assert runs == ["before", "k0", "k1", "k2"]


def test_redis_replicas_with_a_live_replica_claims_pass_and_its_cost(capsys: Any) -> None:
    """With a live replica every claim and result waits for it and passes; the cost of the
    wait, a first execution's p50 with and without (printed: docs/stores.rst)."""
    with primary_and_replica() as (_, primary):
        url = f"redis://127.0.0.1:{primary}/0"

        # A long lock, so each wait's bound (a sixth of it) is 10 s: what is measured is the
        # wait's cost, not whether a loaded machine's replica ever acknowledges later than 1 s
        # (the stalled-replica tests hold the bound; CI saw one claim of 400 miss 0.8 s).
        @idempotent_function(key="event_id", store=url, lock_timeout=60)
        def handle(event_id: str) -> str:
            return event_id

        handle("warm")
        timings: dict[int, list[float]] = {0: [], 1: []}
        for n in range(400):  # alternating, so the load weighs on both alike
            replicas = n % 2
            with override_settings(IDEMPOTENCY={"REDIS_REPLICAS": replicas}):
                started = time.perf_counter()
                assert handle(f"k{n}") == f"k{n}"
                timings[replicas].append(time.perf_counter() - started)
        stored = redis.Redis(port=primary).dbsize()
    assert stored >= 401
    p50 = {replicas: sorted(each)[len(each) // 2] * 1000 for replicas, each in timings.items()}
    with capsys.disabled():
        print(
            f"\nREDIS_REPLICAS cost: a first execution (claim and result) p50 "
            f"{p50[0]:.2f} ms without, {p50[1]:.2f} ms with 1 (200 each, load "
            f"{os.getloadavg()[0]:.1f})"
        )


@contextlib.contextmanager
def sentinel_group() -> Iterator[tuple[list[subprocess.Popen[bytes]], str]]:
    """A primary (``appendonly yes``), two replicas (the one not promoted serves the new
    primary's waits) and a sentinel, private; yields the processes (primary first) and the
    store's ``redis+sentinel://`` URL once the replicas synced and the sentinel knows them."""
    directory = tempfile.mkdtemp(prefix="idempotency-sentinel-")
    processes: list[subprocess.Popen[bytes]] = []
    try:
        master = free_port()
        processes.append(start_server(master, directory, "--appendonly", "yes"))
        for name in ("a", "b"):
            os.makedirs(f"{directory}/{name}")
            processes.append(
                start_server(
                    free_port(), f"{directory}/{name}", "--replicaof", "127.0.0.1", str(master)
                )
            )
        admin = redis.Redis(port=master)
        deadline = time.monotonic() + 30
        while admin.wait(2, 100) < 2:
            assert time.monotonic() < deadline, "the replicas never synced"
        watcher = free_port()
        config = Path(directory, "sentinel.conf")
        config.write_text(
            f"sentinel monitor m 127.0.0.1 {master} 1\n"
            "sentinel down-after-milliseconds m 500\nsentinel failover-timeout m 3000\n"
        )
        processes.append(start_server(watcher, directory, "--sentinel", config=str(config)))
        sentinel = redis.Redis(port=watcher, decode_responses=True)
        while len(sentinel.sentinel_slaves("m")) < 2:  # it learns them from the master's INFO
            assert time.monotonic() < deadline + 30, "the sentinel never saw the replicas"
            time.sleep(0.1)
        yield processes, f"redis+sentinel://127.0.0.1:{watcher}/m/0"
    finally:
        for process in processes:
            process.send_signal(signal.SIGCONT)
            process.kill()
            process.wait()
        shutil.rmtree(directory, ignore_errors=True)


def test_redis_replicas_a_sentinel_failover_loses_no_acknowledged_claim(capsys: Any) -> None:
    """With ``REDIS_REPLICAS: 1``, two replicas, twenty owners claim their keys (each claim
    acknowledged by a replica) and wait in their functions; the primary is SIGKILLed at once,
    and the sentinel promotes a replica. Every key's duplicate then finds its owner's record (in
    progress, never run again), and every owner's result is stored on the new primary: one
    execution per key."""
    from django_idempotency import StoreUnavailable

    with sentinel_group() as (processes, url):
        runs: dict[str, int] = {}
        claimed = threading.Semaphore(0)
        go = threading.Event()

        @idempotent_function(
            key="event_id", store=url, lock_timeout=15, payload=lambda event_id, *_: event_id
        )
        def handle(event_id: str, owner: bool = False) -> str:
            runs[event_id] = runs.get(event_id, 0) + 1
            if owner:
                claimed.release()
                assert go.wait(30)
            return event_id

        keys = [f"k{n}" for n in range(20)]
        with override_settings(IDEMPOTENCY={"REDIS_REPLICAS": 1}):
            pool = ThreadPoolExecutor(max_workers=len(keys))
            owners = [pool.submit(handle, key, True) for key in keys]
            for _ in keys:
                assert claimed.acquire(timeout=30)
            processes[0].kill()  # right after the last claim was acknowledged
            processes[0].wait()
            started = time.monotonic()
            duplicates: dict[str, Any] = {}
            while len(duplicates) < len(keys):
                assert time.monotonic() - started < 30, "no failover in 30 s"
                for key in keys:
                    if key in duplicates:
                        continue
                    try:
                        duplicates[key] = handle(key)
                    except IdempotencyInProgress as exc:
                        duplicates[key] = exc
                    except StoreUnavailable:
                        time.sleep(0.05)
                        break
            failover = time.monotonic() - started
            go.set()
            results = [owner.result(timeout=60) for owner in owners]
            pool.shutdown(wait=True)
            replays = [handle(key) for key in keys]
    assert all(isinstance(each, IdempotencyInProgress) for each in duplicates.values()), duplicates
    assert results == keys and replays == keys
    assert runs == dict.fromkeys(keys, 1)
    with capsys.disabled():
        print(
            f"\nREDIS_REPLICAS failover: {len(keys)} acknowledged claims, the primary SIGKILLed "
            f"at once, duplicates answered after {failover:.1f} s: 0 of {len(keys)} ran again"
        )


@pytest.mark.parametrize("replicas", [0, 1])
def test_redis_replicas_a_failover_to_a_stalled_replica(replicas: int, capsys: Any) -> None:
    """Both replicas stalled (SIGSTOP) behind 32 MB of other writes, five owners claim their
    keys and wait in their functions; the primary is SIGKILLed, the replicas resume and the
    sentinel promotes one, which never received the claims. Without the option each claim was
    acknowledged by the primary alone and is lost: every key's retry during its owner's run
    runs it again (5 of 5 here). With ``REDIS_REPLICAS: 1`` each claim answered ``503`` and its
    function never ran: each key runs once, on its retry after the failover, or, where a claim
    reached the promoted replica before the kill, after that claim's lock ends (held off till
    then)."""
    from django_idempotency import StoreUnavailable

    keys = [f"k{n}" for n in range(5)]
    runs: dict[str, int] = {}
    go = threading.Event()
    with sentinel_group() as (processes, url):

        @idempotent_function(
            key="event_id", store=url, lock_timeout=15, payload=lambda event_id, *_: event_id
        )
        def handle(event_id: str, owner: bool = False) -> str:
            runs[event_id] = runs.get(event_id, 0) + 1
            if owner:
                assert go.wait(30)
            return event_id

        with override_settings(IDEMPOTENCY={"REDIS_REPLICAS": replicas}):
            for replica in processes[1:3]:
                replica.send_signal(signal.SIGSTOP)
            # 32 MB of other writes: more than the sockets' buffers hold, so what follows
            # stays in the primary's own buffer for its replicas (the audit's 64 MB behind).
            primary = _primary_of(url)
            for n in range(32):
                primary.set(f"filler:{n}", b"x" * 1024 * 1024)
            pool = ThreadPoolExecutor(max_workers=len(keys))
            owners = [pool.submit(handle, key, True) for key in keys]
            deadline = time.monotonic() + 30
            while sum(runs.values()) < len(keys) and not all(o.done() for o in owners):
                assert time.monotonic() < deadline, "the owners neither ran nor were refused"
                time.sleep(0.05)
            processes[0].kill()
            processes[0].wait()
            for replica in processes[1:3]:
                replica.send_signal(signal.SIGCONT)
            retried: dict[str, Any] = {}
            while len(retried) < len(keys):
                assert time.monotonic() < deadline + 30, "no failover in 30 s"
                for key in keys:
                    if key in retried:
                        continue
                    try:
                        retried[key] = handle(key)
                    except IdempotencyInProgress as exc:
                        retried[key] = exc
                    except StoreUnavailable:
                        time.sleep(0.05)
                        break
            go.set()
            owned = []
            for owner in owners:
                try:
                    owned.append(owner.result(timeout=60))
                except StoreUnavailable as exc:
                    owned.append(exc)
            pool.shutdown(wait=True)
            if replicas:
                # A claim the promoted replica holds although its owner was refused (the wait
                # fell short, the stream did not; a CI run saw one of five): held off, never
                # run, until its lock ends; then it runs once.
                held = [key for key in keys if isinstance(retried[key], IdempotencyInProgress)]
                assert not any(runs.get(key) for key in held), runs
                while held:
                    assert time.monotonic() < deadline + 60, f"{held} still held after the lock"
                    try:
                        retried[held[0]] = handle(held[0])
                        held.pop(0)
                    except (IdempotencyInProgress, StoreUnavailable):
                        time.sleep(0.2)
    twice = sum(1 for key in keys if runs.get(key, 0) > 1)
    with capsys.disabled():
        print(
            f"\nREDIS_REPLICAS {replicas}, a failover to a stalled replica: {twice} of "
            f"{len(keys)} in-flight keys ran twice"
        )
    if replicas:
        assert all(isinstance(each, StoreUnavailable) for each in owned), owned
        assert runs == dict.fromkeys(keys, 1) and retried == dict(zip(keys, keys, strict=True))
    else:
        assert twice == len(keys)  # what the option is for


def _primary_of(url: str) -> redis.Redis:
    """A plain client of the sentinel's current master."""
    port = int(url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    host, master = redis.Redis(port=port).sentinel_get_master_addr_by_name("m")
    return redis.Redis(host=host, port=int(master))
