"""A replay answered by one read (issue 42): atomic mode reads a finished record before its
transaction opens; PostgreSQL's store statements go through libpq below psycopg's cursor;
MariaDB's atomic claim carries its lock-wait bound in its own statement.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import DatabaseError, OperationalError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_idempotency._store import libpq, rows, using
from django_idempotency._store.postgresql import read_record
from django_idempotency.models import IdempotencyKey
from tests.conftest import executions

pytestmark = pytest.mark.django_db

Post = Callable[..., Any]
TABLE = IdempotencyKey._meta.db_table


def _sent(queries: CaptureQueriesContext) -> list[str]:
    return [query["sql"] for query in queries.captured_queries]


def test_an_atomic_replay_is_one_read_outside_any_transaction(post: Post, key: str) -> None:
    first = post("/atomic/", {"a": 1}, key=key)
    with CaptureQueriesContext(connection) as queries:
        replay = post("/atomic/", {"a": 1}, key=key)
    assert replay.status_code == first.status_code
    assert replay.content == first.content
    assert replay["Idempotent-Replayed"] == "true"
    sent = _sent(queries)
    # No BEGIN, SAVEPOINT, COMMIT, lock-wait bound: the read alone.
    assert len(sent) == 1, sent
    assert TABLE in sent[0], sent
    assert executions("atomic") == 1


def test_an_atomic_mismatch_is_answered_by_the_same_read(post: Post, key: str) -> None:
    post("/atomic/", {"a": 1}, key=key)
    with CaptureQueriesContext(connection) as queries:
        other = post("/atomic/", {"a": 2}, key=key)
    assert other.status_code == 422
    assert len(_sent(queries)) == 1, _sent(queries)
    assert executions("atomic") == 1


def test_an_expired_record_is_not_replayed_by_the_read(post: Post, key: str) -> None:
    """The read takes only a live finished record: an expired one is claimed anew in the
    transaction, and the view runs again."""
    post("/atomic/", {"a": 1}, key=key)
    IdempotencyKey.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    again = post("/atomic/", {"a": 1}, key=key)
    assert again.status_code == 201
    assert "Idempotent-Replayed" not in again
    assert executions("atomic") == 2


def test_an_unfinished_record_goes_to_the_claim(post: Post, key: str) -> None:
    """A ``processing`` record is not the read's: the claim decides (here: in progress)."""
    post("/atomic/", {"a": 1}, key=key)
    IdempotencyKey.objects.update(
        status=IdempotencyKey.Status.PROCESSING, unlock_at=timezone.now() + timedelta(hours=1)
    )
    assert post("/atomic/", {"a": 1}, key=key).status_code == 409
    assert executions("atomic") == 1


# --- PostgreSQL: the store's statements through libpq ------------------------------------------

#: Left out on MySQL and MariaDB, skipped on SQLite (tests/conftest.py): CI fails on a skip on a
#: server. The test extra installs psycopg 3, whose libpq the statements go through.
postgresql = pytest.mark.postgresql
#: Through libpq: not on a connection that prepares statements (it keeps the cursor).
unprepared = pytest.mark.unprepared


