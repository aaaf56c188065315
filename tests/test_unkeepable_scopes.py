"""A scope no store keeps exactly is refused, never cut or folded (issue 48).

PostgreSQL's libpq takes a text parameter as a C string: ``tenant:a\\0zz`` was stored and found
as ``tenant:a``. A NUL reaches a scope from a URL (``/t/acme%00x/`` arrived through gunicorn as
``tenant:acme\\x00x``): with a fingerprint that leaves the scope out each tenant was replayed the
other's response, with the default one the victim got ``422``; with ``DEBUG`` on, psycopg's
cursor refused the NUL and the answer was ``503``. On MariaDB, a ``utf8mb3`` table under a
non-strict ``sql_mode`` made ``tenant:😀`` and ``tenant:😁`` one ``tenant:?``: the system check
E034 refuses such a table or session.

The tests go through the URL resolver and the test client, as a client's bytes arrive, on the
database the suite runs on, with ``DEBUG`` off (the libpq fast path) and on (psycopg's cursor).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import DataError, connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client, override_settings
from django.urls import path

from django_idempotency import idempotent, idempotent_function
from django_idempotency._ops import checks
from django_idempotency._store import charsets, rows
from django_idempotency._store.limits import unkeepable
from django_idempotency.models import IdempotencyKey
from tests.conftest import executions
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]


def tenant_scope(request: HttpRequest) -> str:
    """A tenant's keys are its own: the tenant as the URL names it."""
    assert request.resolver_match is not None
    return "tenant:" + request.resolver_match.kwargs["tenant"]


def body_fingerprint(request: HttpRequest, scope: str) -> str:
    """Counts the body alone: only the record's scope keeps one tenant's retry from
    another's response."""
    return hashlib.sha256(request.body).hexdigest()


def _order(request: HttpRequest, tenant: str) -> HttpResponse:
    execution = Execution.objects.create(label="order", payload=tenant)
    return JsonResponse({"id": execution.pk, "tenant": tenant}, status=201)


orders = idempotent(scope=tenant_scope, fingerprint=body_fingerprint)(_order)
invoices = idempotent(scope=tenant_scope)(_order)
redis_orders = idempotent(scope=tenant_scope, fingerprint=body_fingerprint, store="redis")(_order)
atomic_orders = idempotent(scope=tenant_scope, atomic=True)(_order)


def json_scope(request: HttpRequest) -> str:
    """The principal a JSON body names (``"\\ud800"`` is a lone surrogate once parsed)."""
    return "tenant:" + str(json.loads(request.body)["tenant"])


@idempotent(scope=json_scope)
def by_body(request: HttpRequest) -> HttpResponse:
    Execution.objects.create(label="order")
    return HttpResponse(status=201)


@idempotent(fingerprint=lambda request, scope: "v\x00" + request.body.decode())
def nul_fingerprint(request: HttpRequest) -> HttpResponse:
    Execution.objects.create(label="order")
    return HttpResponse(request.body, status=201)


urlpatterns = [
    path("t/<str:tenant>/orders/", orders),
    path("t/<str:tenant>/invoices/", invoices),
    path("t/<str:tenant>/redis-orders/", redis_orders),
    path("t/<str:tenant>/atomic-orders/", atomic_orders),
    path("by-body/", by_body),
    path("nul-fingerprint/", nul_fingerprint),
]


@pytest.fixture(params=[False, True], ids=["production", "debug"])
def debug(request: pytest.FixtureRequest) -> Iterator[bool]:
    """``DEBUG`` off (PostgreSQL: the libpq fast path) and on (psycopg's cursor, which logs
    every query): the answers must be the same."""
    with override_settings(DEBUG=request.param):
        yield request.param


def post(url: str, key: str, body: dict[str, Any] | None = None) -> Any:
    return Client().post(
        url,
        body or {"amount": 5},
        content_type="application/json",
        headers={"Idempotency-Key": key},
    )


def assert_invalid_scope(response: Any, reason: str) -> None:
    assert response.status_code == 400, response.content
    problem = json.loads(response.content)
    assert problem["type"].endswith("invalid-scope")
    assert reason in problem["detail"]
    assert "Idempotent-Replayed" not in response


