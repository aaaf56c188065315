"""The store's statements skip Django's cursor wrapper only where nothing would see it
(issue 28), and keep what it does that matters, on every database.

An ``execute_wrapper()`` hook sees the claim and the result's write; a transaction marked for
rollback refuses them; the driver's errors arrive as Django's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction
from django.db.transaction import TransactionManagementError

from django_idempotency import IdempotencyKey
from django_idempotency._store import rows, using
from tests.conftest import executions

pytestmark = pytest.mark.django_db

Post = Callable[..., Any]
TABLE = IdempotencyKey._meta.db_table


def test_an_execute_wrapper_sees_the_claim_and_the_result(post: Post, key: str) -> None:
    seen: list[str] = []

    def hook(execute: Callable[..., Any], sql: str, *args: Any) -> Any:
        seen.append(sql)
        return execute(sql, *args)

    assert post("/create/", key=key).status_code == 201  # the kept cursor is made
    with connection.execute_wrapper(hook):
        assert post("/create/", key=f"{key}-2").status_code == 201
    ours = [sql for sql in seen if TABLE in sql or "django_idempotency_claim" in sql]
    assert any(sql.lstrip().upper().startswith("UPDATE") for sql in ours), seen
    assert len(ours) >= 2, seen
    assert executions() == 2


def test_a_transaction_marked_for_rollback_refuses_them() -> None:
    connection.ensure_connection()
    fetch_row = using("default").fetch_row  # the vendor's way (MySQL's: mysqlclient's own)
    fetch_row(connection, "SELECT 1", [])  # the kept cursor, outside any check
    with transaction.atomic():
        transaction.set_rollback(True)
        with pytest.raises(TransactionManagementError):
            fetch_row(connection, "SELECT 1", [])
        with pytest.raises(TransactionManagementError):
            rows.count_rows(connection, f"UPDATE {TABLE} SET scope = scope WHERE 1 = 0", [])


def test_the_drivers_errors_arrive_as_djangos() -> None:
    connection.ensure_connection()
    fetch_row = using("default").fetch_row
    # Each in a savepoint: on PostgreSQL an error aborts the test's transaction.
    with pytest.raises(DatabaseError), transaction.atomic():
        fetch_row(connection, "SELECT no_such_column FROM no_such_table", [])
    with pytest.raises(DatabaseError), transaction.atomic():
        rows.count_rows(connection, "UPDATE no_such_table SET x = 1", [])
    assert fetch_row(connection, "SELECT 1", [])[0] == 1
    assert rows.count_rows(connection, f"UPDATE {TABLE} SET scope = scope WHERE 1 = 0", []) == 0
