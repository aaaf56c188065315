"""The statements the store sends to MySQL and MariaDB, checked without a server.

MariaDB runs the suite in CI; MySQL 8 cannot, so what it would receive is pinned here: nothing
that only MariaDB accepts (``RETURNING``, ``SET STATEMENT``), nothing that hides errors
(``INSERT IGNORE``).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from django.db import IntegrityError, OperationalError

from tests.conftest import NEEDS_MYSQLCLIENT

MySQLdb = pytest.importorskip("MySQLdb", reason=NEEDS_MYSQLCLIENT)

from django.db.backends.mysql.base import DatabaseWrapper  # noqa: E402 (needs MySQLdb)

from django_idempotency._store import mysql  # noqa: E402

CONNECTION = DatabaseWrapper(
    {"ENGINE": "django.db.backends.mysql", "NAME": "unused", "TIME_ZONE": None}, "sql"
)
STORE = mysql.MySQLStore("default")
SQL = STORE.build_statements(CONNECTION)


def test_the_claims_insert_is_plain() -> None:
    assert SQL.insert.startswith("INSERT INTO `django_idempotency_idempotencykey` (")
    for word in ("IGNORE", "ON CONFLICT", "ON DUPLICATE", "RETURNING"):
        assert word not in SQL.insert


def test_the_takeover_has_no_returning_and_assigns_expires_at_last() -> None:
    """MySQL evaluates an UPDATE's assignments from left to right, later ones reading the new
    values: every CASE tests expires_at, so it must still be the old one."""
    assert SQL.take_over.startswith("UPDATE `django_idempotency_idempotencykey` SET ")
    assert "RETURNING" not in SQL.take_over
    assignments, where = SQL.take_over.split(" WHERE ")
    *earlier, last = assignments.split(", ")
    assert last.startswith("`expires_at` = CASE WHEN `expires_at` <= %s")
    assert not any(assignment.startswith("`expires_at`") for assignment in earlier)
    assert where.startswith("`id` = %s AND (`expires_at` <= %s OR (`status` = %s")


def test_the_takeover_reads_back_its_own_token_only() -> None:
    assert SQL.select_owned.endswith("WHERE `id` = %s AND `lock_token` = %s")


@pytest.mark.parametrize(("seconds", "expected"), [(0.3, 1), (1, 1), (5, 5), (2.5, 3)])
def test_the_lock_wait_limit_is_whole_seconds(seconds: float, expected: int) -> None:
    sql = mysql.limit_lock_wait_sql(timedelta(seconds=seconds))
    assert sql == (
        "SET @django_idempotency_lock_wait = @@SESSION.innodb_lock_wait_timeout, "
        f"SESSION innodb_lock_wait_timeout = {expected}"
    )
    assert mysql.RESTORE_LOCK_WAIT.endswith("= @django_idempotency_lock_wait")


def test_the_cleanup_deletes_through_the_primary_key() -> None:
    sql = mysql.delete_locked_sql("`t`", "`id`", "`id` IN (%s, %s)")
    assert sql == (
        "DELETE `t` FROM (SELECT `id` FROM `t` WHERE `id` IN (%s, %s)) AS batch "
        "STRAIGHT_JOIN `t` ON `t`.`id` = batch.`id`"
    )
    batch = STORE.batch_query(CONNECTION, datetime(2026, 1, 1, tzinfo=timezone.utc), 10, None, None)
    assert batch.select.startswith(
        "SELECT `id`, `expires_at` FROM `django_idempotency_idempotencykey` "
        "FORCE INDEX (`django_idempotency_expires`) WHERE "
    )


def test_error_codes_are_read_from_the_driver_error() -> None:
    for driver_error, wrapper, code in [
        (MySQLdb.IntegrityError(1062, "Duplicate entry"), IntegrityError, mysql.DUPLICATE_KEY),
        (MySQLdb.OperationalError(1213, "Deadlock found"), OperationalError, mysql.DEADLOCK),
        (MySQLdb.OperationalError(1205, "Lock wait timeout"), OperationalError, 1205),
    ]:
        error = wrapper(*driver_error.args)
        error.__cause__ = driver_error
        assert mysql.error_code(error) == code
        assert STORE.is_lock_timeout(error) is (code != mysql.DUPLICATE_KEY)
    assert mysql.error_code(OperationalError("database is locked")) is None