@pytest.mark.parametrize("endpoint", ["orders", "invoices"])
def test_a_nul_in_a_tenant_s_url_never_joins_two_tenants(debug: bool, endpoint: str) -> None:
    """``/t/a%00zz/`` names the tenant ``a\\0zz``: refused, neither replayed ``a``'s response
    (a fingerprint without the scope) nor ``422`` (the default one), nor ``503`` in debug."""
    key = str(uuid.uuid4())
    first = post(f"/t/a/{endpoint}/", key)
    assert first.status_code == 201
    assert json.loads(first.content)["tenant"] == "a"

    assert_invalid_scope(post(f"/t/a%00zz/{endpoint}/", key), "with a NUL character")
    assert executions("order") == 1
    assert list(IdempotencyKey.objects.values_list("scope", flat=True)) == ["tenant:a"]
    # And the other way round: a key first sent by the NUL tenant claims nothing.
    other = str(uuid.uuid4())
    assert_invalid_scope(post(f"/t/a%00zz/{endpoint}/", other), "NUL")
    answer = post(f"/t/a/{endpoint}/", other)
    assert (answer.status_code, json.loads(answer.content)["tenant"]) == (201, "a")
    assert "Idempotent-Replayed" not in answer
    assert executions("order") == 2


@pytest.mark.parametrize(
    ("tenant", "reason"),
    [("\\ud800", "lone surrogate"), ("a ", "whitespace around it"), ("a\\u0000", "NUL")],
)
def test_a_scope_no_database_can_hold_is_refused(debug: bool, tenant: str, reason: str) -> None:
    """A lone surrogate has no UTF-8 (every driver raised ``UnicodeEncodeError``: a ``500``);
    MySQL ignores trailing spaces. One refusal for all, before the claim."""
    body = json.loads(f'{{"tenant": "{tenant}"}}')
    assert_invalid_scope(post("/by-body/", str(uuid.uuid4()), body), reason)
    assert executions("order") == 0
    assert not IdempotencyKey.objects.exists()


def test_a_fingerprint_with_a_nul_is_kept_whole(debug: bool) -> None:
    """Cut at its NUL, the stored fingerprint (``v``) matched no retry: the client's own retry
    of the same body was a ``422``. Stored hashed, the retry is replayed and another body is
    a ``422``."""

    def send(body: str) -> Any:
        headers = {"Idempotency-Key": key}
        return Client().post("/nul-fingerprint/", body, "text/plain", headers=headers)

    key = str(uuid.uuid4())
    assert send("one").status_code == 201
    retry = send("one")
    assert (retry.status_code, retry.content, retry["Idempotent-Replayed"]) == (201, b"one", "true")
    assert send("two").status_code == 422
    assert executions("order") == 1
    assert "\x00" not in IdempotencyKey.objects.get().request_hash


def test_a_key_with_a_nul_is_refused_over_http() -> None:
    """A header's key is printable ASCII: a NUL is a ``400``, as any control character."""
    response = Client().post("/t/a/orders/", {}, headers={"Idempotency-Key": "a\x00b"})
    assert response.status_code == 400
    assert json.loads(response.content)["type"].endswith("invalid-idempotency-key")
    assert executions("order") == 0


def test_a_function_s_keys_are_kept_exactly_and_a_nul_scope_refused(debug: bool) -> None:
    """A function's key is stored as its SHA-256, so keys that differ after a NUL are two
    records on every database; its scope is stored as it is, so a NUL there is refused."""
    ran: list[str] = []

    @idempotent_function(key="event_id", scope=lambda event_id, tenant: tenant)
    def handle(event_id: str, tenant: str) -> str:
        ran.append(event_id)
        return event_id

    assert handle("e\x001", "t") == "e\x001"
    assert handle("e\x002", "t") == "e\x002"
    assert handle("e\x001", "t") == "e\x001"  # replayed
    assert ran == ["e\x001", "e\x002"]
    with pytest.raises(ValueError, match="its scope was given with a NUL character"):
        handle("e\x001", "t\x00x")
    with pytest.raises(ValueError, match="lone surrogate"):
        handle("e\x001", "t\ud800")
    assert ran == ["e\x001", "e\x002"]
    assert IdempotencyKey.objects.count() == 2


@pytest.mark.redis
def test_the_redis_store_refuses_it_alike(debug: bool) -> None:
    """Redis keeps a NUL, but the refusal is made before the claim, for every store: a view
    moved between stores answers alike."""
    key = str(uuid.uuid4())
    assert post("/t/a/redis-orders/", key).status_code == 201
    assert_invalid_scope(post("/t/a%00zz/redis-orders/", key), "with a NUL character")
    assert executions("order") == 1


def test_unkeepable() -> None:
    assert unkeepable("tenant:a") is None
    assert unkeepable("tenant:ä😀") is None
    assert unkeepable("tenant:a\x00") is not None
    assert unkeepable("tenant:\udfff") is not None
    assert unkeepable("tenant:a\t") is not None


@pytest.mark.postgresql
@pytest.mark.unprepared  # a connection that prepares statements keeps the cursor, never libpq
def test_the_libpq_fast_path_never_cuts_a_text_at_a_nul(debug: bool) -> None:
    """Below every caller: a store statement's text holding a NUL goes to psycopg's cursor,
    which refuses it, with ``DEBUG`` off as on; libpq answered ``a`` for ``a\\0zz``."""
    connection.ensure_connection()
    assert (rows._libpq_connection(connection) is not None) is not debug  # the path tested
    with pytest.raises(DataError, match="NUL"):
        rows._send(connection, "SELECT %s::text", ["a\x00zz"], _one, rows.libpq.first_row)
    assert rows._send(connection, "SELECT %s::text", ["a"], _one, rows.libpq.first_row) == ("a",)


