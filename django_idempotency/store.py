"""Every statement the app runs against its table, each one atomic on its own.

The claim is a single upsert (``INSERT ... ON CONFLICT DO UPDATE ... WHERE``, which PostgreSQL
and SQLite both speak): it inserts a new record, replaces an expired one, or takes over a stale
``processing`` one with the same fingerprint, and returns nothing when the key is live. There is
never a check-then-act window. Later writes of an attempt are fenced by its ``lock_token``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, JSONField
from django.utils import timezone

from django_idempotency.exceptions import LockWaitTimeout, StoreUnavailable
from django_idempotency.models import IdempotencyKey
from django_idempotency.responses import StoredResponse

PROCESSING = IdempotencyKey.Status.PROCESSING
COMPLETED = IdempotencyKey.Status.COMPLETED
FAILED = IdempotencyKey.Status.FAILED

_INSERT_COLUMNS = (
    "scope",
    "key_hash",
    "method",
    "path",
    "request_hash",
    "status",
    "response_headers",
    "recovery_point",
    "lock_token",
    "attempt",
    "created_at",
    "updated_at",
    "unlock_at",
    "expires_at",
)


@dataclass(frozen=True)
class Claimed:
    """What the claim returns when this attempt now owns the record."""

    pk: int
    lock_token: uuid.UUID
    attempt: int
    recovery_point: str
    recovery_data: Any


def _claim_sql(connection: BaseDatabaseWrapper) -> str:
    q = connection.ops.quote_name
    table = q(IdempotencyKey._meta.db_table)
    columns = ", ".join(q(name) for name in _INSERT_COLUMNS)
    placeholders = ", ".join(["%s"] * len(_INSERT_COLUMNS))

    def existing(name: str) -> str:
        return f"{table}.{q(name)}"

    expired = f"{existing('expires_at')} <= %s"

    def fresh_or_kept(name: str, fresh: str) -> str:
        return f"{q(name)} = CASE WHEN {expired} THEN {fresh} ELSE {existing(name)} END"

    return (
        f"INSERT INTO {table} ({columns}) VALUES ({placeholders}) "
        f"ON CONFLICT ({q('scope')}, {q('key_hash')}) DO UPDATE SET "
        f"{q('method')} = EXCLUDED.{q('method')}, "
        f"{q('path')} = EXCLUDED.{q('path')}, "
        f"{q('request_hash')} = EXCLUDED.{q('request_hash')}, "
        f"{q('status')} = EXCLUDED.{q('status')}, "
        f"{q('response_status')} = NULL, "
        f"{q('response_headers')} = EXCLUDED.{q('response_headers')}, "
        f"{q('response_body')} = NULL, "
        f"{fresh_or_kept('recovery_point', 'EXCLUDED.' + q('recovery_point'))}, "
        f"{fresh_or_kept('recovery_data', 'NULL')}, "
        f"{q('lock_token')} = EXCLUDED.{q('lock_token')}, "
        f"{q('attempt')} = CASE WHEN {expired} THEN 1 ELSE {existing('attempt')} + 1 END, "
        f"{fresh_or_kept('created_at', 'EXCLUDED.' + q('created_at'))}, "
        f"{q('updated_at')} = EXCLUDED.{q('updated_at')}, "
        f"{q('unlock_at')} = EXCLUDED.{q('unlock_at')}, "
        f"{fresh_or_kept('expires_at', 'EXCLUDED.' + q('expires_at'))} "
        f"WHERE {expired} OR ({existing('status')} = %s AND {existing('unlock_at')} <= %s "
        f"AND {existing('request_hash')} = EXCLUDED.{q('request_hash')}) "
        f"RETURNING {q('id')}, {q('attempt')}, {q('recovery_point')}, {q('recovery_data')}"
    )


def _prep(name: str, value: Any, connection: BaseDatabaseWrapper) -> Any:
    field = IdempotencyKey._meta.get_field(name)
    assert isinstance(field, Field)
    return field.get_db_prep_save(value, connection)


def claim(
    alias: str,
    *,
    scope: str,
    key_hash: str,
    method: str,
    path: str,
    request_hash: str,
    ttl: timedelta,
    lock_timeout: timedelta,
) -> Claimed | None:
    """Claim the key in one statement; ``None`` when another attempt's record is live."""
    connection = connections[alias]
    now = timezone.now()
    token = uuid.uuid4()
    values = {
        "scope": scope,
        "key_hash": key_hash,
        "method": method,
        "path": path,
        "request_hash": request_hash,
        "status": PROCESSING,
        "response_headers": [],
        "recovery_point": "",
        "lock_token": token,
        "attempt": 1,
        "created_at": now,
        "updated_at": now,
        "unlock_at": now + lock_timeout,
        "expires_at": now + ttl,
    }
    params = [_prep(name, values[name], connection) for name in _INSERT_COLUMNS]
    db_now = _prep("updated_at", now, connection)
    # Five "expired" tests in the CASEs and one in the WHERE; then its status and unlock_at.
    params += [db_now] * 6 + [PROCESSING, db_now]
    with _guard(), connection.cursor() as cursor:
        cursor.execute(_claim_sql(connection), params)
        row = cursor.fetchone()
    if row is None:
        return None
    data_field = IdempotencyKey._meta.get_field("recovery_data")
    assert isinstance(data_field, JSONField)
    recovery_data = data_field.from_db_value(row[3], None, connection)  # type: ignore[arg-type]
    return Claimed(row[0], token, row[1], row[2], recovery_data)


