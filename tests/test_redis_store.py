"""The Redis store's own behaviour (issue 44): its configuration and checks, expiry by Redis's
TTL, the claim's takeover refused while the owner lives (under real threads), fencing, renewal,
erasure and the cluster hash tags. The semantic suite runs on it too
(``IDEMPOTENCY_TEST_STORE=redis``, tests/conftest.py). Needs a Redis server at
``IDEMPOTENCY_TEST_REDIS_STORE_URL`` (a db number of its own); the ``appendonly`` check starts
private ``redis-server`` processes.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError
from django.test import override_settings

from django_idempotency import (
    IdempotencyInProgress,
    StoreUnavailable,
    erase_scope,
    idempotent,
    idempotent_function,
)
from django_idempotency._base.keys import hash_key
from django_idempotency._conf.options import Options
from django_idempotency._conf.settings import usable
from django_idempotency._conf.values import store_alias
from django_idempotency._ops import checks, store_checks
from django_idempotency._store import StoredResponse, using
from django_idempotency._store.limits import bounded_scope
from django_idempotency._store.redis.clients import cluster_client
from django_idempotency._store.redis.keyspace import record_key
from django_idempotency.models import IdempotencyKey
from django_idempotency.testing import concurrently, hold_key, stale_key
from tests.conftest import flush_redis
from tests.held import assert_held_off, owner_and_duplicates
from tests.redis_servers import free_port, private_cluster, start_server
from tests.waiting import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.django_db]

STORE = "redis"
ALIAS = "cache:redis"


@pytest.fixture(autouse=True)
def _empty() -> None:
    flush_redis()


def client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


def on_redis(store: str = STORE, **more: Any) -> Any:
    return override_settings(IDEMPOTENCY={"STORE": store, **more})


@dataclass
class Place:
    """Where a test's records live: the store's name and a raw client of its server(s)."""

    store: str
    client: Any


@pytest.fixture(scope="module")
def cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Redis Cluster of the module's own: three primaries (tests/redis_servers.py)."""
    with private_cluster(tmp_path_factory.mktemp("cluster")) as url:
        yield url


@pytest.fixture(params=["one server", "a cluster"])
def place(request: pytest.FixtureRequest) -> Place:
    """The test on one Redis server (the cache alias), then on a cluster (its URL): a record
    is one key in one slot, a scope's index in its own, and scans and erasure reach every
    primary."""
    if request.param == "one server":
        return Place(STORE, client())
    url = request.getfixturevalue("cluster_url")
    nodes = cluster_client(url)
    nodes.flushdb(target_nodes=nodes.PRIMARIES)
    return Place(url, nodes)


def function_scope(function: Any) -> str:
    return str(function.idempotency_spec.identify(("k",), {}).scope)


# --- configuration and checks -------------------------------------------------------------


def test_e060_a_store_that_is_not_redis_stops_the_app() -> None:
    with override_settings(IDEMPOTENCY={"STORE": "default"}):  # a LocMemCache
        errors = checks.check_settings()
        assert [e.id for e in errors] == ["django_idempotency.E060"]
        assert "is not Redis" in errors[0].msg
        with pytest.raises(ImproperlyConfigured, match="E060"):
            usable()
    with override_settings(IDEMPOTENCY={"STORE": "nowhere"}):
        assert [e.id for e in checks.check_settings()] == ["django_idempotency.E060"]
    good_ones = ["database", "redis", "redis://127.0.0.1:1/0", "redis://localhost/0"]
    good_ones += ["redis+cluster://10.0.0.1:7000,10.0.0.2", "redis+sentinel://h:26379/m"]
    for good in good_ones:
        with override_settings(IDEMPOTENCY={"STORE": good}):
            assert checks.check_settings() == []


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:abc/0", "redis+cluster://a:1,b:x", "redis+sentinel://h:2o/m"]
)
def test_e060_a_url_whose_port_is_not_a_number_stops_the_app(url: str) -> None:
    """Refused at startup, not a ``ValueError`` (a 500) at each protected call."""
    with override_settings(IDEMPOTENCY={"STORE": url}):
        errors = checks.check_settings()
        assert [e.id for e in errors] == ["django_idempotency.E060"]
        assert "is not a number" in errors[0].msg


def test_e061_atomic_is_refused_on_redis_and_says_why() -> None:
    with pytest.raises(ImproperlyConfigured, match="shares no transaction"):
        Options.build(atomic=True, store=STORE)
    # The URLconf's atomic views, on the Redis store by the setting.
    with on_redis():
        errors = store_checks.check_stores()
    assert errors and {e.id for e in errors} == {"django_idempotency.E061"}
    assert any("tests.testapp.views.atomic" in e.msg for e in errors)
    with override_settings(IDEMPOTENCY={"STORE": "database"}):
        assert store_checks.check_stores() == []

    @idempotent_function(key="event_id", atomic=True)
    def handle(event_id: str) -> None: ...

    with on_redis(), pytest.raises(ImproperlyConfigured, match="shares no transaction"):
        handle("k")


def test_e062_a_store_that_does_not_answer_at_deploy() -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    with override_settings(IDEMPOTENCY={"STORE": dead}):
        errors = store_checks.check_stores_deploy()
    assert [e.id for e in errors] == ["django_idempotency.E062"]


def test_e062_asks_a_redis_store_s_ping_through_the_contract() -> None:
    """A server that answers passes; one on a port nobody listens on is named as the Redis
    store's class describes it."""
    assert using(ALIAS).ping() is None
    assert store_checks.e062_unreachable(STORE) is None
    dead = f"redis://127.0.0.1:{free_port()}/0"
    error = store_checks.e062_unreachable(dead)
    assert error is not None
    assert error.msg.startswith(f"The Redis store {dead!r} does not answer: ConnectionError")


def test_e062_s_message_is_one_line_without_redis_py_s_reprs() -> None:
    """A Sentinel's ``MasterNotFoundError`` carried its client's whole connection repr (about
    1,500 characters): the message is the store's name, the error's class and first line."""
    dead = f"redis+sentinel://:secret@127.0.0.1:{free_port()}/mymaster"
    with override_settings(IDEMPOTENCY={"STORE": dead}):
        (error,) = store_checks.check_stores_deploy()
    assert error.msg.startswith("The Redis store 'redis+sentinel://127.0.0.1:"), error.msg
    assert "MasterNotFoundError: No master found for 'mymaster'" in error.msg
    assert "\n" not in error.msg and "ConnectionPool" not in error.msg and "secret" not in error.msg
    assert len(error.msg) < 300, error.msg


@pytest.mark.parametrize("appendonly", ["no", "yes"])
def test_w060_appendonly_no_is_warned_at_deploy(appendonly: str) -> None:
    with (
        private_redis("--appendonly", appendonly) as url,
        override_settings(IDEMPOTENCY={"STORE": url}),
    ):
        messages = store_checks.check_stores_deploy()
    expected = ["django_idempotency.W060"] if appendonly == "no" else []
    assert [m.id for m in messages] == expected


def test_w060_asks_every_primary_of_a_cluster(cluster_url: str) -> None:
    """A cluster's records live on every primary: one without the AOF loses its share."""
    nodes = cluster_client(cluster_url)
    with override_settings(IDEMPOTENCY={"STORE": cluster_url}):
        assert store_checks.check_stores_deploy() == []
        last = nodes.get_primaries()[-1]
        nodes.config_set("appendonly", "no", target_nodes=last)
        try:
            messages = store_checks.check_stores_deploy()
        finally:
            nodes.config_set("appendonly", "yes", target_nodes=last)
    assert [m.id for m in messages] == ["django_idempotency.W060"]
    assert f"{last.host}:{last.port}" in messages[0].msg


def test_the_cache_alias_client_and_pool_are_reused() -> None:
    from django.core.cache import caches

    store: Any = using(ALIAS)
    assert (
        store.client.connection_pool
        is caches["redis"]._cache.get_client(write=True).connection_pool
    )


def test_a_store_on_a_cache_alias_follows_a_caches_change() -> None:
    """``override_settings(CACHES=...)`` makes each alias a new cache and client: the store
    made before it used the old pool, and the test above, run after such a test, failed."""
    from django.conf import settings
    from django.core.cache import caches

    before: Any = using(ALIAS)
    with override_settings(CACHES={**settings.CACHES}):
        store: Any = using(ALIAS)
        assert store is not before
        pool = caches["redis"]._cache.get_client(write=True).connection_pool
        assert store.client.connection_pool is pool
    after: Any = using(ALIAS)
    assert (
        after.client.connection_pool
        is caches["redis"]._cache.get_client(write=True).connection_pool
    )


