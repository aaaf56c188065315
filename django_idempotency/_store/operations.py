"""A record as an operation: the status endpoint's read by primary key, and the
operation's final response written once.

An operation is running while its record is ``processing`` (the request itself runs), or
finished with a stored ``202 Accepted`` (the view handed the work on); its final response
replaces the ``202`` once, in one statement whose condition is that ``202``: two concurrent
completions (a redelivered task) cannot both apply, and a final response is never a ``202``
(:func:`complete` refuses one), so no column marks it.

Its state (:mod:`.operation_states`): ``stalled`` while its record is stale
(the request's owner died, its lock lapsed: only a retry of the request resumes it), else
``running`` as above, else its final response's. Its task's progress is kept in the record's
recovery point (:data:`PROGRESS`); an operation handed on with no word from its task for long
is :func:`stuck`.

Each function asks the operation's store (``Operation.alias``) through the store contract
(:class:`~.contract.StoreContract`): the database's statements are :mod:`.table_operations`',
a Redis store's scripts :mod:`.redis.operations`', under the same conditions.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import QuerySet

from django_idempotency._base.durations import microseconds
from django_idempotency._store import ClaimHandle, using
from django_idempotency._store.contract import ACCEPTED, PROGRESS, Operation
from django_idempotency._store.operation_states import (
    FAILED,
    RUNNING,
    STALLED,
    STATES,
    SUCCEEDED,
    state_filter,
    state_of,
)
from django_idempotency._store.writes import StoredResponse
from django_idempotency.models import IdempotencyKey

__all__ = [
    "ACCEPTED",
    "FAILED",
    "MAX_PROGRESS_SIZE",
    "PROGRESS",
    "RUNNING",
    "STALLED",
    "STATES",
    "SUCCEEDED",
    "Operation",
    "complete",
    "created_at",
    "cursor",
    "found_name",
    "from_record",
    "name_of",
    "of_scopes",
    "read",
    "read_named",
    "set_progress",
    "state_filter",
    "state_of",
    "stuck",
]


#: The largest progress a task may set, in bytes of compact JSON: a few numbers and a short
#: message, read on every poll; never a result (that is the final response).
MAX_PROGRESS_SIZE = 1024


def stuck(
    alias: str, *, older_than: timedelta = timedelta(0)
) -> QuerySet[IdempotencyKey] | list[IdempotencyKey]:
    """Operations handed on (their ``202`` stored, unexpired) with no word for ``older_than``:
    no final response and no progress since. Their task died, raised without
    ``fail_operation()``, or was never delivered; oldest first. On a Redis store: a ``SCAN``'s
    unsaved records, each with its operation's name as its ``pk``."""
    return using(alias).stuck(older_than)


def from_record(record: IdempotencyKey, alias: str = "") -> Operation:
    """The operation of a record of the store ``alias`` already read (``idempotency_recover
    --operations``); a Redis store's has its operation's name as its ``pk`` (:func:`stuck`)."""
    body = record.response_body
    return Operation(
        record.pk,
        record.scope,
        record.key_hash,
        record.status,
        record.response_status,
        record.response_headers,
        None if body is None else bytes(body),
        record.created_at,
        record.expires_at,
        record.unlock_at,
        record.recovery_point,
        record.recovery_data,
        alias,
    )


def read(alias: str, pk: int) -> Operation | None:
    """Record ``pk``'s operation: one read by primary key; ``None``: no such record.
    Raises :class:`~django_idempotency.StoreUnavailable` on a database fault."""
    return using(alias).read_operation(pk)


def read_named(operation_id: str) -> Operation | None:
    """The Redis operation an operation id names (:func:`.redis.names.parse`), its MAC
    not checked yet; ``None``: no Redis operation's shape, or no store or record of it."""
    from django_idempotency._store.redis import names

    parsed = names.parse(operation_id)
    if parsed is None:
        return None
    alias = names.resolve(parsed[0])
    if alias is None:
        return None
    return using(alias).read_operation(parsed[1])


def name_of(alias: str, pk: ClaimHandle) -> int | str:
    """What a live claim's operation id is made of: its record's primary key, or on a Redis
    store its operation's name (its index written: the id names the record from then on)."""
    return using(alias).operation_name(pk)


def found_name(alias: str, record: Any) -> tuple[int | str, datetime] | None:
    """What a duplicate's ``202`` makes the operation id of, of the record its claim found,
    and the record's life; ``None``: it has none (a Redis record that is gone)."""
    return using(alias).found_operation(record)


def set_progress(alias: str, operation: Operation, value: Any) -> bool:
    """Set the operation's progress, fenced as :func:`complete` is (its ``202`` stored, this
    life, unexpired); ``False``: it was not. An operation that reports progress is not stuck
    (:func:`stuck`)."""
    store = using(operation.alias or alias)
    return store.set_progress(operation, PROGRESS, {"progress": value})


def of_scopes(
    alias: str, scopes: set[str], *, before: int | None, limit: int, state: str | None
) -> list[Operation]:
    """The unexpired operations of ``scopes``, newest first, at most ``limit``, those before
    ``before`` (the list endpoint's cursor: :func:`cursor`), in ``state`` if given. On the
    database: one indexed read of the scopes' records; on a Redis store, those whose ids were
    handed out."""
    return using(alias).of_scopes(scopes, before=before, limit=limit, state=state)


def cursor(operation: Operation) -> int:
    """Where the next page of a list of operations begins (:func:`of_scopes`' ``before``):
    a primary key, or on a Redis store the operation's beginning (µs)."""
    if isinstance(operation.pk, int):
        return operation.pk
    return microseconds(operation.created_at)


def created_at(alias: str, pk: ClaimHandle) -> datetime | None:
    """When record ``pk``'s life began (:attr:`.Claim.created_at`; ``None``: no such record):
    read on the claim's own connection, so atomic mode's uncommitted record is found too."""
    return using(alias).created_at(pk)


def complete(alias: str, operation: Operation, stored: StoredResponse) -> bool:
    """Replace the operation's stored ``202`` by its final response, once; ``False``: it was
    not (any longer) a ``202`` of an unexpired record (the caller reads it again to say why).

    The same values as a view's result write (:class:`StoredResponse`: sealed, compressed,
    encrypted), fenced by the ``202`` and the expiry instead of a lock token, which the task
    finishing the work does not hold.
    """
    return using(operation.alias or alias).complete_operation(operation, stored)