def _one(cursor: Any) -> Any:
    return cursor.fetchone()


# MySQL and MariaDB: the character sets a scope passes through (E034).

NARROW = "test_nul_charset"
TABLE = IdempotencyKey._meta.db_table


@pytest.fixture
def narrow_database() -> Iterator[Any]:
    """A database of this test's own whose idempotency table's scope is ``utf8mb3``, made
    current on the suite's connection; dropped after, and the session given back."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT DATABASE(), @@SESSION.sql_mode")
        ours, mode = cursor.fetchone()
        cursor.execute(f"DROP DATABASE IF EXISTS {NARROW}")
        cursor.execute(f"CREATE DATABASE {NARROW} CHARACTER SET utf8mb3")
        try:
            cursor.execute(f"USE {NARROW}")
            cursor.execute(
                f"CREATE TABLE {TABLE} (id integer AUTO_INCREMENT PRIMARY KEY, scope "
                "varchar(255) CHARACTER SET utf8mb3 COLLATE utf8mb3_nopad_bin NOT NULL)"
            )
            yield cursor
        finally:
            cursor.execute(f"USE {ours}")
            cursor.execute("SET SESSION sql_mode = %s", [mode])
            cursor.execute("SET NAMES utf8mb4")
            cursor.execute(f"DROP DATABASE IF EXISTS {NARROW}")


@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
def test_e034_refuses_a_table_that_folds_scopes(narrow_database: Any) -> None:
    """Non-strict, a ``utf8mb3`` column makes two emoji one ``?``: what the check refuses,
    seen first; strict, the server refuses the scope (each such request fails): refused too."""
    cursor = narrow_database
    cursor.execute("SET SESSION sql_mode = ''")
    for scope in ("tenant:😀", "tenant:😁"):
        cursor.execute(f"INSERT INTO {TABLE} (scope) VALUES (%s)", [scope])
    cursor.execute(f"SELECT DISTINCT scope FROM {TABLE}")
    assert cursor.fetchall() == (("tenant:?",),)  # one principal, where there were two

    (error,) = checks.e034_narrow_character_set("default")
    assert error.id == "django_idempotency.E034"
    assert f"{TABLE}.scope is utf8mb3, not utf8mb4" in error.msg
    assert "character_set" not in error.msg  # the session is utf8mb4
    assert "writes '?'" in error.msg

    cursor.execute("SET SESSION sql_mode = 'STRICT_TRANS_TABLES'")
    (error,) = checks.e034_narrow_character_set("default")
    assert "server refuses a scope" in error.msg


@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
def test_e034_refuses_a_session_that_folds_scopes(narrow_database: Any) -> None:
    """A ``utf8mb3`` session (``OPTIONS['charset']``) folds as the column does, whatever the
    table: it is refused, and the table's own ``utf8mb4`` does not hide it."""
    cursor = narrow_database
    cursor.execute(f"ALTER TABLE {TABLE} MODIFY scope varchar(255) CHARACTER SET utf8mb4 NOT NULL")
    assert checks.e034_narrow_character_set("default") == []
    cursor.execute("SET NAMES utf8mb3")
    cursor.execute("SET SESSION sql_mode = ''")
    (error,) = checks.e034_narrow_character_set("default")
    assert "character_set_client is utf8mb3, character_set_connection is utf8mb3" in error.msg
    assert TABLE not in error.msg


@pytest.mark.mysql
def test_e034_passes_the_suite_s_own_database() -> None:
    """``utf8mb4`` all the way (Django's default charset, the migrated table and procedure),
    strict or not: nothing to refuse."""
    assert checks.e034_narrow_character_set("default") == []
    reported = checks.check_database_server(databases=["default"])
    assert not [m for m in reported if m.id.endswith("E034")]


@pytest.fixture
def narrow_session() -> Iterator[Any]:
    """The thread's ``default`` connection replaced by one whose ``OPTIONS`` make every session
    ``utf8mb3`` and non-strict (``charset``, ``init_command``), as a project's settings would,
    on a database of this test's own (dropped after); the suite's connection given back."""
    from django.db import connections

    name = "fix48b_narrow_session"
    ours = connections["default"]
    with ours.cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {name}")
        cursor.execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
    narrow = ours.copy()
    narrow.settings_dict = {
        **ours.settings_dict,
        "NAME": name,
        "OPTIONS": {
            **ours.settings_dict.get("OPTIONS", {}),
            "charset": "utf8mb3",
            "init_command": "SET sql_mode=''",
        },
    }
    connections["default"] = narrow
    try:
        yield narrow
    finally:
        connections["default"] = ours
        narrow.close()
        with ours.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {name}")