@pytest.mark.django_db(transaction=True)
def test_the_first_calls_of_many_threads_at_once_make_one_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fresh worker's first requests, all at once (CI's Redis fault leg): two clients made
    by two of them, the one dropped closed its pool when collected, and with it a connection
    another thread was reading (a ``500``). Every thread gets the one client, and after a
    collection every connection the calls kept is still open. The client is made here only
    once every call has come to ask for it (and 50 ms later), so that the first calls all
    arrive while it is being made: with a fixed 50 ms alone, calls that a loaded machine
    started later found it made, and the test passed without two first calls ever at once."""
    from django_idempotency._store.redis import RedisStore
    from django_idempotency._store.redis import clients as module

    made = module.client_for
    calls = 16
    arrived: list[int] = []

    def slowly(name: str) -> Any:
        wait_for(lambda: len(arrived) == calls, "every first call to ask for the client")
        time.sleep(0.05)  # the making's own time: each call past its check meanwhile
        return made(name)

    monkeypatch.setattr(module, "client_for", slowly)
    for _ in range(5):  # a fresh store each round
        store = RedisStore(settings.REDIS_URL, lambda exc: False)
        arrived.clear()

        def first(store: Any = store) -> Any:
            arrived.append(1)
            client = store.client
            assert store._server.run("UNLOCK", ["idempotency:r:{race}"], ["t"], 5.0) == 0
            return client

        clients = concurrently(first, calls)  # an exception of any is raised
        made_clients = len({id(each) for each in clients})
        del clients
        gc.collect()  # a client made and dropped closes its pool here
        idle = store._server.wire.idle
        assert idle and all(each._sock is not None for each in idle)
        assert made_clients == 1


def test_the_store_keeps_its_connections_and_drops_all_idle_ones_after_a_cut() -> None:
    """Issue 44's speed: a call takes a connection of the store's own idle list, not the
    pool's checkout; after every connection is killed (a network cut) with several idle ones
    dead, the next call's two tries still succeed: the first fault drops them all."""
    calls = 4
    barrier = threading.Barrier(calls)

    @idempotent_function(key="event_id", ttl=60)
    def handle(event_id: str) -> str:
        if event_id != "k9":
            barrier.wait(5)  # the calls overlap: as many connections as calls
        return event_id

    with on_redis():
        store: Any = using(ALIAS)
        threads = [threading.Thread(target=handle, args=(f"k{n}",)) for n in range(calls)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(store._server.wire.idle) >= 2
        pool = store.client.connection_pool
        checkouts = []
        original = pool.get_connection
        pool.get_connection = lambda *a, **k: checkouts.append(1) or original(*a, **k)
        try:
            assert handle("k0") == "k0"  # a replay, on a kept connection
            assert checkouts == []
            client().execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
            assert handle("k9") == "k9"  # the claim, the result: no 503
        finally:
            del pool.get_connection


# --- the record in Redis ------------------------------------------------------------------


def test_expiry_is_redis_ttl_and_store_for_sets_its_own() -> None:
    @idempotent_function(key="event_id", ttl=60)
    def handle(event_id: str) -> int:
        return 1

    with on_redis():
        handle("k1")
    keys = list(client().scan_iter(match="idempotency:r:*"))
    assert len(keys) == 1
    assert 55_000 < client().pttl(keys[0]) <= 60_000
    # One hash tag holding scope and key: one record is one key in one cluster slot.
    name = keys[0].decode()
    assert name.count("{") == 1 and name.endswith(f":{hash_key('k1')}}}")


def test_an_expired_record_is_gone_and_the_key_runs_afresh() -> None:
    runs: list[str] = []

    # The shortest lock (a second), and a TTL as short.
    @idempotent_function(key="event_id", ttl=1, lock_timeout=1)
    def handle(event_id: str) -> int:
        runs.append(event_id)
        return len(runs)

    with on_redis():
        assert handle("k") == 1
        assert handle("k") == 1
        wait_for(
            lambda: not list(client().scan_iter(match="idempotency:r:*")),
            "the record's expiry by Redis's TTL",
            5,
        )
        assert handle("k") == 2


def test_takeover_is_refused_while_the_owner_lives_under_real_threads(place: Place) -> None:
    """The Powertools/idempot-js bug: duplicates must not take a live owner's lock. The owner
    runs past several lock timeouts, renewing; twenty threads hammer the key meanwhile."""
    runs: list[int] = []
    started, finish = threading.Event(), threading.Event()

    # A second's lock, renewed every third of it: a renewal may come late by most of a second
    # and still hold (0.3 s was lost once, at load 5, to a renewer that ran too late). The
    # owner returns once every duplicate is done: one still sending after a fixed run saw
    # its result.
    @idempotent_function(key="event_id", lock_timeout=1.0, ttl=60)
    def handle(event_id: str) -> str:
        runs.append(1)
        if len(runs) == 1:
            started.set()
            assert finish.wait(30), "the duplicates never finished"
        return "done"

    outcomes: list[str] = []
    deadline = 0.0

    def duplicate() -> None:
        while time.monotonic() < deadline:
            try:
                outcomes.append(handle("k"))
            except IdempotencyInProgress:
                outcomes.append("409")
            time.sleep(0.01)

    with on_redis(place.store):
        owner = threading.Thread(target=handle, args=("k",))
        owner.start()
        assert started.wait(10), "the owner never claimed"
        deadline = time.monotonic() + 3.0  # three lock timeouts: only renewal keeps it
        threads = [threading.Thread(target=duplicate) for _ in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        finish.set()
        owner.join()
        assert handle("k") == "done"
    assert runs == [1]
    assert outcomes and set(outcomes) == {"409"}


def test_a_stale_record_is_taken_over_by_exactly_one_of_many_threads() -> None:
    runs: list[int] = []
    refused = threading.Semaphore(0)

    # The taker returns once the other fifteen were refused: one that came late to a fixed
    # run (a loaded machine) replayed its result instead.
    @idempotent_function(key="event_id", lock_timeout=5, ttl=60)
    def handle(event_id: str) -> str:
        runs.append(1)
        for _ in range(15):
            assert refused.acquire(timeout=10), "the other retries were not all refused"
        return "ok"

    barrier = threading.Barrier(16)
    outcomes: list[str] = []

    def retry() -> None:
        barrier.wait()
        try:
            outcomes.append(handle("k"))
        except IdempotencyInProgress:
            outcomes.append("409")
            refused.release()

    with on_redis():
        stale = stale_key("k", handle, "k", recovery_point="half", recovery_data={"n": 1})
        assert stale.attempt == 1
        threads = [threading.Thread(target=retry) for _ in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        record: Any = using(ALIAS).read(stale.scope, stale.key_hash)  # type: ignore[attr-defined]
    assert runs == [1]
    assert outcomes.count("ok") == 1 and outcomes.count("409") == 15
    assert record.attempt == 2 and record.recovery_point == "half"
    assert record.recovery_data == {"n": 1}


def test_a_late_owner_is_fenced_by_its_lock_token() -> None:
    @idempotent_function(key="event_id", ttl=60)
    def handle(event_id: str) -> str:
        return "new owner"

    with on_redis():
        first = stale_key("k", handle, "k")
        assert handle("k") == "new owner"  # took over: attempt 2
        store: Any = using(ALIAS)
        store._handles.records[first.pk] = (record_key(first.scope, first.key_hash), "", "")
        late = StoredResponse(None, [], b'"late"')
        assert store.store_response(first.pk, first.token_text, late) is False
        store._handles.records[first.pk] = (record_key(first.scope, first.key_hash), "", "")
        assert store.release(first.pk, first.token_text) is False
        assert handle("k") == "new owner"


def test_a_live_owner_keeps_its_lock_by_renewal_past_its_timeout(place: Place) -> None:
    """The lock's end as the owner's code starts (claimed), then pushed past it by a renewal
    while the owner still runs. Read at fixed times, the first read found no record when the
    owner had not claimed yet, and any later one passed as "renewed"."""
    claimed, finish = threading.Event(), threading.Event()

    @idempotent_function(key="event_id", lock_timeout=1, ttl=60)  # renewed at 0.33 s
    def handle(event_id: str) -> str:
        claimed.set()
        assert finish.wait(10), "the test never let the owner finish"
        return "ok"

    def unlock_at() -> int:
        return int(place.client.hget(scope_key, "ua") or 0)

    with on_redis(place.store):
        scope_key = record_key(function_scope(handle), hash_key("k"))
        owner = ThreadPoolExecutor(1)
        done = owner.submit(handle, "k")
        try:
            assert claimed.wait(10), "the owner never claimed"
            first = unlock_at()
            assert first, "the owner's record has no lock"
            wait_for(lambda: unlock_at() > first, "a renewal of the owner's lock", 5)
        finally:
            finish.set()
            owner.shutdown()
    assert done.result() == "ok"


def test_a_cluster_spreads_records_over_its_primaries_and_runs_each_key_once(
    cluster_url: str,
) -> None:
    """On a cluster each record is one key in one slot (its scope and key hash in a hash
    tag): records spread over every primary, and each script reaches its record's node."""
    nodes = cluster_client(cluster_url)
    nodes.flushdb(target_nodes=nodes.PRIMARIES)
    runs: dict[str, int] = {}

    @idempotent_function(key="event_id", scope=lambda event_id: f"tenant-{event_id[-1]}")
    def handle(event_id: str) -> str:
        runs[event_id] = runs.get(event_id, 0) + 1
        return event_id

    keys = [f"event-{n}" for n in range(60)]
    with on_redis(cluster_url):
        for key in keys:
            assert handle(key) == key
        for key in keys:
            assert handle(key) == key
    assert all(runs[key] == 1 for key in keys)
    held = {node.name: nodes.dbsize(target_nodes=node) for node in nodes.get_primaries()}
    assert len(held) == 3 and all(count > 0 for count in held.values()), held


# --- erasure and operations ---------------------------------------------------------------


def test_erasure_by_scope_deletes_finished_records_and_leaves_those_in_flight(
    place: Place,
) -> None:
    @idempotent_function(key="event_id", scope=lambda event_id: "tenant-1")
    def handle(event_id: str) -> str:
        return event_id

    with on_redis(place.store):
        handle("a")
        handle("b")
        held = stale_key("c", handle, "c")
        scope = held.scope
        dry = erase_scope(scope, dry_run=True)
        assert (dry.deleted, dry.dry_run) == (2, True)
        erased = erase_scope(scope)
        assert (erased.deleted, erased.in_progress) == (2, 0)
        assert erase_scope(scope).deleted == 0
    remaining = list(place.client.scan_iter(match="idempotency:r:*"))
    assert len(remaining) == 1  # the record in flight


def test_the_cleanup_command_erases_a_scope_in_the_redis_stores(place: Place) -> None:
    """``idempotency_cleanup --scope`` erases the Redis stores' records as ``erase_scope()``
    does: it passed the database's alias, which erased the table's alone (a new user's
    review: "No idempotency record has scope" with six of its records in Redis)."""
    from django.core.management import call_command

    @idempotent_function(key="event_id", scope=lambda event_id: "tenant-9")
    def handle(event_id: str) -> str:
        return event_id

    out = StringIO()
    with on_redis(place.store):
        handle("a")
        handle("b")
        scope = stale_key("c", handle, "c").scope
        call_command("idempotency_cleanup", "--scope", scope, "--dry-run", stdout=out)
        call_command("idempotency_cleanup", "--scope", scope, stdout=out)
    assert "Would delete 2 finished idempotency records of scope" in out.getvalue()
    assert "Deleted 2 finished idempotency records of scope" in out.getvalue()
    remaining = list(place.client.scan_iter(match="idempotency:r:*"))
    assert len(remaining) == 1  # the record in flight


@pytest.mark.django_db(transaction=True)
def test_the_cleanup_command_says_a_redis_store_that_does_not_answer_and_erases_nothing() -> None:
    """A Redis store down (or refusing the password): ``idempotency_cleanup --scope`` printed
    redis-py's traceback (a new user's review), and a second store's failure came after the
    first had erased. Every store is asked first; the failure is a ``CommandError`` naming the
    store, without its password, and the table keeps its records."""
    from django.core.management import call_command

    from tests.redis_servers import free_port

    @idempotent_function(key="event_id", scope=lambda event_id: "tenant-8")
    def handle(event_id: str) -> str:
        return event_id

    with override_settings(IDEMPOTENCY={"STORE": "database"}):
        handle("a")  # a record in the table, which must be left
    down = f"redis://:s3cret-pw@127.0.0.1:{free_port()}/0"
    with on_redis(down), pytest.raises(CommandError) as raised:
        call_command("idempotency_cleanup", "--scope", "tenant-8", stdout=StringIO())
    message = str(raised.value)
    assert "did not answer" in message and "nothing was erased" in message
    assert "s3cret-pw" not in message and "Traceback" not in message
    assert IdempotencyKey.objects.count() == 1


def test_erasure_by_the_stored_form_the_admin_shows(place: Place) -> None:
    """A long scope is stored as ``sha256:<hex>``: given so, it is another scope (nothing
    erased); with ``stored=True`` its records are erased, as on the database (issue 48)."""
    long = "tenant:" + "x" * 300

    @idempotent_function(key="event_id", scope=lambda event_id: long)
    def handle(event_id: str) -> str:
        return event_id

    with on_redis(place.store):
        handle("a")
        shown = stale_key("b", handle, "b").scope  # the stored form: the admin shows it
        assert shown.startswith("sha256:") and bounded_scope(shown) != shown
        assert erase_scope(shown).deleted == 0
        erased = erase_scope(shown, stored=True)
        assert erased.deleted == 1  # "a" (the stale "b" is left in progress or expired)


def test_cleanup_and_stats_say_what_they_do_on_redis(capsys: Any) -> None:
    from django.core.management import call_command

    @idempotent_function(key="event_id")
    def handle(event_id: str) -> str:
        return event_id

    with on_redis():
        handle("a")
        call_command("idempotency_cleanup")
        call_command("idempotency_stats")
        call_command("idempotency_recover")
    out = capsys.readouterr().out
    assert "Redis" in out and "nothing to delete" in out
    assert "1 record" in out
    assert "taken over by the key's next request" in out


def test_stats_json_counts_the_redis_stores_records(place: Place, capsys: Any) -> None:
    import json

    from django.core.management import call_command

    @idempotent_function(key="event_id")
    def handle(event_id: str) -> str:
        return event_id

    with on_redis(place.store):
        handle("a")
        handle("b")
        stale_key("c", handle, "c")  # processing, its lock lapsed
        call_command("idempotency_stats", "--json")
    stats = json.loads(capsys.readouterr().out)
    assert stats["total"] == 0  # the table's
    # Every status, a zero too, as the table's figures list them.
    assert list(stats["redis_stores"][place.store]["by_status"]) == list(stats["by_status"])
    assert stats["stores"] == stats["redis_stores"]  # every store's, and the Redis ones again
    assert stats["redis_stores"] == {
        place.store: {
            "total": 3,
            "by_status": {"processing": 1, "completed": 2, "failed": 0},
            "stale": 1,
            "operations_running": 0,
            "operations_stuck": 0,
            "longest_operation_silence_seconds": None,
            "outbox_pending": 0,
            "outbox_failed": 0,
            "outbox_oldest_undelivered_age_seconds": None,
            "error": None,
        }
    }
    with (
        override_settings(IDEMPOTENCY={"STORE": "redis://127.0.0.1:1/0"}),
        pytest.raises(CommandError, match="did not answer"),
    ):
        call_command("idempotency_stats", "--json")
    unreachable = json.loads(capsys.readouterr().out)["redis_stores"]["redis://127.0.0.1:1/0"]
    assert unreachable["total"] is None and unreachable["error"]


def test_key_records_reads_the_redis_store(post: Any, client: Any) -> None:
    from django.contrib.auth.models import User

    from django_idempotency.testing import key_records

    with on_redis():
        assert not key_records("kr-1").exists()
        assert post("/create/", key="kr-1").status_code == 201
        client.force_login(User.objects.create_user("bob"))
        assert post("/create/", key="kr-1").status_code == 201
        records = key_records("kr-1")
        assert records.count() == 2
        assert records[0].scope == "anonymous" and records[1].scope.startswith("user:")
        assert {record.status for record in records} == {"completed"}
        assert records[0].response_status == 201
        assert records[0].key_hash == hash_key("kr-1")
        with pytest.raises(records[0].MultipleObjectsReturned):
            records.get()
    assert not key_records("kr-1").exists()  # the table's, without Redis named


def test_a_view_on_redis_by_its_own_option() -> None:
    @idempotent(store=STORE)
    def view(request: Any) -> Any:
        from django.http import JsonResponse

        return JsonResponse({"ok": True}, status=201)

    from django.test import RequestFactory

    factory = RequestFactory()
    first = view(factory.post("/x/", headers={"Idempotency-Key": "v1"}))
    second = view(factory.post("/x/", headers={"Idempotency-Key": "v1"}))
    assert first.status_code == second.status_code == 201
    assert second["Idempotent-Replayed"] == "true"
    assert len(list(client().scan_iter(match="idempotency:r:*"))) == 1


def test_two_sites_sharing_one_database_by_their_caches_key_prefix_keep_their_own_records() -> None:
    """Two sites' cache aliases on one Redis database, told apart by ``KEY_PREFIX`` as Django's
    caches are: the store used neither prefix, and each site replayed the other's responses
    (issue 48). ``KEY_PREFIX`` with a pattern's characters is matched as it is by scans."""
    from django.http import HttpRequest, JsonResponse
    from django.test import RequestFactory

    from django_idempotency._store import using

    location = settings.CACHES["redis"]["LOCATION"]
    sites = {"site_a": "a*", "site_b": "b"}
    caches = {
        alias: {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": location}
        for alias in ("redis", *sites)
    }
    for alias, prefix in sites.items():
        caches[alias]["KEY_PREFIX"] = prefix
    with override_settings(CACHES=caches):
        views = {}
        for alias in sites:

            @idempotent(store=alias)
            def view(request: HttpRequest, site: str = alias) -> Any:
                return JsonResponse({"site": site}, status=201)

            views[alias] = view
        factory = RequestFactory()
        for alias in sites:
            for _ in range(2):
                answer = views[alias](factory.post("/x/", headers={"Idempotency-Key": "shared"}))
                assert json.loads(answer.content) == {"site": alias}
            assert answer["Idempotent-Replayed"] == "true"
        names = sorted(name.decode() for name in client().scan_iter(match="*idempotency:r:*"))
        assert [name.partition(":")[0] for name in names] == ["a*", "b"]
        assert using("cache:site_a").count() == using("cache:site_b").count() == 1
        assert using(ALIAS).count() == 0


# --- a private server ---------------------------------------------------------------------


class private_redis:
    """A ``redis-server`` of the test's own, in a temporary directory, stopped after."""

    #: The one entered last (a test's handle on its process).
    last: private_redis

    def __init__(self, *options: str) -> None:
        self.options = options
        private_redis.last = self

    def __enter__(self) -> str:
        self.dir = tempfile.mkdtemp(prefix="idempotency-redis-")
        self.port = free_port()
        try:
            self.process = start_server(self.port, self.dir, *self.options)
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        return f"redis://127.0.0.1:{self.port}/0"

    def __exit__(self, *exc: Any) -> None:
        self.process.kill()
        self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def test_the_admin_says_where_records_live_and_that_it_cannot_list_them(admin_client: Any) -> None:
    with on_redis():
        page = admin_client.get("/admin/django_idempotency/idempotencykey/")
    text = page.content.decode()
    assert page.status_code == 200
    assert "live in the Redis store" in text and "cannot show" in text
    with override_settings(IDEMPOTENCY={"STORE": "database"}):
        page = admin_client.get("/admin/django_idempotency/idempotencykey/")
    assert "live in the Redis store" not in page.content.decode()  # the database's says nothing


def test_scripts_a_restarted_server_lost_are_loaded_again() -> None:
    @idempotent_function(key="event_id")
    def handle(event_id: str) -> str:
        return event_id

    with on_redis():
        assert handle("a") == "a"
        client().script_flush()
        assert handle("b") == "b"
        assert handle("a") == "a"


def test_an_unreachable_redis_store_is_a_503_and_the_view_does_not_run(post: Any) -> None:
    from tests.conftest import executions, problem_slug

    dead = f"redis://127.0.0.1:{free_port()}/0"
    with override_settings(IDEMPOTENCY={"STORE": dead}):
        started = time.monotonic()
        response = post("/create/", {"a": 1}, key="k")
    assert response.status_code == 503
    assert problem_slug(response) == "idempotency-unavailable"
    assert executions() == 0
    assert time.monotonic() - started < 2


class echo_server:
    """A peer that sends back whatever it is sent: what a client connected to itself reads (a
    Redis server down on a port of the ephemeral range, :mod:`tests.ports`)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}/0"
        self.served: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                peer, _ = self.listener.accept()
            except OSError:  # closed
                return
            self.served.append(peer)
            threading.Thread(target=self._echo, args=(peer,), daemon=True).start()

    @staticmethod
    def _echo(peer: socket.socket) -> None:
        with peer:
            try:
                while data := peer.recv(65536):
                    peer.sendall(data)
            except OSError:
                return

    def __enter__(self) -> echo_server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.listener.close()
        for peer in self.served:
            peer.close()


def test_a_script_call_is_packed_as_redis_pys_own_packer_packs_it() -> None:
    """The store packs its ``EVALSHA`` with hiredis when it is there (redis-py 8.2's packer
    encodes each argument in Python first): the bytes on the wire are redis-py's, for the
    kinds of argument the scripts get (str, not ASCII too; int; bytes, a large body too)."""
    from redis.connection import Connection, Encoder, PythonRespSerializer

    from django_idempotency._store.redis.connections import packed

    parts = (
        "EVALSHA", "0" * 40, 2, "idempotency:{tenant:ä|abc}", "idempotency-scope:{tenant:ä}",
        "tok-1", 1_234_567_890_123, 0, "", b"\x00\xff\r\n", b"x" * 100_000, "{\"a\":[1,2]}",
    )  # fmt: skip
    python = PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode)
    assert b"".join(packed(Connection(), parts)) == b"".join(python.pack(*parts))


@pytest.mark.parametrize("protocol", ["", "?protocol=2"])
def test_a_store_that_reads_its_own_commands_back_is_a_503_and_never_a_claim(
    protocol: str, post: Any
) -> None:
    """RESP3 (redis-py 8's default): the ``HELLO`` read back is a list, not the server's map
    (redis-py's ``AttributeError``: a ``500`` before). RESP2: the ``EVALSHA`` read back is a
    list that a claim took for a record, and a result write for done. Both are faults of the
    connection: the claim answers ``503`` and the view does not run; a write is not done."""
    from django_idempotency._store.redis import RedisStore
    from django_idempotency._store.redis.faults import RedisFault
    from tests.conftest import executions, problem_slug

    with echo_server() as echo:
        url = echo.url + protocol
        with override_settings(IDEMPOTENCY={"STORE": url}):
            response = post("/create/", {"a": 1}, key="k")
        assert response.status_code == 503
        assert problem_slug(response) == "idempotency-unavailable"
        assert executions() == 0
        store: Any = RedisStore(url, lambda exc: False)
        for script, args in [("COMPLETE", ["t", "completed", 201, "[]", b"", "0", "", "h"]),
                             ("UNLOCK", ["t"])]:  # fmt: skip
            with pytest.raises(RedisFault, match=r"the connection failed|not the script.s"):
                store._server.run(script, ["idempotency:r:{echo}"], args, 0.5)


# --- faults on a private server -----------------------------------------------------------


def _restart(server: private_redis, *options: str) -> None:
    """SIGKILL the server (no shutdown save), then start it again on its directory."""
    server.process.kill()
    server.process.wait()
    server.process = start_server(server.port, server.dir, *options)


@pytest.mark.parametrize("fsync", ["always", "everysec", "no AOF"])
def test_sigkill_and_restart_with_aof_executions_per_key(fsync: str, capsys: Any) -> None:
    """Results acknowledged, then the server SIGKILLed and started again from its directory.
    With ``appendfsync always`` none is lost: Redis writes and syncs the AOF before it
    replies, so every retry replays, one execution per key. With ``everysec`` usually none
    either (a killed process leaves what was written in the kernel), but Redis postpones the
    write while a slow fsync runs, up to two seconds, and a key written then runs again.
    Without it (``appendonly no``, no snapshot), every record is lost and every key runs
    again (W060). The figures are printed (docs/stores.rst). A call while the server is down
    raises ``StoreUnavailable`` (a view's 503), never another error."""
    from django_idempotency import StoreUnavailable

    runs: dict[str, int] = {}

    @idempotent_function(key="event_id")
    def handle(event_id: str) -> str:
        runs[event_id] = runs.get(event_id, 0) + 1
        return event_id

    aof = fsync != "no AOF"
    options = ("--appendonly", "yes", "--appendfsync", fsync) if aof else ("--appendonly", "no")
    with private_redis(*options) as url, override_settings(IDEMPOTENCY={"STORE": url}):
        server = private_redis.last
        keys = [f"k{n}" for n in range(300)]
        for key in keys:
            handle(key)
        server.process.kill()
        server.process.wait()
        with pytest.raises(StoreUnavailable):
            handle("during the outage")
        _restart(server, *options)
        for key in keys:
            handle(key)
    twice = sum(1 for key in keys if runs[key] > 1)
    assert all(runs[key] <= 2 for key in keys)
    if fsync == "always":
        assert twice == 0
    elif not aof:
        assert twice == len(keys)
    # everysec: usually none (the AOF is written before the reply), but a write Redis postpones
    # while a slow fsync runs (up to 2 s) is lost with the process: the figure is printed.
    with capsys.disabled():
        print(f"\nappendfsync {fsync}: {twice} of {len(keys)} keys ran again after SIGKILL")


def test_an_owner_rides_out_a_restart_mid_run_and_its_result_is_kept() -> None:
    """The server is SIGKILLed and started again (AOF) while the owner runs: its claim is in
    the AOF, its result write is tried again until the server answers, within its lock; the
    retry replays. One execution, no error."""
    runs: list[str] = []
    server_box: list[private_redis] = []

    @idempotent_function(key="event_id", lock_timeout=5)
    def handle(event_id: str) -> str:
        runs.append(event_id)
        _restart(server_box[0], "--appendonly", "yes", "--appendfsync", "always")
        return "kept"

    with (
        private_redis("--appendonly", "yes", "--appendfsync", "always") as url,
        override_settings(IDEMPOTENCY={"STORE": url}),
    ):
        server_box.append(private_redis.last)
        assert handle("k") == "kept"
        assert handle("k") == "kept"
        record: Any = using(url).read(  # type: ignore[attr-defined]
            function_scope(handle), hash_key("k")
        )
    assert runs == ["k"]
    assert record.status == "completed"


def test_an_owner_rides_out_an_outage_longer_than_a_statement_share_of_its_lock() -> None:
    """The server is SIGKILLed as the owner returns and is back 3 s later (AOF): its result
    write rides that out while its 10 s lock holds, not only for one statement's share of it
    (1.7 s): before, it gave up, and every retry ran the function again (issue 44's fault
    scenario, tests/faults/test_redis.py)."""
    runs: list[str] = []
    server_box: list[private_redis] = []
    options = ("--appendonly", "yes", "--appendfsync", "always")
    later = ThreadPoolExecutor(1)
    restarts: list[Future[None]] = []

    def restart(server: private_redis) -> None:
        time.sleep(3.0)
        _restart(server, *options)

    @idempotent_function(key="event_id", lock_timeout=10)
    def handle(event_id: str) -> str:
        runs.append(event_id)
        server = server_box[0]
        server.process.kill()
        server.process.wait()
        restarts.append(later.submit(restart, server))
        return "kept"

    with private_redis(*options) as url, override_settings(IDEMPOTENCY={"STORE": url}):
        server_box.append(private_redis.last)
        started = time.monotonic()
        assert handle("k") == "kept"
        assert time.monotonic() - started >= 2.5  # it waited for the server
        restarts[0].result(timeout=60)  # the restart's own failure, if it failed
        assert handle("k") == "kept"
    later.shutdown()
    assert runs == ["k"]


def test_a_function_and_a_drf_view_on_redis_by_their_own_option() -> None:
    from django.http import HttpRequest
    from rest_framework.response import Response
    from rest_framework.test import APIRequestFactory
    from rest_framework.views import APIView

    from django_idempotency.rest_framework import IdempotencyMixin

    runs: list[str] = []

    @idempotent_function(key="event_id", store=STORE)
    def handle(event_id: str) -> str:
        runs.append(event_id)
        return event_id

    class Create(IdempotencyMixin, APIView):
        idempotency_store = STORE
        authentication_classes: list[Any] = []
        permission_classes: list[Any] = []

        def post(self, request: HttpRequest) -> Response:
            runs.append("view")
            return Response({"ok": True}, status=201)

    with override_settings(IDEMPOTENCY={"STORE": "database"}):
        assert handle("f") == handle("f") == "f"
        view = Create.as_view()
        factory = APIRequestFactory()
        for _ in range(2):
            response = view(factory.post("/x/", {}, format="json", HTTP_IDEMPOTENCY_KEY="d"))
            assert response.status_code == 201
    assert runs == ["f", "view"]
    assert len(list(client().scan_iter(match="idempotency:r:*"))) == 2


@pytest.mark.parametrize("fault", ["connections killed", "server paused (a blackhole)"])
def test_a_fault_shorter_than_the_lock_never_runs_a_view_twice(fault: str) -> None:
    """While the owner runs, every client connection is killed (a network cut: ``CLIENT
    KILL``), or the server answers nothing for 1.5 s (``CLIENT PAUSE``: a blackhole shorter
    than the lock); duplicates meanwhile get ``IdempotencyInProgress`` or ``StoreUnavailable``,
    never a run; the owner's result is kept, and the retry replays it."""
    from django_idempotency import StoreUnavailable

    runs: list[str] = []
    outcomes: list[str] = []

    @idempotent_function(key="event_id", lock_timeout=6)
    def handle(event_id: str) -> str:
        runs.append(event_id)
        admin = redis.Redis.from_url(url)
        if fault == "connections killed":
            admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        else:
            admin.execute_command("CLIENT", "PAUSE", "1500", "ALL")
        try:
            handle(event_id)  # a duplicate during the fault
        except IdempotencyInProgress:
            outcomes.append("409")
        except StoreUnavailable:
            outcomes.append("503")
        return "kept"

    with private_redis("--appendonly", "yes") as url, override_settings(IDEMPOTENCY={"STORE": url}):
        assert handle("k") == "kept"
        assert handle("k") == "kept"
    assert runs == ["k"]
    assert outcomes and set(outcomes) <= {"409", "503"}


# --- Redis Sentinel: a failover -----------------------------------------------------------


def test_a_sentinel_failover_keeps_replicated_records_and_answers_503_meanwhile(
    capsys: Any,
) -> None:
    """A master, its replica and a sentinel of the test's own (Debian's ``redis-server``, in
    sentinel mode for the third). Results are stored and replicated (``WAIT``), the master is
    SIGKILLed, and calls go on through the failover: each is its function's result or
    ``StoreUnavailable`` (a view's 503), never another error; after it every replicated key
    replays from the promoted replica (one execution per key). The unavailability is printed
    (docs/stores.rst)."""
    from django_idempotency import StoreUnavailable

    directory = tempfile.mkdtemp(prefix="idempotency-sentinel-")
    master, replica, watcher = free_port(), 0, 0
    processes: list[subprocess.Popen[bytes]] = []
    try:
        processes.append(start_server(master, directory, "--appendonly", "yes"))
        replica = free_port()
        os.makedirs(f"{directory}/replica")
        processes.append(
            start_server(replica, f"{directory}/replica", "--replicaof", "127.0.0.1", str(master))
        )
        watcher = free_port()
        config = Path(directory, "sentinel.conf")
        config.write_text(
            f"sentinel monitor m 127.0.0.1 {master} 1\n"
            "sentinel down-after-milliseconds m 500\nsentinel failover-timeout m 3000\n"
        )
        processes.append(start_server(watcher, directory, "--sentinel", config=str(config)))
        url = f"redis+sentinel://127.0.0.1:{watcher}/m/0"
        runs: dict[str, int] = {}

        @idempotent_function(key="event_id")
        def handle(event_id: str) -> str:
            runs[event_id] = runs.get(event_id, 0) + 1
            return event_id

        with override_settings(IDEMPOTENCY={"STORE": url}):
            keys = [f"k{n}" for n in range(100)]
            for key in keys:
                handle(key)
            assert redis.Redis(port=master).wait(1, 5000) == 1
            processes[0].kill()
            processes[0].wait()
            started = time.monotonic()
            refused = 0
            while True:
                try:
                    handle("after")
                    break
                except StoreUnavailable:
                    refused += 1
                    time.sleep(0.1)
                assert time.monotonic() - started < 30, "no failover in 30 s"
            unavailable = time.monotonic() - started
            for key in keys:
                assert handle(key) == key
        assert all(runs[key] == 1 for key in keys)
        with capsys.disabled():
            print(
                f"\nsentinel failover: unavailable {unavailable:.1f} s ({refused} calls refused"
                f" with StoreUnavailable), 0 of {len(keys)} replicated keys ran again"
            )
    finally:
        for process in processes:
            process.kill()
            process.wait()
        shutil.rmtree(directory, ignore_errors=True)


def _replicated(port: int, key: str) -> None:
    """Until the replica of the primary on ``port`` has all written there so far: a write to
    ``key``'s slot and ``WAIT`` on one connection (``WAIT`` counts the connection's own writes,
    and replication is one stream, in order)."""
    direct = redis.Redis(port=port)
    try:
        pipe = direct.pipeline(transaction=False)
        pipe.set(f"{key}:replicated", 1)
        pipe.execute_command("WAIT", 1, 5000)
        assert pipe.execute()[1] == 1
    finally:
        direct.close()


def test_a_cluster_failover_keeps_replicated_records_and_answers_503_meanwhile(
    tmp_path: Path, capsys: Any
) -> None:
    """Three primaries with a replica each (``cluster-node-timeout 1000``). Results are stored
    and replicated, then an owner whose claim is on the same primary kills it mid-run
    (SIGKILL): its result write rides the failover out within its 10 s lock, and a record's
    retries meanwhile are each a replay or ``StoreUnavailable`` (a view's 503, at once), never
    another error; after it every key replays (one execution per key). The unavailability is
    printed (docs/stores.rst)."""
    from django_idempotency import StoreUnavailable

    runs: dict[str, int] = {}
    cluster = private_cluster(tmp_path, replicas=1)

    @idempotent_function(key="event_id")
    def handle(event_id: str) -> str:
        runs[event_id] = runs.get(event_id, 0) + 1
        return event_id

    @idempotent_function(key="event_id", lock_timeout=10)
    def owner(event_id: str) -> str:
        runs[event_id] = runs.get(event_id, 0) + 1
        _replicated(victim.port, record_key(function_scope(owner), hash_key(event_id)))
        cluster.processes[victim.port].kill()
        cluster.processes[victim.port].wait()
        killed.set()
        return "kept"

    killed = threading.Event()
    with cluster as url, on_redis(url):
        nodes = cluster_client(url)
        keys = [f"k{n}" for n in range(100)]
        for key in keys:
            handle(key)
        first = record_key(function_scope(handle), hash_key("k0"))
        victim = nodes.get_node_from_key(first)
        owned = next(
            f"o{n}"
            for n in range(10_000)
            if nodes.get_node_from_key(record_key(function_scope(owner), hash_key(f"o{n}")))
            == victim
        )
        _replicated(victim.port, first)
        running = ThreadPoolExecutor(1)
        kept = running.submit(owner, owned)
        assert killed.wait(10)
        started = time.monotonic()
        refused, longest = 0, 0.0
        while True:
            call = time.monotonic()
            try:
                assert handle("k0") == "k0"
                break
            except StoreUnavailable:
                refused += 1
                time.sleep(0.1)
            finally:
                longest = max(longest, time.monotonic() - call)
            assert time.monotonic() - started < 30, "no failover in 30 s"
        unavailable = time.monotonic() - started
        assert kept.result(timeout=30) == "kept"
        running.shutdown()
        assert owner(owned) == "kept"
        for key in keys:
            assert handle(key) == key
    assert all(count == 1 for count in runs.values()) and len(runs) == 101
    with capsys.disabled():
        print(
            f"\ncluster failover: a primary's slots unavailable {unavailable:.1f} s ({refused}"
            f" calls refused with StoreUnavailable, the longest call {longest:.1f} s), its"
            f" owner's result kept, 0 of {len(keys)} replicated keys ran again"
        )


def test_operations_on_redis_keep_their_id_across_replays() -> None:
    """``in_progress="accepted"`` and a record's operation id were refused on a Redis store
    (its id named nothing): both work now, the id naming the Redis record."""
    assert Options.build(in_progress="accepted", store=STORE).resolve().in_progress == "accepted"

    @idempotent_function(key="event_id")
    def start(event_id: str, *, idempotency: Any) -> str:
        return str(idempotency.operation_id)

    with on_redis():
        named = start("k")
        assert named.startswith("r") and start("k") == named  # replayed: the same id


# --- operations on Redis ----------------------------------------------------------------------


def _started(post: Any, key: str) -> tuple[str, str]:
    response = post("/export/", {"rows": 3}, key=key)
    assert response.status_code == 202, response.content
    return json.loads(response.content)["operation"], response["Location"]


@pytest.mark.urls("tests.operations_urls")
def test_a_202_on_redis_is_its_principals_and_completed_once_by_concurrent_tasks(
    place: Place, post: Any, client: Any, key: str
) -> None:
    """A ``202`` on a Redis store: the view's operation id names its Redis record, which only
    its principal reads; eight tasks completing it at once (a redelivered task) apply once,
    in the script's compare-and-set, and every retry replays that one response."""
    from django.contrib.auth.models import User

    from django_idempotency import OperationError, complete_operation

    alice = User.objects.create_user("alice")
    bob = User.objects.create_user("bob")
    with on_redis(place.store):
        client.force_login(alice)
        operation_id, url = _started(post, key)
        assert operation_id.startswith("r") and hash_key(key) not in operation_id
        running = client.get(url)
        assert running.status_code == 200, running.content
        assert json.loads(running.content) == {"id": operation_id, "state": "running"}
        client.force_login(bob)
        assert client.get(url).status_code == 404
        client.logout()
        assert client.get(url).status_code == 404
        start = threading.Barrier(8)

        def complete(number: int) -> int:
            start.wait()
            try:
                complete_operation(operation_id, status=201, data={"task": number})
            except OperationError as refused:
                assert refused.reason == "completed"
                return -1
            return number

        with ThreadPoolExecutor(8) as pool:
            done = [n for n in pool.map(complete, range(8)) if n >= 0]
        assert len(done) == 1
        client.force_login(alice)
        shown = json.loads(client.get(url).content)
        assert shown["state"] == "succeeded"
        assert shown["response"]["body"] == {"task": done[0]}
        retry = post("/export/", {"rows": 3}, key=key)
        assert retry.status_code == 201 and json.loads(retry.content) == {"task": done[0]}


@pytest.mark.urls("tests.operations_urls")
def test_a_forged_or_expired_redis_operation_id_names_nothing(
    place: Place, post: Any, client: Any, key: str
) -> None:
    """A forged id (its MAC, its oid, another store's mark) and an expired record's id are
    the same ``404`` and ``"unknown"``; the key used again is a new operation with a new id,
    and the old id's index, still pointing at the key's record, names nothing (the record's
    oid is checked)."""
    from django_idempotency import OperationError, complete_operation, set_operation_progress

    with on_redis(place.store):
        held = hold_key(key, "POST", "/export/", {"rows": 3}, content_type="application/json")
        duplicate = post("/export/", {"rows": 3}, key=key)  # the first still runs
        assert duplicate.status_code == 202
        assert json.loads(duplicate.content)["id"] == held.operation_id
        assert duplicate["Location"] == held.operation_url
        using(held.alias).release(held.pk, held.lock_token)
        operation_id, url = _started(post, key)
        named, mac = operation_id.split(".")
        forged = [
            f"{named}.{mac[:-1]}{'A' if mac[-1] != 'A' else 'B'}",
            f"{named[:-1]}{'A' if named[-1] != 'A' else 'B'}.{mac}",
            f"r{'0' * 8}{named[9:]}.{mac}",
            f"{named}.",
            f"r{named}.{mac}",
        ]
        for each in forged:
            assert client.get(f"/idempotency/operations/{each}").status_code == 404, each
            with pytest.raises(OperationError) as refused:
                complete_operation(each, status=201, data={})
            assert refused.value.reason == "unknown"
        assert client.get(url).status_code == 200
        using(held.alias).expire(held.scope, held.key_hash)  # as its TTL would
        assert client.get(url).status_code == 404
        with pytest.raises(OperationError) as refused:
            set_operation_progress(operation_id, {"done": 1})
        assert refused.value.reason == "unknown"
        again, _ = _started(post, key)
        assert again != operation_id
        assert client.get(url).status_code == 404
        with pytest.raises(OperationError) as refused:
            complete_operation(operation_id, status=201, data={})
        assert refused.value.reason == "unknown"
        complete_operation(again, status=201, data={"again": True})


def test_an_operations_store_is_found_by_a_views_option_alone() -> None:
    """A task worker's complete_operation() finds the store of an id whose view names a URL
    of its own (neither STORE nor a CACHES alias) once the view is imported, never used."""
    from django_idempotency._store.redis import names as operations

    url = "redis://operations-store.invalid:6379/0"
    assert operations.resolve(operations.tag(url)) is None

    @idempotent_function(key="event_id", store=url)
    def handle(event_id: str) -> str:
        return event_id

    assert operations.resolve(operations.tag(url)) == url
    assert operations.resolve(operations.tag("cache:redis")) == "cache:redis"  # CACHES'


def test_an_operations_store_mark_tells_nothing_of_its_password(
    settings: Any,
) -> None:
    """An operation id carries a mark of its store's name: keyed by ``SECRET_KEY`` (a plain
    hash of a URL let anyone holding an id test password guesses), found again after the key
    is rotated into ``SECRET_KEY_FALLBACKS``."""
    import hashlib

    from django_idempotency._store.redis import names

    url = "redis://:hunter2@operations-store.invalid:6379/1"
    mark = names.tag(url)
    assert mark != hashlib.sha256(url.encode()).hexdigest()[: len(mark)]
    assert mark != names.tag("redis://:guess@operations-store.invalid:6379/1")

    @idempotent_function(key="event_id", store=url)
    def handle(event_id: str) -> str:
        return event_id

    assert names.resolve(mark) == url
    settings.SECRET_KEY_FALLBACKS = [settings.SECRET_KEY]
    settings.SECRET_KEY = "a-rotated-secret-key-" + "x" * 40
    assert names.tag(url) != mark and names.resolve(mark) == url


@pytest.mark.urls("tests.operations_urls")
def test_recover_lists_and_fails_a_redis_stores_stuck_operations(
    place: Place, post: Any, client: Any
) -> None:
    """``idempotency_recover --operations`` listed the table's only: a Redis store's
    operation whose task died stayed running until its TTL, and no operator saw it."""
    from io import StringIO

    from django.core.management import call_command

    def recover(*more: str) -> list[dict[str, Any]]:
        out = StringIO()
        call_command(
            "idempotency_recover", "--operations", "--older-than", "1h", "--json", *more, stdout=out
        )
        return json.loads(out.getvalue())  # type: ignore[no-any-return]

    with on_redis(place.store):
        silent, url = _started(post, "silent")
        talking, _ = _started(post, "talking")
        assert recover() == []
        [record] = place.client.scan_iter(match=f"idempotency:r:{{*:{hash_key('silent')}}}")
        hours_ago = (time.time() - 3 * 3600) * 1_000_000
        place.client.hset(record, "up", int(hours_ago))  # its last word, three hours ago
        assert [row["operation"] for row in recover()] == [silent]
        out = StringIO()
        call_command("idempotency_stats", "--json", stdout=out)
        figures = json.loads(out.getvalue())
        [census] = figures["redis_stores"].values()
        assert (census["operations_running"], census["operations_stuck"]) == (2, 1)
        # The database's age figure, read from the store: three hours, not the table's null.
        assert 3 * 3600 - 60 < census["longest_operation_silence_seconds"] < 3 * 3600 + 60
        assert figures["longest_operation_silence_seconds"] is None  # the table's
        assert any("1 long-running operation(s)" in each for each in figures["warnings"])
        assert [row["action"] for row in recover("--fail")] == ["failed"]
        shown = json.loads(client.get(url).content)
        assert shown["state"] == "failed"
        assert shown["response"]["body"]["type"].endswith("operation-failed")
        assert recover() == []
        assert talking != silent


# --- one store's fault, another store's locks ------------------------------------------------


@pytest.mark.django_db(transaction=True)  # the database store's claim commits on its own
def test_a_frozen_redis_store_never_costs_the_database_store_its_locks() -> None:
    """An attempt on a Redis store and one on the database store, both renewed in this
    process; the Redis server is frozen (SIGSTOP) for 4 s. The database store's owner (1.5 s
    lock, a 4 s run) keeps its key: duplicates sent every 0.1 s find it held, and it runs once.
    With one renewer thread for every store, the Redis renewal held the thread (its socket
    timeout, then retries) while the database lock lapsed, and a duplicate ran the payment
    again."""
    started = threading.Event()
    with private_redis() as url:

        @idempotent_function(key="event_id", store=url, lock_timeout=1.5)
        def on_redis(event_id: str) -> None:
            started.set()
            time.sleep(5.0)

        runs: list[str] = []

        @idempotent_function(
            key="event_id", payload=lambda event_id, *_: event_id, lock_timeout=1.5
        )
        def on_database(event_id: str, seconds: float = 0.0) -> int:
            runs.append(event_id)
            time.sleep(seconds)
            return len(runs)

        pool = ThreadPoolExecutor(max_workers=2)
        process = private_redis.last.process
        try:
            frozen_redis = pool.submit(on_redis, "r1")
            assert started.wait(10), "the Redis attempt never ran"
            owner = pool.submit(on_database, "payment", 4.0)
            # Both owners hold their keys: the Redis attempt's next renewal (0.5 s at most)
            # meets the freeze.
            wait_for(lambda: runs, "the database owner's claim")
            process.send_signal(signal.SIGSTOP)
            duplicates: list[Any] = []
            while not owner.done():
                try:
                    duplicates.append(on_database("payment"))
                except IdempotencyInProgress as exc:
                    duplicates.append(exc)
                time.sleep(0.1)
        finally:
            process.send_signal(signal.SIGCONT)
            pool.shutdown(wait=True)
        assert owner.result() == 1
        assert_held_off(duplicates, 1)
        assert runs == ["payment"]
        with contextlib.suppress(Exception):  # its lock may be lost to the freeze: its own
            frozen_redis.result()


# --- every call bounded by its caller's deadline (issue 50) ---------------------------------


@pytest.mark.parametrize("named_by", ["a URL", "a cache alias without socket timeouts"])
def test_a_claim_on_a_frozen_server_answers_within_its_bound(named_by: str) -> None:
    """The server is frozen (SIGSTOP) after a first call left the store an idle connection;
    a claim under a 6 s lock (its bound: a sixth, 1 s) fails within that bound, a view's
    ``503``. Each try's socket timeout was the client's: 5 s past the bound on a URL's client
    and on a cache alias's with redis-py 8.2 (its default), for good with redis-py 5.3 (none:
    Django's ``RedisCache`` sets none)."""
    from django_idempotency import StoreUnavailable
    from django_idempotency._store import _BOUND

    with private_redis() as url:
        caches = {
            **settings.CACHES,
            "frozen": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": url},
        }
        store = url if named_by == "a URL" else "frozen"
        with override_settings(CACHES=caches):

            @idempotent_function(key="event_id", store=store, lock_timeout=6)
            def handle(event_id: str) -> str:
                return event_id

            assert handle("before") == "before"  # the store keeps this connection idle
            process = private_redis.last.process
            outcome: list[Any] = []

            def claim() -> None:
                started = time.monotonic()
                try:
                    handle("during")
                except StoreUnavailable as exc:
                    outcome.append(exc)
                outcome.append(time.monotonic() - started)

            process.send_signal(signal.SIGSTOP)
            try:
                thread = threading.Thread(target=claim, daemon=True)
                thread.start()
                thread.join(8.0)
            finally:
                process.send_signal(signal.SIGCONT)
            thread.join(10.0)
            for name in (store, f"cache:{store}"):
                _BOUND.pop(name, None)
    assert outcome, "the claim never answered while the server was frozen"
    assert isinstance(outcome[0], StoreUnavailable), outcome
    assert outcome[1] < 2.0, f"the claim took {outcome[1]:.2f} s, its bound 1 s"


@pytest.mark.parametrize("timeout", [None, 5])
def test_w061_a_pool_the_store_cannot_bound_without_a_socket_timeout(timeout: Any) -> None:
    """A blocking pool's connections are taken call by call, with the client's own timeouts:
    none is warned at deploy; a plain pool (the store bounds each call itself) is not."""
    from django_idempotency._store import _BOUND

    options = {"pool_class": "redis.BlockingConnectionPool", "socket_timeout": timeout}
    caches = {
        **settings.CACHES,
        "blocking": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": settings.REDIS_URL,
            "OPTIONS": options,
        },
    }
    try:
        with override_settings(CACHES=caches, IDEMPOTENCY={"STORE": "blocking"}):
            messages = store_checks.check_stores_deploy()
    finally:
        _BOUND.pop("cache:blocking", None)
    ids = [m.id for m in messages if m.id != "django_idempotency.W060"]
    assert ids == (["django_idempotency.W061"] if timeout is None else [])
    with on_redis():
        assert "django_idempotency.W061" not in [m.id for m in store_checks.check_stores_deploy()]


# --- eviction (issue 50) ----------------------------------------------------------------------

POLICIES = [
    "noeviction",
    "allkeys-lru",
    "allkeys-lfu",
    "allkeys-random",
    "volatile-lru",
    "volatile-lfu",
    "volatile-random",
    "volatile-ttl",
]


def test_e063_every_eviction_policy_but_noeviction_is_refused_at_deploy() -> None:
    """Every record has a TTL, so the ``volatile-*`` policies evict records as readily as
    ``allkeys-*``: only ``noeviction`` passes. Each policy set on a private server in turn."""
    with private_redis("--appendonly", "yes") as url, override_settings(IDEMPOTENCY={"STORE": url}):
        admin = redis.Redis.from_url(url)
        found = {}
        for policy in POLICIES:
            admin.config_set("maxmemory-policy", policy)
            found[policy] = [m.id for m in store_checks.check_stores_deploy()]
    assert found == {
        policy: [] if policy == "noeviction" else ["django_idempotency.E063"] for policy in POLICIES
    }


def test_e063_says_which_primary_of_a_cluster_evicts(cluster_url: str) -> None:
    nodes = cluster_client(cluster_url)
    last = nodes.get_primaries()[-1]
    with override_settings(IDEMPOTENCY={"STORE": cluster_url}):
        nodes.config_set("maxmemory-policy", "volatile-ttl", target_nodes=last)
        try:
            messages = store_checks.check_stores_deploy()
        finally:
            nodes.config_set("maxmemory-policy", "noeviction", target_nodes=last)
    assert [m.id for m in messages] == ["django_idempotency.E063"]
    assert f"volatile-ttl on {last.host}:{last.port}" in messages[0].msg


def test_w062_a_server_that_does_not_let_config_be_read_is_warned() -> None:
    """``CONFIG`` renamed away (a managed server's habit): the policy cannot be read, and the
    check says so rather than passing in silence."""
    with (
        private_redis("--appendonly", "yes", "--rename-command", "CONFIG", '""') as url,
        override_settings(IDEMPOTENCY={"STORE": url}),
    ):
        messages = store_checks.check_stores_deploy()
    assert [m.id for m in messages] == ["django_idempotency.W062"]
    assert "CONFIG may be renamed or forbidden" in messages[0].msg


@pytest.mark.parametrize("value", [-1, "1", True, 1.5])
def test_e064_redis_replicas_is_a_whole_number(value: Any) -> None:
    with override_settings(IDEMPOTENCY={"REDIS_REPLICAS": value}):
        assert [e.id for e in checks.check_settings()] == ["django_idempotency.E064"]
    with override_settings(IDEMPOTENCY={"REDIS_REPLICAS": 2}):
        assert checks.check_settings() == []


# --- the attempt as a fencing token (issue 50) ----------------------------------------------


@pytest.mark.parametrize("store", ["database", STORE])
@pytest.mark.django_db(transaction=True)
def test_the_attempt_is_a_fencing_token_monotonic_in_one_record_life(store: str) -> None:
    """Kleppmann's fencing token, on both stores: within one record's life (same operation
    id) each takeover's attempt is one above the last, whichever attempt died how (a lapsed
    lock, a lock let go at a recovery point); racing takeovers of one stale record give one
    winner, the next number. A new life (the record released after a failure) starts at 1
    and a later ``life``: ``(claim.life, claim.attempt)`` only grows, the token a downstream
    service keeps the highest of per key."""
    from django_idempotency import Claim

    seen: list[tuple[int, int]] = []
    fail = [True]

    @idempotent_function(key="event_id", store=store, payload=lambda event_id, *_, **__: event_id)
    def handle(event_id: str, *, idempotency: Claim) -> int:
        seen.append((idempotency.life, idempotency.attempt))
        if event_id == "failing" and fail[0]:
            fail[0] = False
            raise RuntimeError("a failure releases the record")
        return idempotency.attempt

    claims = [stale_key("k", handle, "k") for _ in range(3)]
    claims.append(stale_key("k", handle, "k", recovery_point="charged"))
    assert [claim.attempt for claim in claims] == [1, 2, 3, 4]
    assert len({claim.life for claim in claims}) == 1  # one life
    # Eight racers for the stale record: one takes it over (attempt 5) and runs; the rest
    # find it held, or replay its result.
    outcomes = concurrently(lambda: _attempt_or_held(handle, "k"), 8)
    assert all(o == 5 or isinstance(o, IdempotencyInProgress) for o in outcomes), outcomes
    assert seen == [(claims[0].life, 5)]
    with pytest.raises(RuntimeError):
        handle("failing")
    assert handle("failing") == 1  # a new life, begun later (on Redis its life was a 500:
    # the claim read the database's table by the cache alias's name)
    assert seen[1][1] == seen[2][1] == 1 and seen[1][0] < seen[2][0]


def _attempt_or_held(handle: Any, key: str) -> Any:
    try:
        return handle(key)
    except IdempotencyInProgress as exc:
        return exc


def test_a_flush_of_the_cache_alias_deletes_every_record() -> None:
    """What docs/stores.rst says of a flush: Django's ``RedisCache.clear()`` is ``FLUSHDB``,
    whatever the cache's ``KEY_PREFIX``, so ``caches[alias].clear()`` deletes the store's
    records with the cache's entries: every finished key runs again."""
    from django.core.cache import caches

    runs: list[str] = []

    @idempotent_function(key="event_id")
    def handle(event_id: str) -> str:
        runs.append(event_id)
        return event_id

    keys = [f"k{n}" for n in range(10)]
    with on_redis():
        for key in keys:
            handle(key)
        caches["redis"].clear()
        for key in keys:
            handle(key)
    assert runs == keys + keys


#: A lock, and how long the proxy holds the owner's claim reply under it (issue 50, item 1).
#: The claim's try may take 1 s at least (``deadlines.bound``: a sixth of the lock, no less than
#: 1 s), then times out and the call answers 503: a reply held longer is no claim. The first
#: renewal counted from the reply comes too late only when the reply is held longer than two
#: thirds of the lock, so the lock is the shortest allowed (1 s) and the reply held 0.8 s.
HELD_LOCK = 1.0
HELD_REPLY = 0.8
#: How often a duplicate is sent: the lock lapses from 1 s to 1.13 s (the first renewal counted
#: from the reply), a window a duplicate every 0.1 s can miss.
DUPLICATE_EVERY = 0.02


def test_the_first_renewal_counts_from_the_claim_not_from_its_reply_held_by_the_network() -> None:
    """The owner's claim reaches the server, which sets the lock, but its reply is held 0.8 s
    by a proxy (a slow network, an fsync before the reply) under a 1 s lock; the owner then
    runs 1.5 s. Its first renewal is due an interval after the claim was sent, so as the reply
    comes: duplicates sent every 0.02 s from 0.9 lock timeouts after the claim until the owner
    returns find the key held, and the function runs once. With the first renewal counted from
    the reply (0.8 + 0.33 s, past the lock's 1 s), one took the key over and ran it again
    (issue 50, item 1; tests/test_functions.py holds the owner in a ``key_claimed`` receiver
    instead, 3.4 s under a 4.5 s lock)."""
    from django_idempotency._store.redis import scripts
    from tests.proxying import proxying

    runs: list[str] = []

    @idempotent_function(
        key="event_id", payload=lambda event_id, *_, **__: event_id, lock_timeout=HELD_LOCK
    )
    def handle(event_id: str, seconds: float = 0.0) -> str:
        time.sleep(seconds)
        runs.append(event_id)
        return event_id

    claim_sha = hashlib.sha1(scripts.CLAIM.encode()).hexdigest().encode()
    with private_redis("--appendonly", "yes") as url:
        server = redis.Redis.from_url(url)
        # Loaded beforehand: the held reply is the claim's own, not a NOSCRIPT before it, and
        # the first renewal is one round trip.
        assert server.script_load(scripts.CLAIM) == claim_sha.decode()
        server.script_load(scripts.RENEW)
        server.close()
        with (
            proxying(private_redis.last.port, free_port()) as proxy,
            override_settings(IDEMPOTENCY={"STORE": f"redis://127.0.0.1:{proxy.port}/0"}),
        ):
            held = proxy.arm("delay", re.escape(claim_sha), count=1, hold=HELD_REPLY)
            result, duplicates = owner_and_duplicates(
                partial(handle, "k", 1.5),
                held.done,
                partial(_attempt_or_held, handle, "k"),
                0.9 * HELD_LOCK,
                DUPLICATE_EVERY,
            )
    assert result == "k"
    assert_held_off(duplicates, "k")
    assert runs == ["k"]


# --- renewal on a cluster whose primary freezes (issue 50) -----------------------------------


def test_a_frozen_primary_costs_the_other_primaries_no_renewal(tmp_path: Path) -> None:
    """One cluster primary frozen (SIGSTOP) for twice the lock: the owners whose records are
    on the healthy primaries keep their locks (each node's locks are renewed apart, within the
    renewal's bound). With every lock renewed in turn, the frozen node's lock came first,
    raised after the client's socket timeout, and no other lock was renewed: a duplicate ran
    each healthy key again (issue 50's review: 6 of 6)."""
    runs: dict[str, int] = {}
    counting = threading.Lock()
    release = threading.Event()

    @idempotent_function(key="event_id", lock_timeout=3, payload=lambda event_id, wait: event_id)
    def handle(event_id: str, wait: bool) -> str:
        with counting:
            runs[event_id] = runs.get(event_id, 0) + 1
        if wait:
            release.wait(30)
        return event_id

    cluster = private_cluster(tmp_path, "--cluster-require-full-coverage", "no")
    with cluster as url, on_redis(url):
        nodes = cluster_client(url)
        scope = str(handle.idempotency_spec.identify(("e", False), {}).scope)
        by_port: dict[int, list[str]] = {}
        for n in range(300):
            node = nodes.get_node_from_key(record_key(scope, hash_key(f"e{n}")))
            by_port.setdefault(node.port, []).append(f"e{n}")
        frozen, *healthy_ports = sorted(by_port)
        healthy = [key for port in healthy_ports for key in by_port[port][:2]]
        # The frozen node's owner claims first: its lock is the first one renewed.
        owners = ThreadPoolExecutor(len(healthy) + 1)
        done = [owners.submit(handle, by_port[frozen][0], True)]
        wait_for(lambda: runs, "the frozen node's owner's claim")
        done += [owners.submit(handle, key, True) for key in healthy]
        owning = len(healthy) + 1
        wait_for(lambda: len(runs) == owning, "the healthy owners' claims")
        process = cluster.processes[frozen]
        os.kill(process.pid, signal.SIGSTOP)
        try:
            until = time.monotonic() + 7  # more than two locks
            while time.monotonic() < until:
                for key in healthy:
                    with contextlib.suppress(IdempotencyInProgress, StoreUnavailable):
                        handle(key, False)
        finally:
            os.kill(process.pid, signal.SIGCONT)
        release.set()
        for future in done:
            with contextlib.suppress(Exception):
                future.result(30)
        owners.shutdown()
    assert {key: runs[key] for key in healthy} == dict.fromkeys(healthy, 1)


def test_a_long_locks_stuck_renewal_costs_a_short_lock_nothing(tmp_path: Path) -> None:
    """One renewer thread renews a store's lock groups in turn: a 24 s lock's renewal on a
    connection gone silent (a dropped NAT entry: the server is healthy) is given no more than
    a share of the time left before the 2 s lock's end, and the 2 s lock's owner keeps its key.
    With each try bounded by its own lock alone (24 s / 6: 4 s), the thread waited 4 s and a
    duplicate took the 2 s lock over (issue 50's review: a 60 s and a 3 s lock, 10 s)."""
    from tests.faults.proxy import FaultProxy

    runs: dict[str, int] = {}
    counting = threading.Lock()
    release = threading.Event()

    def body(key: str, wait: bool) -> str:
        with counting:
            runs[key] = runs.get(key, 0) + 1
        if wait:
            release.wait(60)
        return key

    def payload(key: str, wait: bool) -> str:
        return key

    slow = idempotent_function(key="key", lock_timeout=24, payload=payload)(body)
    fast = idempotent_function(key="key", lock_timeout=2, payload=payload)(body)
    server_port = free_port()
    server = start_server(server_port, str(tmp_path))
    proxy_port = free_port()
    proxy = FaultProxy(proxy_port, server_port).start()
    owners = ThreadPoolExecutor(2)
    try:
        with on_redis(f"redis://127.0.0.1:{proxy_port}/0"):
            done = [owners.submit(slow, "report", True)]
            wait_for(lambda: runs, "the 24 s lock's owner's claim")
            done.append(owners.submit(fast, "payment", True))
            wait_for(lambda: len(runs) == 2, "the 2 s lock's owner's claim")
            # The 24 s group's first renewal (8 s on) meets a connection silent for 6 s.
            trigger = proxy.arm("reply", rb"\$8\r\n24000000\r\n", count=1, hold=6)
            assert trigger.done.wait(20)
            until = time.monotonic() + 6
            while time.monotonic() < until:
                with contextlib.suppress(IdempotencyInProgress):
                    fast("payment", False)
            release.set()
            for future in done:
                future.result(30)
    finally:
        release.set()
        owners.shutdown()
        proxy.stop()
        server.kill()
        server.wait()
    assert runs == {"report": 1, "payment": 1}


def test_an_owner_knows_its_records_life_from_its_claim() -> None:
    """The fencing pair ``(claim.life, claim.attempt)``: an owner whose record was lost (a
    flush, an eviction, a failover) and made again by another claim keeps its own record's
    life. Read when first used (HGET ``ca``), it was the new record's, and both owners showed
    a downstream service the same pair (issue 50's review)."""
    from django_idempotency import Claim

    pairs: dict[str, tuple[int, int]] = {}
    claimed, second_done = threading.Event(), threading.Event()

    @idempotent_function(key="key", lock_timeout=10, payload=lambda key, who: key)
    def charge(key: str, who: str, *, idempotency: Claim) -> str:
        if who == "first":
            claimed.set()
            assert second_done.wait(10)
        pairs[who] = (idempotency.life, idempotency.attempt)
        return who

    raw = client()
    with on_redis(), ThreadPoolExecutor(1) as pool:
        first = pool.submit(charge, "k", "first")
        assert claimed.wait(10)
        scope = str(charge.idempotency_spec.identify(("k", "first"), {}).scope)
        record = record_key(scope, hash_key("k"), using(ALIAS).prefix)
        life = int(raw.hget(record, "ca") or 0)
        assert raw.delete(record) == 1  # lost
        while int(raw.time()[0] * 1_000_000 + raw.time()[1]) <= life:
            pass  # the server's clock moves on (microseconds)
        assert charge("k", "second") == "second"
        second_done.set()
        first.result(10)
    assert pairs["first"] == (life, 1)
    assert pairs["second"][0] > life


def test_the_projects_database_errors_are_judged_by_the_databases_store() -> None:
    """A database error of the project's code under a Redis-store view (the scope function
    reading the user) is transient as the app's database's store says: the registry gives
    the Redis store that judgement (the store no longer reaches up for it)."""
    from django.db import OperationalError, ProgrammingError, connection

    from django_idempotency._conf.settings import conf
    from django_idempotency._store import using

    store, database = using(settings.REDIS_URL), using(conf.DATABASE_ALIAS)
    locked, wrong = OperationalError("database is locked"), ProgrammingError("no such column: x")
    for exc in (locked, wrong):
        assert store.is_transient(exc) == database.is_transient(exc)
    assert not store.is_transient(wrong)
    # SQLite's lock is its store's own transient error; the others take it as their vendor says.
    if connection.vendor == "sqlite":
        assert store.is_transient(locked)


@pytest.mark.django_db(transaction=True)  # the fast path waits for open transactions
def test_the_outbox_is_served_on_one_server_and_on_a_cluster(place: Place) -> None:
    """A function's message is released with its result and sent, on one server and on a
    cluster (its record's slot's queues: it refused ``enqueue`` there before)."""
    from django_idempotency.testing import outbox_sent
    from tests.testapp.outbox_tasks import receipt

    @idempotent_function(key="event_id", store=place.store)
    def handle(event_id: str, *, idempotency: Any) -> str:
        return str(idempotency.enqueue(receipt, event_id))

    receipt.reset()
    try:
        message = handle("k")
        outbox_sent()
        assert [sent[0] for sent in receipt.sent] == [message]
        assert list(place.client.scan_iter(match="idempotency:o:m:*"))
    finally:
        receipt.reset()


def _released_in_slots(store: Any, count: int) -> list[str]:
    """``count`` records' results, each releasing one message (its id the record's key), on
    ``store``: on a cluster in as many slots; the messages' keys."""
    return [_released(store, f"k{number}") for number in range(count)]


def _released(store: Any, key: str) -> str:
    """The result of the record of ``key`` (scope ``s``) written on ``store``, releasing one
    message (its id the key); the message's key."""
    write, message = _releasing(store, key)
    assert write()
    return message


def _releasing(store: Any, key: str) -> tuple[Any, str]:
    """The record of ``key`` (scope ``s``) claimed on ``store``: the write of its result,
    releasing one message (its id the key; the write's arguments: ``store_response``'s
    others), and the message's key."""
    from datetime import timedelta

    from django_idempotency._call import outbox
    from django_idempotency._call.identity import Identity
    from django_idempotency._store.outbox import Message, Release

    identity = Identity(
        key=key, scope="s", key_hash=hash_key(key), fingerprint="f", method="POST", path="/p"
    )
    claim = store.claim(identity, ttl=timedelta(hours=1), lock_timeout=timedelta(seconds=30))
    release = Release(0, [Message(key, outbox.CELERY, "t", "{}")], timedelta(0), False)
    stored = StoredResponse(status=201, headers={}, body=b"{}")
    write = partial(store.store_response, claim.pk, claim.token_text, stored, release=release)
    return write, str(store.message_key("s", hash_key(key), key))


def test_a_relay_takes_marks_and_resends_every_slots_messages(place: Place) -> None:
    """On a cluster each slot has its own queues (a record's messages are released in its
    script, in its slot): batches gather them across slots, and the backlog, the failed list
    and a re-send span every slot, as the one server's queues do."""
    from datetime import timedelta

    from redis.crc import key_slot

    store: Any = using(store_alias(place.store, "default"))
    keys = _released_in_slots(store, 12)
    if place.store == STORE:  # one server: the store's queue, as before
        assert place.client.zcard("idempotency:o:due") == 12
    else:  # twelve slots, each with its own due queue
        assert len({key_slot(key.encode()) for key in keys}) == 12
        assert len(list(place.client.scan_iter(match="idempotency:o:due:{*"))) == 12
    assert store.backlog().pending == 12
    first = store.take(5, timedelta(seconds=30))
    rest = store.take(50, timedelta(seconds=30))
    assert len(first) == 5 and len(rest) == 7 and store.take(50, timedelta(seconds=30)) == []
    assert sorted(message.key for message in first + rest) == sorted(keys)
    assert store.mark_sent([message.key for message in first], counted=True) == 5
    for message in rest:
        assert store.mark_failed(message.key, "broker down", None, counted=True) == 1
    failed = store.failed_messages()
    assert sorted(message.pk for message in failed) == sorted(m.key for m in rest)
    assert [m.released_at for m in failed] == sorted(m.released_at for m in failed)
    backlog = store.backlog()
    assert (backlog.pending, backlog.failed) == (0, 7) and backlog.oldest is not None
    assert store.resend([message.pk for message in failed]) == 7
    assert len(store.take(50, timedelta(seconds=30))) == 7
    assert (store.backlog().pending, store.backlog().failed) == (7, 0)
