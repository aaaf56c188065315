from __future__ import annotations

import importlib
import inspect
import os
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test import Client
from hypothesis import settings as hypothesis_settings

from tests.testapp.models import Execution

# In CI every property test draws the same examples on every run, so that a failure there is the
# code's and not the draw's (issue 32); on a developer's machine each run explores afresh.
if os.environ.get("CI"):
    hypothesis_settings.register_profile("ci", derandomize=True, database=None)
    hypothesis_settings.load_profile("ci")

#: Suites that need a server of their own, which only their CI leg starts: elsewhere they are not
#: selected rather than skipped (a skip on a server database fails CI).
_OWN_LEG = {
    "pgbouncer": "IDEMPOTENCY_TEST_PGBOUNCER_POOL_SIZE",  # .ci/leg-pgbouncer
    "galera": "IDEMPOTENCY_GALERA",  # .ci/leg-galera
    "galera_app": "IDEMPOTENCY_GALERA_APP",
    "faults": "IDEMPOTENCY_FAULTS",  # .ci/leg-faults
    "verification": "IDEMPOTENCY_VERIFY",  # .ci/leg-verify: tests/verification
    "celery": "IDEMPOTENCY_TEST_CELERY",  # .ci/leg-celery (RabbitMQ and Redis)
    "redis": "IDEMPOTENCY_TEST_REDIS_STORE_URL",  # .ci/leg-redis: the Redis store's own tests
}

#: ``IDEMPOTENCY_TEST_STORE=redis`` (.ci/leg-redis) runs these modules' semantic tests on the
#: Redis store (issue 44): ``STORE`` defaults to the ``redis`` cache alias, every other
#: module is left out, and so is each test marked ``database_store`` (it reads or writes the
#: table itself, which is the database store's).
REDIS_STORE = os.environ.get("IDEMPOTENCY_TEST_STORE") == "redis"
#: The store those tests name: the ``redis`` cache alias, or a ``redis+cluster://`` URL itself
#: (Django's RedisCache speaks to one server).
_REDIS_URL = os.environ.get("IDEMPOTENCY_TEST_REDIS_STORE_URL", "")
REDIS_CLUSTER = _REDIS_URL.startswith("redis+cluster://")
REDIS_STORE_NAME = _REDIS_URL if REDIS_CLUSTER else "redis"
STORE_MODULES = frozenset(
    {
        "test_http_contract",
        "test_storing",
        "test_sealing",
        "test_functions",
        "test_drf",
        "test_ninja",
        "test_erasure",
        "test_telemetry",
        "test_testing",
        "test_view_policy",
        "test_principals",
        "test_redis_store",
        "test_admin_redis",
        "test_operations",
        "test_operation_lifecycle",
        "test_redis_outbox",
        "test_store_contract",
    }
)

#: Each marker and the database vendors its tests need.
_VENDOR_MARKERS = {
    "postgresql": {"postgresql"},
    "mysql": {"mysql"},
    "server_db": {"postgresql", "mysql"},
    "sqlite": {"sqlite"},
}


#: What a test that reads or writes the records' table itself says (the model's queries, its
#: factory, a helper reading or forging a row, an unreachable database alias), or one of
#: atomic mode, or one in a transaction the claim joins: such a test is the database store's.
_TABLE = re.compile(
    r"\bIdempotencyKey\.objects|IdempotencyKeyFactory|\bkey_records\(|\brecords\(|\brow\("
    r"|_row\b|connection\.cursor|uncommitted_record|atomic|live_again|late_owner|unreachable"
)