@pytest.fixture
def through_libpq(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The statements libpq sent (those the cursor sent are not in it)."""
    sent: list[str] = []
    execute = libpq.execute

    def counted(raw: Any, sql: str, params: list[Any]) -> Any:
        result = execute(raw, sql, params)
        if result is not None:
            sent.append(sql)
        return result

    monkeypatch.setattr(libpq, "execute", counted)
    return sent


@postgresql
@unprepared
@pytest.mark.parametrize("path", ["/create/", "/atomic/"])
def test_the_claim_and_the_result_go_through_libpq(
    post: Post, key: str, path: str, through_libpq: list[str]
) -> None:
    first = post(path, {"a": 1}, key=key)
    replay = post(path, {"a": 1}, key=key)
    assert replay.content == first.content
    assert replay["Idempotent-Replayed"] == "true"
    claims = [sql for sql in through_libpq if "django_idempotency_claim(" in sql]
    writes = [sql for sql in through_libpq if sql.startswith("UPDATE")]
    reads = [sql for sql in through_libpq if sql.startswith("SELECT") and sql not in claims]
    assert len(claims) == (1 if path == "/atomic/" else 2), through_libpq
    assert len(writes) == 1, through_libpq
    assert len(reads) == (2 if path == "/atomic/" else 0), through_libpq  # atomic: read first


@postgresql
@unprepared
def test_values_go_and_come_back_as_the_cursor_sends_them(through_libpq: list[str]) -> None:
    """Text (a text choice's enum too), integers, ``NULL`` and any bytes (sent as binary)."""
    connection.ensure_connection()
    record = IdempotencyKey.objects.create(
        scope="s", key_hash="k" * 64, method="POST", path="/p", request_hash="r" * 64,
        unlock_at=timezone.now(), expires_at=timezone.now() + timedelta(hours=1),
    )  # fmt: skip
    body = bytes(range(256)) + b"\x00end"
    matched = rows.count_rows(
        connection,
        f'UPDATE "{TABLE}" SET "status" = %s, "response_status" = %s, "response_body" = %s, '
        f'"recovery_data" = %s WHERE "id" = %s',
        [IdempotencyKey.Status.COMPLETED, 201, body, None, record.pk],
    )
    assert matched == 1
    assert len(through_libpq) == 1
    record.refresh_from_db()
    assert (record.status, record.response_status, bytes(record.response_body)) == (
        "completed",
        201,
        body,
    )
    assert record.recovery_data is None
    statements = using("default").statements(connection)
    found = read_record(connection, statements.lean_finished, ["s", "k" * 64, 0])  # type: ignore[attr-defined]
    assert found is not None and bytes(found.response_body) == body
    assert found.expires_at == record.expires_at
    assert len(through_libpq) == 2


@postgresql
@unprepared
@pytest.mark.django_db(transaction=True)
def test_a_transaction_not_begun_yet_is_begun_and_rolled_back(through_libpq: list[str]) -> None:
    """Inside an atomic block whose ``BEGIN`` psycopg has not sent yet, libpq's first
    statement begins it, and the block's rollback undoes that statement."""
    record = IdempotencyKey.objects.create(
        scope="s", key_hash="k" * 64, method="POST", path="/p", request_hash="r" * 64,
        unlock_at=timezone.now(), expires_at=timezone.now() + timedelta(hours=1),
    )  # fmt: skip
    update = f'UPDATE "{TABLE}" SET "path" = %s WHERE "id" = %s'
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        assert connection.connection.pgconn.transaction_status == libpq.pq.TransactionStatus.IDLE
        assert rows.count_rows(connection, update, ["/changed", record.pk]) == 1
        1 / 0  # noqa: B018
    assert len(through_libpq) == 1
    record.refresh_from_db()
    assert record.path == "/p"
    with transaction.atomic():
        rows.count_rows(connection, update, ["/kept", record.pk])
    record.refresh_from_db()
    assert record.path == "/kept"
    assert connection.connection.pgconn.transaction_status == libpq.pq.TransactionStatus.IDLE


@postgresql
@unprepared
@pytest.mark.django_db(transaction=True)
def test_a_connection_with_its_own_isolation_level_begins_through_the_cursor() -> None:
    import psycopg

    connection.ensure_connection()
    raw = connection.connection
    raw.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
    try:
        with transaction.atomic():
            assert libpq.usable(raw) is None
            rows.fetch_row(connection, "SELECT 1", [])  # the cursor begins it
            assert libpq.usable(raw) is raw  # begun: libpq may go on
            row = read_record(connection, "SELECT current_setting('transaction_isolation')", [])
            assert row is not None
    finally:
        raw.isolation_level = None


@postgresql
def test_errors_through_libpq_are_djangos_with_psycopgs_cause(through_libpq: list[str]) -> None:
    connection.ensure_connection()
    with pytest.raises(DatabaseError) as raised, transaction.atomic():
        rows.count_rows(connection, "UPDATE no_such_table SET x = %s", [1])
    assert raised.value.__cause__ is not None
    assert raised.value.__cause__.sqlstate == "42P01"  # type: ignore[attr-defined]
    assert through_libpq == []  # the failed statement is not counted as sent


@postgresql
@pytest.mark.django_db(transaction=True)
def test_a_lost_connection_is_a_fault() -> None:
    """A server connection that died is psycopg's ``OperationalError``, a fault to the store
    (it reconnects for an owner's write, answers 503 for a claim)."""
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()
    try:
        with pytest.raises(OperationalError) as raised:
            rows.count_rows(connection, f'UPDATE "{TABLE}" SET "path" = "path" WHERE 1 = 0', [])
        assert using("default").is_fault(raised.value)
    finally:
        connection.close()


# --- MariaDB: the lock-wait bound inside the claim's statement ---------------------------------


@pytest.mark.mysql
def test_an_atomic_claim_on_mariadb_carries_its_bound(post: Post, key: str) -> None:
    """No ``SET`` before the claim and none after: the bound is the claim's own
    (``SET STATEMENT innodb_lock_wait_timeout = ... FOR``), two round trips fewer."""
    if not connection.mysql_is_mariadb:  # type: ignore[attr-defined]
        pytest.skip("MySQL has no SET STATEMENT: it sets the bound and puts it back")
    post("/atomic/", key=f"{key}-warm-up")
    with CaptureQueriesContext(connection) as queries:
        assert post("/atomic/", key=key).status_code == 201
    sent = _sent(queries)
    assert not [sql for sql in sent if sql.startswith(("SET @", "SET SESSION"))], sent
    claims = [sql for sql in sent if "django_idempotency_claim" in sql]
    assert len(claims) == 1 and claims[0].startswith("SET STATEMENT innodb_lock_wait_timeout = "), (
        sent
    )


# --- MySQL and MariaDB: the claim on mysqlclient's connection, its times written once --------

mysql_only = pytest.mark.mysql


@mysql_only
def test_the_claim_and_the_read_go_through_mysqlclients_connection(
    post: Post, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_idempotency._store import mysqlclient

    sent: list[str] = []
    first_row = mysqlclient.first_row

    def counted(raw: Any, sql: str, params: list[Any]) -> Any:
        sent.append(sql)
        return first_row(raw, sql, params)

    monkeypatch.setattr(mysqlclient, "first_row", counted)
    first = post("/create/", {"a": 1}, key=key)
    replay = post("/create/", {"a": 1}, key=key)
    atomic = post("/atomic/", {"a": 1}, key=key + "-atomic")
    atomic_replay = post("/atomic/", {"a": 1}, key=key + "-atomic")
    assert (replay.content, replay["Idempotent-Replayed"]) == (first.content, "true")
    assert atomic_replay.content == atomic.content
    calls = [sql for sql in sent if "django_idempotency_claim" in sql]
    reads = [sql for sql in sent if "<> 'processing'" in sql]
    assert len(calls) == 3, sent  # two-phase twice, atomic's first once
    assert len(reads) == 2, sent  # atomic mode's read, before each transaction
    # The procedure's status was read: the connection takes the next statement.
    assert IdempotencyKey.objects.count() == 2


@mysql_only
def test_errors_on_mysqlclients_connection_are_djangos() -> None:
    connection.ensure_connection()
    fetch_row = using("default").fetch_row
    with pytest.raises(DatabaseError) as raised:
        fetch_row(connection, "SELECT no_such_column FROM no_such_table WHERE 1 = %s", [1])
    assert raised.value.__cause__ is not None
    assert raised.value.__cause__.args[0] == 1146  # type: ignore[attr-defined]  # no table
    assert fetch_row(connection, "SELECT %s, %s", ["a'b", None]) == ("a'b", None)


@mysql_only
@pytest.mark.parametrize("use_tz", [True, False])
def test_mysqls_claim_values_are_what_the_fields_write(use_tz: bool) -> None:
    """The times written from the clock and the token's text are what the fields make of
    ``timezone.now()`` and the token (the slow way, kept where the zone is not UTC)."""
    from django.test import override_settings

    from django_idempotency._store.claims import ClaimValues
    from django_idempotency._store.rows import preparers
    from django_idempotency._store.statements import CLAIM_PARAMS

    class Who:
        scope, key_hash, fingerprint, method, path = "s", "k" * 64, "f" * 64, "POST", "/p"

    with override_settings(USE_TZ=use_tz):
        connection.ensure_connection()
        values = ClaimValues(Who(), str(uuid.uuid4()), timedelta(seconds=30), timedelta(days=1))  # type: ignore[arg-type]
        fast = using("default").claim_params(connection, values)
        prepare = preparers(connection)
        slow_values = {
            "scope": "s",
            "key_hash": "k" * 64,
            "method": "POST",
            "path": "/p",
            "request_hash": "f" * 64,
            "lock_token": values.token,
            "created_at": values.now,
            "updated_at": values.now,
            "unlock_at": values.unlock_at,
            "expires_at": values.expires_at,
        }
        slow = [prepare[name](slow_values[name]) for name in CLAIM_PARAMS]
    assert [str(value) for value in fast] == [str(value) for value in slow]