def load(alias: str, scope: str, key_hash: str) -> IdempotencyKey | None:
    with _guard():
        return IdempotencyKey.objects.using(alias).filter(scope=scope, key_hash=key_hash).first()


def peek_status(alias: str, scope: str, key_hash: str) -> tuple[str, datetime | None] | None:
    """The cheap poll of a waiter: status and ``unlock_at`` only."""
    with _guard():
        return (
            IdempotencyKey.objects.using(alias)
            .filter(scope=scope, key_hash=key_hash)
            .values_list("status", "unlock_at")
            .first()
        )


def store_response(alias: str, pk: int, token: uuid.UUID, stored: StoredResponse) -> bool:
    """Store the final response; ``False`` when the lock was lost (the result is refused)."""
    status = COMPLETED if stored.status < 400 else FAILED
    return bool(
        IdempotencyKey.objects.using(alias)
        .filter(pk=pk, lock_token=token, status=PROCESSING)
        .update(
            status=status,
            response_status=stored.status,
            response_headers=stored.headers,
            response_body=stored.body,
            unlock_at=None,
            updated_at=timezone.now(),
        )
    )


def release(alias: str, pk: int, token: uuid.UUID) -> bool:
    """Delete the attempt's record so a retry claims afresh; ``False`` if the lock was lost."""
    connection = connections[alias]
    q = connection.ops.quote_name
    with connection.cursor() as cursor:
        # Plain SQL: a queryset delete() may first SELECT the rows to send delete signals.
        cursor.execute(
            f"DELETE FROM {q(IdempotencyKey._meta.db_table)} "
            f"WHERE {q('id')} = %s AND {q('lock_token')} = %s AND {q('status')} = %s",
            [pk, _prep("lock_token", token, connection), PROCESSING],
        )
        return bool(cursor.rowcount)


def save_recovery_point(
    alias: str, pk: int, token: uuid.UUID, name: str, data: Any, lock_timeout: timedelta
) -> bool:
    """Record progress and renew the lock: an attempt that makes progress is alive."""
    now = timezone.now()
    return bool(
        IdempotencyKey.objects.using(alias)
        .filter(pk=pk, lock_token=token, status=PROCESSING)
        .update(
            recovery_point=name, recovery_data=data, unlock_at=now + lock_timeout, updated_at=now
        )
    )


def limit_lock_wait(alias: str, timeout: timedelta) -> None:
    """Bound how long the claim waits for another transaction's uncommitted row (atomic mode)."""
    connection = connections[alias]
    if connection.vendor == "postgresql":
        with _guard(), connection.cursor() as cursor:
            milliseconds = max(1, int(timeout.total_seconds() * 1000))
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{milliseconds}ms"])


@contextmanager
def _guard() -> Iterator[None]:
    """Translate the store's database errors into the app's own exceptions."""
    try:
        yield
    except DatabaseError as exc:
        if is_lock_timeout(exc):
            raise LockWaitTimeout(str(exc)) from exc
        if isinstance(exc, (OperationalError, InterfaceError)):
            raise StoreUnavailable(str(exc)) from exc
        raise


def is_lock_timeout(exc: BaseException) -> bool:
    cause = exc.__cause__
    if getattr(cause, "sqlstate", None) == "55P03":  # PostgreSQL lock_not_available
        return True
    return isinstance(exc, OperationalError) and "database is locked" in str(exc)
