"""The MySQL and MariaDB claim procedure: in step with the code, one round trip for a new key
and for a live one, the same outcomes as the plain statements, and a fallback without it."""

from __future__ import annotations

import importlib
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_idempotency import Claim, IdempotencyKey, LockWaitTimeout
from django_idempotency import _store as store
from django_idempotency._store import mysql
from django_idempotency._store.mysql import CLAIM_PROCEDURE, MySQLStore
from django_idempotency._store.statements import CLAIM_PARAMS
from tests import factories
from tests.conftest import NEEDS_MYSQLCLIENT
from tests.factories import IdempotencyKeyFactory

pytest.importorskip("MySQLdb", reason=NEEDS_MYSQLCLIENT)
pytestmark = [pytest.mark.mysql]

#: The migration whose text makes the procedure (0007 makes it again from it, issue 38).
MIGRATION = importlib.import_module("django_idempotency.migrations.0006_mysql_claim_procedure")
FINGERPRINT = "f" * 64


def test_the_migration_creates_the_procedure_the_code_writes() -> None:
    """Change the table or the claim's statements, and this fails until a migration makes the
    procedure again."""
    placeholders = {name: f"<type of {name}>" for name in CLAIM_PARAMS}
    assert mysql.claim_procedure_sql(placeholders) == MIGRATION.TEMPLATE.format(**placeholders)


@pytest.mark.django_db
def test_the_database_has_the_procedure_with_the_columns_types() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT PARAMETER_NAME, DTD_IDENTIFIER, COLLATION_NAME "
            "FROM information_schema.PARAMETERS WHERE SPECIFIC_SCHEMA = DATABASE() "
            "AND SPECIFIC_NAME = %s ORDER BY ORDINAL_POSITION",
            [CLAIM_PROCEDURE],
        )
        parameters = cursor.fetchall()
        cursor.execute(
            "SELECT COLUMN_NAME, COLUMN_TYPE, COLLATION_NAME FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
            [IdempotencyKey._meta.db_table],
        )
        columns = {name: (kind, collation) for name, kind, collation in cursor.fetchall()}
    assert [name for name, _, _ in parameters] == [f"p_{name}" for name in CLAIM_PARAMS]
    for (_, kind, collation), name in zip(parameters, CLAIM_PARAMS, strict=True):
        assert (kind.lower(), collation) == (columns[name][0].lower(), columns[name][1])


def claim(key: str, request_hash: str = FINGERPRINT) -> store.ClaimOutcome:
    return factories.claim(key, fingerprint=request_hash)


def without_procedure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(MySQLStore, "has_procedure", lambda self, connection: False)


def outcome_of(outcome: store.ClaimOutcome) -> tuple[Any, ...]:
    """What a caller sees of a claim, and the record it leaves."""
    if isinstance(outcome, Claim):
        record = IdempotencyKey.objects.get(pk=outcome.pk)
        seen: tuple[Any, ...] = ("claimed", outcome.attempt, outcome.recovery_point)
    else:
        assert isinstance(outcome, IdempotencyKey)
        record, seen = outcome, ("held",)
    fields = ("status", "attempt", "recovery_point", "recovery_data", "request_hash")
    fields += ("response_status", "response_headers", "method", "path")
    return (*seen, *(getattr(record, name) for name in fields))


#: A record in place before the claim, and whether the claim takes it over.
RECORDS: dict[str, tuple[dict[str, Any], bool]] = {
    "none": ({}, True),
    "completed": ({"completed": True}, False),
    "processing": ({}, False),
    "expired": ({"completed": True, "expired": True}, True),
    "stale, same request": ({"stale": True, "recovery_point": "charge", "attempt": 2}, True),
    "stale, another request": ({"stale": True, "request_hash": "0" * 64}, False),
}


@pytest.mark.django_db
@pytest.mark.parametrize("record", list(RECORDS))
def test_the_procedure_decides_as_the_statements_do(
    record: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new key and a live record in one round trip each (the statements: two for a new
    key); a takeover adds its fenced ``UPDATE`` and read either way."""
    factory, claimed = RECORDS[record]
    assert MySQLStore("default").has_procedure(connection)  # checked once: not counted
    results, counts = [], []
    for procedure in (True, False):
        if not procedure:
            without_procedure(monkeypatch)
        key = str(uuid.uuid4())
        if record != "none":
            IdempotencyKeyFactory(key=key, **{"request_hash": FINGERPRINT, **factory})
        with CaptureQueriesContext(connection) as queries:
            outcome = claim(key)
        results.append(outcome_of(outcome))
        counts.append([query["sql"].split()[0] for query in queries.captured_queries])
    assert results[0] == results[1]
    assert results[0][0] == ("claimed" if claimed else "held")
    taken_over = claimed and record != "none"
    assert counts[0] == ["CALL", *(["UPDATE", "SELECT"] if taken_over else [])]
    assert counts[1] == (["SELECT", "INSERT"] if record == "none" else ["SELECT"]) + (
        ["UPDATE", "SELECT"] if taken_over else []
    )


@pytest.mark.django_db(transaction=True)  # DDL commits whatever transaction is open
def test_a_dropped_procedure_falls_back_to_the_statements() -> None:
    """Its migration unapplied while the process runs: the claim notices and carries on."""
    mysql._HAS_PROCEDURE.clear()
    with connection.cursor() as cursor:
        cursor.execute(MIGRATION.DROP)
    try:
        assert isinstance(claim(str(uuid.uuid4())), Claim)  # still believed present: 1305
        assert mysql._HAS_PROCEDURE  # now known absent
        assert not any(mysql._HAS_PROCEDURE.values())
        assert isinstance(claim(str(uuid.uuid4())), Claim)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(MIGRATION.TEMPLATE.format(**MIGRATION.types(connection.schema_editor())))
        mysql._HAS_PROCEDURE.clear()


@pytest.mark.django_db(transaction=True)
def test_a_lock_wait_that_runs_out_in_the_procedure_is_a_lock_wait_timeout(
    uncommitted_record: str,
) -> None:
    """The insert inside the procedure waits on the uncommitted duplicate for atomic mode's
    bound, then it is a ``LockWaitTimeout`` (a 409), and the session's own limit is back."""
    store_ = MySQLStore("default")
    assert store_.has_procedure(connection)  # checked once: not counted
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@SESSION.innodb_lock_wait_timeout")
        (before,) = cursor.fetchone()
    with pytest.raises(LockWaitTimeout), transaction.atomic():
        previous = store_.limit_lock_wait(timedelta(seconds=1))
        try:
            with CaptureQueriesContext(connection) as queries:
                claim(uncommitted_record)
        finally:
            store_.restore_lock_wait(previous)
    # One statement: the call (a failed one is logged without its text).
    assert len(queries.captured_queries) == 1
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@SESSION.innodb_lock_wait_timeout")
        assert cursor.fetchone() == (before,)
