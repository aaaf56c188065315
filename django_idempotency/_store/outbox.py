"""The outbox's statements (``docs/outbox.rst``): messages inserted with the fenced
write that releases them, taken in batches no two senders share, marked sent or failed.

A release is idempotent on the message id (``ON CONFLICT DO NOTHING``; MariaDB's ``ON DUPLICATE
KEY UPDATE`` of the id to itself): a takeover that stages a message again inserts nothing new.
Where a store :attr:`~.bound.BoundStore.chains_writes` (PostgreSQL) the fenced write and the
insert are one statement (a data-modifying CTE whose insert reads the fenced ``UPDATE``'s
``RETURNING``: nothing is inserted when the fence refuses), and where it
:attr:`~.contract.StoreFeatures.notifies`, ``pg_notify`` in it wakes the relays when the transaction
commits. Elsewhere the two run in one transaction (the attempt's own in atomic mode, or inside
a caller's).

Batches are claimed by pushing each message's ``available_at`` forward by a lease: in one
``UPDATE`` over ``SELECT ... FOR UPDATE SKIP LOCKED`` where writes chain, in one ``UPDATE ...
RETURNING`` where the database has :attr:`~.contract.StoreFeatures.one_writer` (SQLite: it
serialises them), elsewhere (MariaDB, MySQL) in a transaction of the same ``SELECT`` and an
``UPDATE``. A sender that dies leaves its messages to the next one once the lease has passed.
The statements ask the store what its database can do, never its vendor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple, TypeVar

from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from django_idempotency._base.durations import MICROSECOND
from django_idempotency._store import connecting
from django_idempotency._store.bound import BoundStore
from django_idempotency._store.contract import Backlog as Backlog  # where the stores read it
from django_idempotency._store.contract import Taken
from django_idempotency._store.rows import aware, count_rows
from django_idempotency.models import IdempotencyKey, OutboxMessage

T = TypeVar("T")

#: The channel ``pg_notify`` wakes the relays on (PostgreSQL).
CHANNEL = "django_idempotency_outbox"
PENDING = OutboxMessage.State.PENDING.value
SENT = OutboxMessage.State.SENT.value
FAILED = OutboxMessage.State.FAILED.value
#: The columns a release writes, in order.
_COLUMNS = ("message_id", "engine", "task", "arguments")


class Message(NamedTuple):
    """A staged message as it is inserted: its id, the engine that delivers it (``celery`` or
    ``tasks``), the task's name, and its arguments as JSON text."""

    message_id: str
    engine: str
    task: str
    arguments: str


@dataclass
class Release:
    """Messages released by one fenced write of the record ``record``: available after
    ``lease`` (the fast path sends them meanwhile; zero: the relay takes them at once), the
    relays woken (``notify``, PostgreSQL). ``fresh``: none can exist yet (the record's first
    attempt), so none need be looked for. :attr:`inserted` is set to the ids the write
    inserted (those a takeover staged again are left out)."""

    record: int
    messages: Sequence[Message]
    lease: timedelta
    notify: bool
    fresh: bool = True
    inserted: list[str] = field(default_factory=list)


def _table(connection: BaseDatabaseWrapper) -> str:
    return connection.ops.quote_name(OutboxMessage._meta.db_table)


def _names(connection: BaseDatabaseWrapper, *names: str) -> str:
    q = connection.ops.quote_name
    return ", ".join(q(name) for name in names)


def fenced_release(
    store: BoundStore,
    connection: BaseDatabaseWrapper,
    sql: str,
    params: list[Any],
    release: Release,
) -> int:
    """Run the fenced write ``sql`` and, only if it matched the record, insert the released
    messages: the rows the write matched."""
    if store.chains_writes:
        return _fenced_release_chained(connection, sql, params, release)
    with _transaction(connection):
        matched = count_rows(connection, sql, params)
        if matched:
            _insert(store, connection, release)
        return matched


