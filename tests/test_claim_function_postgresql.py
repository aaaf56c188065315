"""The PostgreSQL claim function: in step with the code, the same outcomes as the statements it
replaces, a bounded lock wait that is still a ``LockWaitTimeout``, and a fallback without it."""

from __future__ import annotations

import importlib
import uuid
from datetime import timedelta
from typing import Any, cast

import pytest
from django.db import connection, connections, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext

from django_idempotency import Claim, IdempotencyKey, LockWaitTimeout
from django_idempotency import _store as store
from django_idempotency._base import rules
from django_idempotency._store import postgresql, rows, statements
from django_idempotency._store.postgresql import CLAIM_FUNCTION, PostgreSQLStore
from django_idempotency._store.rows import Record
from tests import factories
from tests.factories import IdempotencyKeyFactory

pytestmark = [pytest.mark.postgresql]

#: The latest migration that made the function.
MIGRATION = importlib.import_module(
    "django_idempotency.migrations.0009_takeover_keeps_expiry_past_lock"
)
FINGERPRINT = "f" * 64


class _Quoting:
    """What :meth:`Statements.build` reads of a connection: PostgreSQL's quoting of names."""

    class ops:  # the attribute of a connection
        @staticmethod
        def quote_name(name: str) -> str:
            return f'"{name}"'


#: Each claim value's argument in the function (the claim's time once, for both its times).
ARGUMENT = {name: f"p_{name}" for name in statements.CLAIM_PARAMS} | {
    "created_at": "p_now",
    "updated_at": "p_now",
}
#: The takeover rule's values in the function.
RULE = {"now": "p_now", "request_hash": "p_request_hash", "processing": "p_processing"}


def _into(sql: str) -> str:
    """A statement of :class:`Statements` as the function runs it: the row into ``found_row``."""
    if " RETURNING " in sql:
        return sql[: sql.index(" RETURNING ")] + " RETURNING * INTO found_row"
    columns = sql[len("SELECT ") : sql.index(" FROM ")]
    return sql.replace(f"SELECT {columns} ", "SELECT * INTO found_row ", 1)


def test_the_migrations_function_runs_the_statements_the_code_builds() -> None:
    """Change the table or the rules, and this fails until a migration replaces the function:
    its arguments, its read, insert and takeover, and the takeover rule, each as the code's
    :class:`Statements` and rules build them."""
    create = MIGRATION.CREATE
    built = statements.Statements.build(cast(Any, _Quoting))
    q = _Quoting.ops.quote_name
    arguments = ",\n    ".join(f"{name} {kind}" for name, kind in postgresql._ARGUMENTS)
    assert create.startswith(f"CREATE OR REPLACE FUNCTION {CLAIM_FUNCTION}(\n    {arguments}\n)")
    assert f"p_processing CONSTANT text := '{rules.PROCESSING}';" in create
    select = _into(statements.fill(built.select, ["p_scope", "p_key_hash"]))
    assert create.count(f"{select};") == 2  # the read first, and again after a lost insert
    insert = statements.fill(built.insert, [ARGUMENT[name] for name in statements.CLAIM_PARAMS])
    assert f"{_into(insert)};" in create
    # In the order of the placeholders of Statements.take_over, as Store.take_over sends them.
    fresh = statements.TAKEOVER_FRESH
    values = [ARGUMENT[name] for name in fresh if name not in statements.CLAIM_LITERALS]
    values += ["p_now"] * 5 + ["p_now", "p_expires_at", "p_unlock_at", "p_unlock_at"]
    values += ["found_row.id"]
    values += [RULE[name] for name in rules.TAKEOVER.params]
    assert f"{_into(statements.fill(built.take_over, values))};" in create
    rule = rules.TAKEOVER.where(lambda column: f"found_row.{q(column)}")
    holds = statements.fill(rule, [RULE[name] for name in rules.TAKEOVER.params])
    assert f"IF NOT claimed OR {holds} THEN" in create
    assert f"IF claimed AND NOT inserted AND {holds} THEN" in create