def _reads_the_table(item: pytest.Item) -> bool:
    """Whether a test is the database store's: marked ``database_store``, or its body names
    the table (:data:`_TABLE`)."""
    if "database_store" in item.keywords or "atomic" in item.name:
        return True  # atomic mode needs the database: the Redis store refuses it (E061)
    function = getattr(item, "function", None)
    try:
        source = inspect.getsource(function) if function is not None else ""
    except (OSError, TypeError):
        return False
    return bool(_TABLE.search(source))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip on SQLite what needs a server; on a server, leave out what is for another one.

    CI fails on any skip on a server, so another vendor's tests are deselected, not skipped;
    so are the suites of a leg of their own (PgBouncer, Galera) outside that leg.
    """
    elsewhere = {marker for marker, variable in _OWN_LEG.items() if not os.environ.get(variable)}
    if REDIS_STORE:
        elsewhere.add("database_store")
        kept = [
            item
            for item in items
            if item.module.__name__.rpartition(".")[2] in STORE_MODULES
            and not _reads_the_table(item)
        ]
        if len(kept) < len(items):
            config.hook.pytest_deselected(items=[item for item in items if item not in kept])
            items[:] = kept
    if os.environ.get("IDEMPOTENCY_TEST_PREPARED"):
        # Connections that prepare statements keep psycopg's cursor (issue 42's libpq path
        # is not theirs): its tests are left out there, as another vendor's are.
        elsewhere.add("unprepared")
    deselected = [item for item in items if elsewhere & set(item.keywords)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if not elsewhere & set(item.keywords)]
    vendor = connection.vendor
    foreign = [
        item
        for item in items
        if any(
            vendor not in _VENDOR_MARKERS[name] for name in _VENDOR_MARKERS if name in item.keywords
        )
    ]
    if vendor == "sqlite":
        skip = pytest.mark.skip(reason="needs a database server: set DATABASE_URL")
        for item in foreign:
            item.add_marker(skip)
    elif foreign:
        config.hook.pytest_deselected(items=foreign)
        items[:] = [item for item in items if item not in foreign]


@pytest.fixture(scope="session", autouse=True)
def _close_pools(request: pytest.FixtureRequest) -> Iterator[None]:
    """With Django's pool on (``IDEMPOTENCY_TEST_POOL``, issue 39), close the pools before the
    test database is dropped: their idle connections would keep it in use."""
    if not os.environ.get("IDEMPOTENCY_TEST_POOL"):
        yield
        return
    request.getfixturevalue("django_db_setup")
    yield
    for each in connections.all(initialized_only=True):
        if getattr(each, "pool", None) is not None:
            each.close_pool()


#: The URLconfs with atomic views (none names a store of its own).
_ATOMIC_URLCONFS = (
    "tests.urls",
    "tests.principals_urls",
    "tests.storing_urls",
    "tests.hostile_urls",
    "tests.outbox_urls",
)


@pytest.fixture(scope="session", autouse=True)
def _redis_store_default() -> Iterator[None]:
    """Under ``IDEMPOTENCY_TEST_STORE=redis``, ``STORE``'s default is the ``redis`` cache
    alias: a test's ``override_settings(IDEMPOTENCY=...)`` keeps it, as it keeps every other
    default.

    The URLconfs' atomic views (the database store's tests) are decorated first, as a
    project's are under its own settings: decoration refuses atomic mode on a Redis
    ``STORE``, and a URLconf first imported under ``override_settings`` would be refused.
    """
    for urls in _ATOMIC_URLCONFS:
        importlib.import_module(urls)
    if not REDIS_STORE:
        yield
        return
    from django_idempotency._conf.settings import Settings, _clear_caches

    Settings.STORE.default = REDIS_STORE_NAME
    _clear_caches(setting="IDEMPOTENCY")
    yield
    Settings.STORE.default = "database"
    _clear_caches(setting="IDEMPOTENCY")


@pytest.fixture(autouse=True)
def _redis_store_empty() -> None:
    """Each test on the Redis store starts with no record (the test database's are rolled
    back; Redis keeps what it was given)."""
    if REDIS_STORE:
        flush_redis()


def redis_raw(key_hash: str | None) -> tuple[str, bytes | None]:
    """A record's headers and body as the Redis store holds them (``None``: the only record)."""
    client = redis_client()
    found = list(client.scan_iter(match=f"idempotency:r:*{key_hash or ''}}}"))
    assert len(found) == 1, found
    headers, body = client.hmget(found[0], "rh", "rb")
    return headers.decode(), body


def redis_records(key_hash: str | None = None) -> list[Any]:
    """The Redis store's records (of one key hash, or all), as the model's unsaved instances:
    what a test of the semantic suite reads of a record, on either store."""
    from django_idempotency._conf.values import store_alias
    from django_idempotency._store import using

    client = redis_client()
    store: Any = using(store_alias(REDIS_STORE_NAME, "default"))
    found = []
    for name in client.scan_iter(match=f"idempotency:r:*{key_hash or ''}}}"):
        scope = client.hget(name, "sc")
        if scope is not None:
            found.append(store.read(scope.decode(), name.decode().rpartition(":")[2][:-1]))
    return [record for record in found if record is not None]