def _fenced_release_chained(
    connection: BaseDatabaseWrapper, sql: str, params: list[Any], release: Release
) -> int:
    q = connection.ops.quote_name
    table = _table(connection)
    values = ", ".join(["(%s, %s, %s, %s)"] * len(release.messages))
    notify = ", pg_notify(%s, '')" if release.notify else ""
    statement = (
        f"WITH fenced AS ({sql} RETURNING {q('id')}), "
        f"released AS (INSERT INTO {table} ({q('record_id')}, {_names(connection, *_COLUMNS)}, "
        f"{_names(connection, 'state', 'attempts', 'last_error', 'released_at', 'available_at')})"
        f" SELECT fenced.{q('id')}, m.message_id, m.engine, m.task, m.arguments, "
        f"'{PENDING}', 0, '', now(), now() + %s::interval "
        f"FROM fenced CROSS JOIN (VALUES {values}) AS m(message_id, engine, task, arguments) "
        f"ON CONFLICT ({q('message_id')}) DO NOTHING RETURNING {q('message_id')}) "
        f"SELECT released.{q('message_id')}{notify} FROM fenced LEFT JOIN released ON true"
    )
    arguments = [*params, f"{release.lease // MICROSECOND} microseconds"]
    for message in release.messages:
        arguments += message
    if release.notify:
        arguments.append(CHANNEL)
    with connection.cursor() as cursor:
        cursor.execute(statement, arguments)
        rows = cursor.fetchall()
    release.inserted = [row[0] for row in rows if row[0] is not None]
    return 1 if rows else 0


def _insert(store: BoundStore, connection: BaseDatabaseWrapper, release: Release) -> None:
    """Insert the messages not there yet, in the write's transaction (where writes do not
    chain)."""
    q = connection.ops.quote_name
    table = _table(connection)
    ids = [message.message_id for message in release.messages]
    there: set[str] = set()
    if not release.fresh:
        marks = ", ".join(["%s"] * len(ids))
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT {q('message_id')} FROM {table} WHERE {q('message_id')} IN ({marks})", ids
            )
            there = {row[0] for row in cursor.fetchall()}
    new = [message for message in release.messages if message.message_id not in there]
    if not new:
        return
    now = timezone.now()
    adapt = connection.ops.adapt_datetimefield_value
    times = [adapt(now), adapt(now + release.lease)]
    columns = (*_COLUMNS, "state", "attempts", "last_error", "released_at", "available_at")
    row = "(%s, " + ", ".join(["%s"] * len(columns)) + ")"
    params: list[Any] = []
    for message in new:
        params += [release.record, *message, PENDING, 0, "", *times]
    ignore = store.ignore_duplicate.format(column=q("message_id"))
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({q('record_id')}, {_names(connection, *columns)}) "
            f"VALUES {', '.join([row] * len(new))}{ignore}",
            params,
        )
    release.inserted = [message.message_id for message in new]


@contextmanager
def _transaction(connection: BaseDatabaseWrapper) -> Iterator[None]:
    """A transaction on ``connection`` (the thread's, or a write's own connection), unless
    one is open there already (atomic mode, a caller's block), whose commit is the caller's."""
    if connection.in_atomic_block or not connection.get_autocommit():
        yield
        return
    connection.set_autocommit(False)
    try:
        yield
        connection.commit()
    except BaseException:
        _roll_back(connection)
        raise
    connection.set_autocommit(True)


def _roll_back(connection: BaseDatabaseWrapper) -> None:
    """End a transaction whose statement or commit failed: rolled back, in autocommit again.

    A commit refused leaves the transaction open: SQLite's, whose commit waits for the file's
    readers no longer than the busy timeout, holds the write lock on (and, pending, keeps every
    new reader out), and the return to autocommit, which commits first, is refused as well.
    Left so, an owner's result with the outbox's messages stayed uncommitted in it until the
    connection closed, and a second try wrote inside it. A connection that cannot roll back (it
    was lost) is closed, which ends its transaction too."""
    try:
        connection.rollback()
        connection.set_autocommit(True)
    except DatabaseError:
        with suppress(DatabaseError):
            connection.close()


#: The columns :func:`take` reads: the row's id (the batch's order), then a :class:`Taken`'s.
_TAKEN = ("id", "message_id", "engine", "task", "arguments", "attempts")