@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("endpoint", ["orders", "atomic-orders"])
def test_a_utf8mb3_session_is_refused_before_the_first_claim(
    narrow_session: Any, endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    """gunicorn runs no checks: with ``OPTIONS={"charset": "utf8mb3"}`` and a non-strict
    ``sql_mode``, ``tenant:😀`` and ``tenant:😁`` were one record, each replayed the other's
    response. The character sets are asked once per connection before its first claim (or
    replay read): ``500 idempotency-misconfigured`` in E034's words, the view not run."""
    with override_settings(DEBUG=False):
        for _ in range(2):
            answer = post(f"/t/😀/{endpoint}/", str(uuid.uuid4()))
            assert answer.status_code == 500
            assert json.loads(answer.content)["type"].endswith("idempotency-misconfigured")
    assert "(django_idempotency.E034)" in caplog.text
    assert "character_set_client is utf8mb3" in caplog.text
    with narrow_session.cursor() as cursor:
        cursor.execute(
            "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s",
            [narrow_session.settings_dict["NAME"]],
        )
        assert cursor.fetchone() == (0,)  # nothing claimed: the database has no table at all

    @idempotent_function(key="event_id")
    def handle(event_id: str) -> str:
        raise AssertionError("never runs")

    with pytest.raises(ImproperlyConfigured, match="E034"):
        handle("e-1")
    with override_settings(SILENCED_SYSTEM_CHECKS=["django_idempotency.E034"]):
        from django_idempotency._call.lifecycle import narrow_store
        from django_idempotency._conf.options import Options

        assert narrow_store(Options().resolve()) is None


@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
def test_a_utf8mb4_session_claims_as_before() -> None:
    """The suite's own connection: asked once, nothing found, the claim runs."""
    assert post("/t/😀/atomic-orders/", str(uuid.uuid4())).status_code == 201
    assert executions("order") == 1


@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
def test_the_character_sets_are_asked_once_per_database_not_per_connection_object() -> None:
    """Under ASGI each request's database work runs on a thread of its own, with a connection
    object of its own (Django's are per thread): asked once per connection object, the
    character sets cost every async request three statements more (two of them reading
    ``information_schema``), a replay more than the bare view's ``INSERT`` did (issue 53). A
    new connection object made from the same settings asks nothing before its claim."""
    from django.db import connections

    # Two threads' connection objects, made as Django makes every new thread's: from the
    # alias's settings. Not this thread's own, which an earlier test may have left another's:
    # a relay run on this thread keeps there the copy it connected (its settings a copy too).
    asked, fresh = (
        connections.create_connection("default"),
        connections.create_connection("default"),
    )
    ours = connections["default"]
    key = str(uuid.uuid4())
    sent: list[str] = []

    def record(execute: Any, sql: str, *rest: Any) -> Any:
        sent.append(sql)
        return execute(sql, *rest)

    try:
        connections["default"] = asked
        assert post("/t/😀/orders/", key).status_code == 201  # asked for these settings, if not yet
        # Known now: the request's ask is bounded (a second), and one a loaded machine answered
        # later is cut and keeps nothing; asked again here, unbounded, if so.
        charsets.known_narrow(asked)
        connections["default"] = fresh
        with fresh.execute_wrapper(record):
            replay = post("/t/😀/orders/", key)
            first = post("/t/😀/orders/", str(uuid.uuid4()))
    finally:
        connections["default"] = ours
        asked.close()
        fresh.close()
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert first.status_code == 201
    assert not [sql for sql in sent if "character_set" in sql or "information_schema" in sql]
    assert sent  # the claims went through the wrapper: it saw them


@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
def test_a_connection_made_again_after_a_fault_asks_the_character_sets_no_more() -> None:
    """A connection made again after a fault (the claim's, the renewer's) is a copy, with a
    settings dict of its own and a connect timeout added: kept by the dict, the character sets
    were asked again on each copy, and a finding kept for each, without end."""
    from django.db import connections

    base = connections.create_connection("default")
    copies = [base.copy() for _ in range(3)]
    for copy in copies:
        copy.settings_dict.setdefault("OPTIONS", {})["connect_timeout"] = 5
    sent: list[str] = []

    def record(execute: Any, sql: str, *rest: Any) -> Any:
        sent.append(sql)
        return execute(sql, *rest)

    try:
        charsets.known_narrow(base)
        known = len(charsets._KNOWN)
        for copy in copies:
            with copy.execute_wrapper(record):
                charsets.known_narrow(copy)
    finally:
        for each in (base, *copies):
            each.close()
    assert not sent, sent
    assert len(charsets._KNOWN) == known