def stored() -> list[Any]:
    """Every record, on whichever store the suite runs on (``IDEMPOTENCY_TEST_STORE``)."""
    if REDIS_STORE:
        return redis_records()
    from django_idempotency import IdempotencyKey

    return list(IdempotencyKey.objects.all())


def only_record() -> Any:
    """The one record, on either store (as ``IdempotencyKey.objects.get()``)."""
    (record,) = stored()
    return record


def redis_client() -> Any:
    """A client of the tests' Redis server (``IDEMPOTENCY_TEST_REDIS_STORE_URL``), or cluster."""
    import redis
    from django.conf import settings

    if REDIS_CLUSTER:
        from django_idempotency._store.redis.clients import cluster_client

        return cluster_client(settings.REDIS_URL)
    return redis.Redis.from_url(settings.REDIS_URL)


def flush_redis() -> None:
    """Empty the tests' Redis database (its own number), or every primary of the cluster."""
    client = redis_client()
    if REDIS_CLUSTER:
        client.flushdb(target_nodes=client.PRIMARIES)
    else:
        client.flushdb()


@pytest.fixture
def key() -> str:
    return str(uuid.uuid4())


@pytest.fixture
def post(client: Client) -> Callable[..., Any]:
    """POST JSON with an Idempotency-Key (``key=None`` sends none)."""

    def send(path: str, data: Any = None, *, key: str | None, **extra: Any) -> Any:
        headers = dict(extra.pop("headers", {}))
        if key is not None:
            headers["Idempotency-Key"] = key
        content_type = extra.pop("content_type", "application/json")
        return client.post(path, data or {}, content_type=content_type, headers=headers, **extra)

    return send


#: Why the MySQL/MariaDB tests that need mysqlclient skip without it: it is the ``mysql`` extra,
#: not the ``test`` one, because it builds against the client headers a bare machine lacks
#: (issue 26). CI's MariaDB legs install it and fail on a skip.
NEEDS_MYSQLCLIENT = (
    "needs mysqlclient, the [mysql] extra: pip install -e '.[test,mysql]' "
    "(it builds against the MySQL/MariaDB client headers)"
)


def executions(label: str | None = None) -> int:
    queryset = Execution.objects.all()
    return (queryset.filter(label=label) if label else queryset).count()


def worker_environment() -> dict[str, str]:
    """The environment of a worker process using this run's test database."""
    settings = connection.settings_dict
    if connection.vendor == "sqlite":  # the test database's file
        url = f"sqlite:///{settings['NAME']}"
    else:
        scheme = "postgres" if connection.vendor == "postgresql" else connection.vendor
        url = f"{scheme}://{settings['USER']}@{settings['HOST']}:{settings['PORT']}/{settings['NAME']}"
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": url}


@contextmanager
def unreachable(alias: str = "unreachable") -> Iterator[None]:
    """Point ``alias`` at a server that refuses connections (PostgreSQL, MySQL) or a file that
    cannot be opened (SQLite), until the block ends."""
    connection = connections[alias]
    # Detached, not closed (a SQLite test mirror shares the in-memory database's connection),
    # and put back as it was.
    state = dict(connection.__dict__)
    connection.connection = None
    if connection.vendor != "sqlite":
        changes = {"HOST": "127.0.0.1", "PORT": "1", "OPTIONS": {"connect_timeout": 2}}
    else:
        changes = {"NAME": "/nonexistent-directory/idempotency.sqlite3"}
    connection.settings_dict = {**connection.settings_dict, **changes}
    try:
        yield
    finally:
        connection.__dict__.clear()
        connection.__dict__.update(state)


def on_postgresql() -> bool:
    return connection.vendor == "postgresql"


def problem_slug(response: Any) -> str:
    """The slug of an RFC 9457 problem response's ``type``."""
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == response.status_code
    assert body["title"] and body["detail"]
    return str(body["type"].rsplit("#", 1)[1])


@pytest.fixture
def uncommitted_record() -> Iterator[str]:
    """A key whose record another connection inserted and has not committed (the default
    fingerprint of :func:`tests.factories.claim`)."""
    from tests.factories import IdempotencyKeyFactory  # models: after Django's setup

    key = str(uuid.uuid4())
    inserted, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                IdempotencyKeyFactory(key=key, request_hash="f" * 64)
                inserted.set()
                assert release.wait(timeout=30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert inserted.wait(timeout=30)
        yield key
    finally:
        release.set()
        holder.join(timeout=30)