def take(
    store: BoundStore, connection: BaseDatabaseWrapper, size: int, lease: timedelta
) -> list[Taken]:
    """Claim up to ``size`` messages that may be sent now, for ``lease``: no other sender
    takes them until it has passed (or they are marked). Their ``attempts`` is counted."""
    q = connection.ops.quote_name
    table = _table(connection)
    columns = _names(connection, *_TAKEN)
    now = timezone.now()
    adapt = connection.ops.adapt_datetimefield_value
    due = f"{q('state')} = '{PENDING}' AND {q('available_at')} <= %s"
    pick = f"SELECT {q('id')} FROM {table} WHERE {due} ORDER BY {q('available_at')} LIMIT %s"
    push = f"{q('available_at')} = %s, {q('attempts')} = {q('attempts')} + 1"
    with connection.cursor() as cursor:
        if store.chains_writes:
            cursor.execute(
                f"WITH batch AS ({pick} FOR UPDATE SKIP LOCKED) UPDATE {table} SET {push} "
                f"FROM batch WHERE {table}.{q('id')} = batch.{q('id')} RETURNING "
                + ", ".join(f"{table}.{q(name)}" for name in _TAKEN),
                [adapt(now), size, adapt(now + lease)],
            )
            rows = cursor.fetchall()
        elif store.features.one_writer:
            cursor.execute(
                f"UPDATE {table} SET {push} WHERE {q('id')} IN ({pick}) RETURNING {columns}",
                [adapt(now + lease), adapt(now), size],
            )
            rows = cursor.fetchall()
        else:
            with _transaction(connection):
                cursor.execute(f"{pick} FOR UPDATE SKIP LOCKED", [adapt(now), size])
                ids = [row[0] for row in cursor.fetchall()]
                if not ids:
                    return []
                marks = ", ".join(["%s"] * len(ids))
                cursor.execute(
                    f"UPDATE {table} SET {push} WHERE {q('id')} IN ({marks})",
                    [adapt(now + lease), *ids],
                )
                cursor.execute(f"SELECT {columns} FROM {table} WHERE {q('id')} IN ({marks})", ids)
                rows = cursor.fetchall()
    # Marked by its message id (as the fast path marks it), sent in the order of the rows.
    return [Taken(row[1], *row[1:]) for row in sorted(rows, key=lambda row: row[0])]


def mark_sent(connection: BaseDatabaseWrapper, message_ids: Sequence[str], *, counted: bool) -> int:
    """Mark messages sent (``counted``: their attempt was counted when they were taken; the
    fast path's was not)."""
    if not message_ids:
        return 0
    q = connection.ops.quote_name
    marks = ", ".join(["%s"] * len(message_ids))
    count = "" if counted else f", {q('attempts')} = {q('attempts')} + 1"
    return count_rows(
        connection,
        f"UPDATE {_table(connection)} SET {q('state')} = '{SENT}', {q('sent_at')} = %s"
        f"{count} WHERE {q('message_id')} IN ({marks})",
        [connection.ops.adapt_datetimefield_value(timezone.now()), *message_ids],
    )


def mark_failed(
    connection: BaseDatabaseWrapper,
    message_id: str,
    error: str,
    retry_at: datetime | None,
    *,
    counted: bool,
) -> int:
    """Record a failed send: tried again at ``retry_at``, or ``failed`` for good (``None``)."""
    q = connection.ops.quote_name
    count = "" if counted else f", {q('attempts')} = {q('attempts')} + 1"
    state = FAILED if retry_at is None else PENDING
    adapt = connection.ops.adapt_datetimefield_value
    return count_rows(
        connection,
        f"UPDATE {_table(connection)} SET {q('state')} = %s, {q('last_error')} = %s, "
        f"{q('available_at')} = %s{count} WHERE {q('message_id')} = %s",
        [state, _keepable(error)[:4000], adapt(retry_at or timezone.now()), message_id],
    )


def _keepable(error: str) -> str:
    """An exception's text as every database keeps it: a NUL (which PostgreSQL's text refuses)
    and a lone surrogate (which no UTF-8 column takes) written as escapes."""
    return error.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def resend(connection: BaseDatabaseWrapper, ids: Sequence[int]) -> int:
    """Make messages pending and due now (an operator's re-send, the admin's action)."""
    if not ids:
        return 0
    q = connection.ops.quote_name
    marks = ", ".join(["%s"] * len(ids))
    return count_rows(
        connection,
        f"UPDATE {_table(connection)} SET {q('state')} = '{PENDING}', {q('available_at')} = %s, "
        f"{q('sent_at')} = NULL WHERE {q('id')} IN ({marks})",
        [connection.ops.adapt_datetimefield_value(timezone.now()), *ids],
    )


def backlog(connection: BaseDatabaseWrapper) -> Backlog:
    """The backlog, read by the index on ``(state, available_at)``: the states are named, as
    the index can seek them (``state <> 'sent'`` read every sent message, each pass)."""
    q = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {q('state')}, count(*), min({q('released_at')}) FROM {_table(connection)} "
            f"WHERE {q('state')} IN ('{PENDING}', '{FAILED}') GROUP BY {q('state')}"
        )
        rows = cursor.fetchall()
    counts = {state: count for state, count, _ in rows}
    times = [_aware(connection, oldest) for _, _, oldest in rows if oldest is not None]
    return Backlog(counts.get(PENDING, 0), counts.get(FAILED, 0), min(times, default=None))