def test_the_function_writes_every_column_the_model_has() -> None:
    """A new field must be written by the claim (and so by the function) or be one of these,
    which a claim leaves empty."""
    written = set(statements._INSERT_COLUMNS)
    assert set(rows.COLUMNS) - written == {
        "id",
        "response_status",
        "response_body",
        "recovery_data",
    }


@pytest.mark.django_db
def test_the_database_has_the_migrations_function() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT prosrc FROM pg_proc WHERE proname = %s", [CLAIM_FUNCTION])
        sources = [row[0] for row in cursor.fetchall()]
    assert sources == [MIGRATION.CREATE.split("$claim$")[1]]


def claim(key: str, request_hash: str = FINGERPRINT) -> store.ClaimOutcome:
    return factories.claim(key, fingerprint=request_hash)


def without_function(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(PostgreSQLStore, "has_function", lambda self, connection: False)


#: A record in place before the claim, and whether the claim takes it over.
RECORDS: dict[str, tuple[dict[str, Any], bool]] = {
    "completed": ({"completed": True}, False),
    "processing": ({}, False),
    "expired": ({"completed": True, "expired": True}, True),
    "stale, same request": ({"stale": True, "recovery_point": "charge", "attempt": 2}, True),
    "stale, another request": ({"stale": True, "request_hash": "0" * 64}, False),
}


def outcome_of(outcome: store.ClaimOutcome) -> tuple[Any, ...]:
    """What a caller sees of a claim, and the record it leaves."""
    if isinstance(outcome, Claim):
        record = IdempotencyKey.objects.get(pk=outcome.pk)
        seen: tuple[Any, ...] = ("claimed", outcome.attempt, outcome.recovery_point)
    else:
        assert isinstance(outcome, (IdempotencyKey, Record))
        record, seen = outcome, ("held",)
    stored = IdempotencyKey.objects.get(pk=record.pk)
    fields = ("status", "attempt", "recovery_point", "recovery_data", "request_hash")
    fields += ("response_status", "response_headers", "method", "path")
    return (*seen, *(getattr(stored, name) for name in fields))


@pytest.mark.django_db
@pytest.mark.parametrize("record", list(RECORDS))
def test_the_function_decides_as_the_statements_do_in_one_round_trip(
    record: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    factory, taken_over = RECORDS[record]
    # Checked once per process: not counted.
    assert PostgreSQLStore("default").has_function(connection)
    results, counts = [], []
    for function in (True, False):
        if not function:
            without_function(monkeypatch)
        key = str(uuid.uuid4())
        IdempotencyKeyFactory(key=key, **{"request_hash": FINGERPRINT, **factory})
        with CaptureQueriesContext(connection) as queries:
            outcome = claim(key)
        results.append(outcome_of(outcome))
        counts.append(len(queries))
    assert results[0] == results[1]
    assert results[0][0] == ("claimed" if taken_over else "held")
    # The function takes a record over in the same call; the statements need a second one.
    assert counts == [1, 2 if taken_over else 1]


@pytest.mark.django_db
def test_a_new_key_is_claimed_alike_with_and_without_the_function(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = claim(str(uuid.uuid4()))
    without_function(monkeypatch)
    second = claim(str(uuid.uuid4()))
    assert (
        outcome_of(first)
        == outcome_of(second)
        == ("claimed", 1, "", "processing", 1, "", None, FINGERPRINT, None, [], "POST", "/create/")
    )


@pytest.mark.django_db(transaction=True)
def test_a_lock_wait_that_runs_out_in_the_function_is_a_lock_wait_timeout(
    uncommitted_record: str,
) -> None:
    """Inside the function, and the caller's ``lock_timeout`` is back once the claim returns."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '7s'")
        with transaction.atomic():
            previous = store.using("default").limit_lock_wait(timedelta(milliseconds=200))
            with CaptureQueriesContext(connection) as queries, pytest.raises(LockWaitTimeout):
                claim(uncommitted_record)
            assert [query["sql"] for query in queries] == [queries[0]["sql"]]
            assert f", {CLAIM_FUNCTION}(" in queries[0]["sql"]
            transaction.set_rollback(True)
        store.using("default").restore_lock_wait(previous)
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone() == ("7s",)


@pytest.mark.django_db(transaction=True)
def test_the_function_restores_the_callers_lock_timeout_when_it_claims() -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '7s'")
        store.using("default").limit_lock_wait(timedelta(seconds=2))
        assert isinstance(claim(str(uuid.uuid4())), Claim)
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone() == ("7s",)


@pytest.mark.django_db(transaction=True)
def test_a_two_phase_claim_inside_an_atomic_view_does_not_inherit_its_bound(
    uncommitted_record: str,
) -> None:
    """The bound holds for the atomic block it was set in, not for code inside it after the
    claim restored it (a two-phase ``idempotent_function`` called by an atomic view)."""
    with transaction.atomic():
        previous = store.using("default").limit_lock_wait(timedelta(milliseconds=1))
        store.using("default").restore_lock_wait(previous)
        assert postgresql._bound(connections["default"]) is None
    with transaction.atomic():
        store.using("default").limit_lock_wait(timedelta(milliseconds=1))
    with transaction.atomic():  # another block: the bound of the one before is gone with it
        assert postgresql._bound(connections["default"]) is None


@pytest.mark.django_db
def test_without_the_function_the_app_claims_with_statements(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A table made by ``--nomigrations``: the check (once per process and database) finds no
    function, and the claim falls back. (``DROP FUNCTION`` is undone with the test's
    transaction.)"""
    monkeypatch.setattr(postgresql, "_HAS_FUNCTION", {})
    with connection.cursor() as cursor:
        cursor.execute(MIGRATION.DROP)
    client, key = Client(), str(uuid.uuid4())
    with CaptureQueriesContext(connection) as queries:
        first = client.post(
            "/create/", {}, content_type="application/json", headers={"Idempotency-Key": key}
        )
        replay = client.post(
            "/create/", {}, content_type="application/json", headers={"Idempotency-Key": key}
        )
    assert (first.status_code, replay.status_code) == (201, 201)
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert not any(f", {CLAIM_FUNCTION}(" in query["sql"] for query in queries)
    assert sum("to_regprocedure" in query["sql"] for query in queries) == 1


@pytest.mark.django_db(transaction=True)
def test_a_function_dropped_after_the_check_falls_back_without_a_500(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(postgresql, "_HAS_FUNCTION", {})
    client = Client()
    post = lambda key: client.post(  # noqa: E731
        "/create/", {}, content_type="application/json", headers={"Idempotency-Key": key}
    )
    assert post(str(uuid.uuid4())).status_code == 201  # checked: the function is there
    with connection.cursor() as cursor:
        cursor.execute(MIGRATION.DROP)
    try:
        assert post(str(uuid.uuid4())).status_code == 201
        assert post(str(uuid.uuid4())).status_code == 201
    finally:
        with connection.cursor() as cursor:
            cursor.execute(MIGRATION.CREATE)


@pytest.mark.django_db
@pytest.mark.parametrize("record", ["completed", "processing", "stale, another request"])
def test_the_record_a_claim_reads_is_the_one_the_orm_loads(record: str) -> None:
    """The claim reads times and the token as text (cheaper than loading them) and converts a
    field when asked: every field, and the model instance signals get, are the ORM's."""
    factory, _ = RECORDS[record]
    key = str(uuid.uuid4())
    IdempotencyKeyFactory(
        key=key, **{"request_hash": FINGERPRINT, "recovery_data": {"n": [1]}, **factory}
    )
    outcome = claim(key)
    assert isinstance(outcome, Record)
    loaded = IdempotencyKey.objects.get(pk=outcome.pk)
    for field in rows.FIELDS:
        assert getattr(outcome, field.attname) == getattr(loaded, field.attname), field.name
    instance = outcome.instance()
    assert type(instance) is IdempotencyKey and not instance._state.adding
    assert [getattr(instance, name) for name in rows.ATTNAMES] == [
        getattr(loaded, name) for name in rows.ATTNAMES
    ]
    assert instance.unlock_at is None or instance.unlock_at.tzinfo is not None


def _claim_statements(run: Any) -> list[str]:
    """The statements on the table that ``run()`` sends, each as its kind: the call, a read,
    the plain insert (``WITH inserted``), a takeover."""
    sent: list[str] = []

    def record(execute: Any, sql: str, *rest: Any) -> Any:
        if f"{CLAIM_FUNCTION}(" in sql:
            sent.append("call")
        elif sql.startswith("WITH inserted"):
            sent.append("insert")
        elif sql.startswith("UPDATE") and IdempotencyKey._meta.db_table in sql:
            sent.append("update")
        elif sql.startswith("SELECT") and f'FROM "{IdempotencyKey._meta.db_table}"' in sql:
            sent.append("read")
        return execute(sql, *rest)

    with connection.execute_wrapper(record):
        run()
    return sent


def _new_session() -> None:
    """The suite's connection closed, and with Django's pool on (the pool leg) the pool too:
    closed, a pooled connection's session is handed to the next checkout as it is."""
    connection.close()
    if getattr(connection, "pool", None) is not None:
        connection.close_pool()


@pytest.mark.django_db(transaction=True)
def test_a_new_session_s_first_claim_reads_without_compiling_the_function() -> None:
    """Issue 53: loading PL/pgSQL and compiling the function, once per session, cost a new
    session's replay twice a plain read, and with ``CONN_MAX_AGE`` 0 (or under ASGI) every
    request's session is new: async replays served fewer requests a second than the bare view,
    which inserts and commits. A session's first claim outside a transaction reads the record
    with a plain statement; its next claims call the function."""
    client, key = Client(), str(uuid.uuid4())
    post = lambda key: client.post(  # noqa: E731
        "/create/", {}, content_type="application/json", headers={"Idempotency-Key": key}
    )
    assert post(key).status_code == 201
    _new_session()  # the next request's session is a new one
    replays: list[Any] = []
    sent = _claim_statements(lambda: replays.extend([post(key), post(key)]))
    assert [replay.headers["Idempotent-Replayed"] for replay in replays] == ["true", "true"]
    assert sent == ["read", "call"]
    _new_session()
    assert _claim_statements(lambda: post(str(uuid.uuid4())).status_code == 201) == [
        "read",
        "insert",
        "update",  # the result stored
    ]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("record", list(RECORDS))
def test_a_new_session_s_first_claim_decides_as_the_function_does(record: str) -> None:
    factory, taken_over = RECORDS[record]
    results = []
    for fresh in (True, False):
        key = str(uuid.uuid4())
        IdempotencyKeyFactory(key=key, **{"request_hash": FINGERPRINT, **factory})
        if fresh:
            _new_session()
        outcomes: list[store.ClaimOutcome] = []
        sent = _claim_statements(lambda: outcomes.append(claim(key)))  # noqa: B023
        results.append(outcome_of(outcomes[0]))
        plain = ["read", "update"] if taken_over else ["read"]
        assert sent == (plain if fresh else ["call"]), sent
    assert results[0] == results[1]
    assert results[0][0] == ("claimed" if taken_over else "held")


@pytest.mark.django_db(transaction=True)
def test_a_session_that_claimed_calls_the_function_from_any_wrapper() -> None:
    """A pool hands one server session to a different connection object at each checkout: what
    a session has claimed is kept with the driver's connection, not Django's wrapper."""
    _new_session()
    claim(str(uuid.uuid4()))  # this session's first claim: plain statements
    other = connections.create_connection("default")
    other.connection = connection.connection  # the same session, as a pool's checkout
    try:
        assert PostgreSQLStore.claims_by_call(other)
        _new_session()  # a wrapper that has not claimed on it reads plainly
        connection.ensure_connection()
        assert not PostgreSQLStore.claims_by_call(connection)
    finally:
        other.connection = None  # not closed twice: it was the suite's connection's