def _aware(connection: BaseDatabaseWrapper, value: Any) -> datetime:
    return aware(connection, value)


def delete_delivered(connection: BaseDatabaseWrapper, size: int) -> int:
    """Delete up to ``size`` sent messages whose record is gone (deleted by the cleanup, or
    released): one batch, the messages deleted."""
    q = connection.ops.quote_name
    table = _table(connection)
    records = q(IdempotencyKey._meta.db_table)
    orphans = (
        f"SELECT m.{q('id')} FROM {table} m WHERE m.{q('state')} = '{SENT}' AND NOT EXISTS "
        f"(SELECT 1 FROM {records} r WHERE r.{q('id')} = m.{q('record_id')}) LIMIT %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(orphans, [size])
        ids = [row[0] for row in cursor.fetchall()]
        if not ids:
            return 0
        marks = ", ".join(["%s"] * len(ids))
        cursor.execute(f"DELETE FROM {table} WHERE {q('id')} IN ({marks})", ids)
        return int(cursor.rowcount)


def listening(store: BoundStore, connection: BaseDatabaseWrapper) -> Callable[[float], bool] | None:
    """Where the store :attr:`~.contract.StoreFeatures.notifies` (PostgreSQL, with psycopg 3),
    ``LISTEN`` on ``connection`` (autocommit, the listener's own) and return a wait:
    ``wait(seconds)`` is ``True`` when woken by a release before ``seconds`` passed. ``None``
    elsewhere (the relay polls)."""
    if not store.features.notifies:
        return None
    connection.ensure_connection()
    raw = connection.connection
    if not hasattr(raw, "notifies"):  # psycopg 2
        return None
    with connection.cursor() as cursor:
        cursor.execute(f"LISTEN {CHANNEL}")

    def wait(seconds: float) -> bool:
        woken = False
        for _ in raw.notifies(timeout=seconds, stop_after=1):
            woken = True
        return woken

    return wait


class TableOutbox(BoundStore):
    """The outbox as the store contract offers it (:class:`~.contract.StoreContract`), on the
    table's statements above, each on the thread's connection to the store's alias."""

    def outbox_refusal(self) -> str | None:
        return None

    def connect_thread(self, seconds: float) -> None:
        """A connection to make (the first, or one discarded after a fault) is raced as the
        renewer's is (:mod:`.connecting`), each attempt's login bounded by
        :data:`~.connecting.CONNECT_TIMEOUT` where the alias gives none: made in a blackhole,
        a single login held a relay its driver's ``connect_timeout`` (psycopg's default
        130 s, MySQLdb's none) however soon the network came back. The thread keeps what
        connected first."""
        connection = connections[self.alias]
        if self.features.has_server and connection.connection is None:
            connections[self.alias] = connecting.connected(
                connection, seconds, connecting.CONNECT_TIMEOUT
            )

    def take(self, size: int, lease: timedelta) -> list[Taken]:
        """Lease up to ``size`` messages due now (:func:`take`)."""
        return take(self, connections[self.alias], size, lease)

    def mark_sent(self, keys: Sequence[str], *, counted: bool) -> int:
        """Mark messages (their ids) sent (:func:`mark_sent`)."""
        return mark_sent(connections[self.alias], keys, counted=counted)

    def mark_failed(self, key: str, error: str, retry_at: datetime | None, *, counted: bool) -> int:
        """Record a failed send of message ``key`` (its id) (:func:`mark_failed`)."""
        return mark_failed(connections[self.alias], key, error, retry_at, counted=counted)

    def message_key(self, scope: str, key_hash: str, message_id: str) -> str:
        """A message's id: unique in the table."""
        return message_id

    def backlog(self) -> Backlog:
        """The outbox table's pending and failed messages, and its oldest undelivered one."""
        return backlog(connections[self.alias])

    def failed_messages(self) -> list[Any]:
        """The outbox table's messages failed for good, oldest release first."""
        rows = OutboxMessage.objects.using(self.alias).filter(state=FAILED)
        return list(rows.order_by("released_at", "id"))

    def resend(self, keys: Sequence[Any]) -> int:
        """Make those of the messages ``keys`` (their ids) still failed pending, due now."""
        rows = OutboxMessage.objects.using(self.alias).filter(pk__in=keys, state=FAILED)
        return resend(connections[self.alias], list(rows.values_list("pk", flat=True)))
