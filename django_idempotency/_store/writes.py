"""The writes of a claim after it is made, each fenced by its lock token: the result, a
recovery point, the lock's renewal, the release (and an operator's, of a stale record)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from django_idempotency._base import rules
from django_idempotency._store import connecting, deadlines
from django_idempotency._store.bound import BoundStore
from django_idempotency._store.contract import ClaimHandle
from django_idempotency._store.contract import (  # its home before the contract
    StoredResponse as StoredResponse,
)
from django_idempotency._store.outbox import Release, fenced_release
from django_idempotency._store.rows import count_rows, per_connection, prep
from django_idempotency._store.statements import later_of
from django_idempotency.models import IdempotencyKey

COMPLETED = IdempotencyKey.Status.COMPLETED
FAILED = IdempotencyKey.Status.FAILED


def _token(value: Any) -> str:
    """A lock token as one text, however a backend reads it back (a ``UUID``, its hex, its
    dashed text)."""
    try:
        return uuid.UUID(str(value)).hex
    except ValueError:
        return str(value)


class RenewalShortfall(DatabaseError):
    """A renewal that settled some of its locks but not all: a Redis Cluster's node that
    failed, or did not answer within the renewal's bound, while the others did.
    ``held``: the locks renewed (primary key, token); ``answered``: every lock (primary key)
    whose answer came (held or lost).
    The renewer counts those, and tries the others again as after a failure."""

    def __init__(
        self, message: str, held: set[tuple[ClaimHandle, Any]], answered: set[int]
    ) -> None:
        super().__init__(message)
        self.held = held
        self.answered = answered


class FencedWrites(BoundStore):
    """Every write on a claimed record: only while it is still ``processing`` under the
    claim's own lock token, so an owner whose lock was taken over changes nothing. The token
    may be given as its text (:attr:`.Claim.token_text`: sent as it is)."""

    def store_response(
        self,
        pk: int,
        token: uuid.UUID | str,
        stored: StoredResponse,
        *,
        stale_at: datetime | None = None,
        connection: BaseDatabaseWrapper | None = None,
        bound: float | None = None,
        release: Release | None = None,
        new_token: uuid.UUID | None = None,
    ) -> bool:
        """Store the final response (and insert the outbox's messages in ``release``, in
        the same transaction: :mod:`.outbox`); ``False`` when the lock was lost (the result
        is refused), or when an earlier write of it was applied (:meth:`finished` tells
        which). An owner's write gives its ``bound`` (seconds, :meth:`bounded`).

        With ``stale_at`` (an operator failing a stuck record) only while the lock is still
        expired at that time, and with ``new_token`` in place of the owner's. A result with
        its own ``ttl`` sets ``expires_at`` in the same statement; any other leaves it out,
        so the default costs nothing more.
        """
        now = timezone.now()
        expiry: dict[str, Any] = {} if stored.ttl is None else {"expires_at": now + stored.ttl}
        if new_token is not None:
            expiry["lock_token"] = new_token
        on = self.connection if connection is None else connection

        def write() -> bool:
            return self._fenced_update(
                on,
                pk,
                token,
                stale_at,
                release,
                status=rules.stored_status(stored.status),
                response_status=stored.status,
                response_headers=stored.sealed[0],
                response_body=stored.sealed[1],
                unlock_at=None,
                updated_at=now,
                **expiry,
            )

        return write() if bound is None else self.bounded(on, bound, write)

    def finished(self, pk: int, token: uuid.UUID | str, connection: BaseDatabaseWrapper) -> bool:
        """Whether the record is no longer ``processing`` under this lock token: a takeover
        changes the token and a release deletes the row, so only the owner's result did it
        (a result write applied whose reply was lost)."""
        return self._holds(connection, pk, token, f"{{status}} <> '{rules.PROCESSING}'", [])

    def has_recovery_point(
        self, pk: int, token: uuid.UUID | str, name: str, connection: BaseDatabaseWrapper
    ) -> bool:
        """Whether the record is still ``processing`` under this lock token at recovery point
        ``name``: a recovery point write applied whose reply was lost."""
        return self._holds(
            connection,
            pk,
            token,
            f"{{status}} = '{rules.PROCESSING}' AND {{recovery_point}} = %s",
            [name],
        )

    def _holds(
        self,
        connection: BaseDatabaseWrapper,
        pk: int,
        token: uuid.UUID | str,
        condition: str,
        params: list[Any],
    ) -> bool:
        """Whether the record ``pk`` under this lock token meets ``condition`` (its column
        names in braces): an owner reading back a write whose reply was lost."""
        q = connection.ops.quote_name
        names = {name: q(name) for name in ("status", "recovery_point")}
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT 1 FROM {q(IdempotencyKey._meta.db_table)} WHERE {q('id')} = %s "
                f"AND {q('lock_token')} = %s AND {condition.format(**names)}",
                [pk, prep("lock_token", token, connection), *params],
            )
            return cursor.fetchone() is not None

    def save_recovery_point(
        self,
        pk: int,
        token: uuid.UUID | str,
        name: str,
        data: Any,
        lock_timeout: timedelta,
        *,
        connection: BaseDatabaseWrapper | None = None,
        bound: float | None = None,
        release: Release | None = None,
    ) -> bool:
        """Record progress and renew the lock: an attempt that makes progress is alive; the
        outbox's messages staged before it are released with it (``release``).

        Tried again after its reply was lost, it matches again (the fence is the token and
        ``processing``, which the first did not change) and counts as saved.
        """
        now = timezone.now()
        on = self.connection if connection is None else connection
        return self.bounded(
            on,
            deadlines.bound(lock_timeout) if bound is None else bound,
            lambda: self._fenced_update(
                on,
                pk,
                token,
                None,
                release,
                recovery_point=name,
                recovery_data=data,
                unlock_at=now + lock_timeout,
                updated_at=now,
                **{HOLD_EXPIRY: now + lock_timeout},
            ),
        )

    def unlock(
        self,
        pk: int,
        token: uuid.UUID | str,
        *,
        connection: BaseDatabaseWrapper | None = None,
        bound: float | None = None,
    ) -> bool:
        """Leave the claim's record, with its recovery point, to the next attempt: still
        ``processing``, its lock lapsed now, so the next request takes it over and resumes
        from the point (a release that keeps the progress). ``False`` if the lock
        was lost."""
        now = timezone.now()
        on = self.connection if connection is None else connection

        def unlock() -> bool:
            return self._fenced_update(on, pk, token, None, None, unlock_at=now, updated_at=now)

        return unlock() if bound is None else self.bounded(on, bound, unlock)

    def _renewer_connection(self, seconds: float) -> BaseDatabaseWrapper:
        """The renewer's thread's connection, connected within ``seconds`` if it is not: the
        thread keeps what connected first (:mod:`.connecting`)."""
        connection = self.connection
        if self.features.has_server and connection.connection is None:
            connection = connections[self.alias] = connecting.connected(
                connection, seconds, connecting.CONNECT_TIMEOUT
            )
        return connection

    def renew(
        self,
        leases: Sequence[tuple[ClaimHandle, uuid.UUID | str]],
        lock_timeout: timedelta,
        bound: float | None = None,
    ) -> set[tuple[ClaimHandle, Any]]:
        """Push ``unlock_at`` of many claims' records forward in one fenced statement
        (:mod:`django_idempotency._call.heartbeat`); returns the leases (primary key, token)
        still held.

        Every record's own lock token must still be on it (tokens are fresh for every claim,
        so ``lock_token IN (...)`` cannot match one record with another's token), and it must
        still be ``processing``. When fewer rows match than were asked for (rare: a lock was
        lost), one ``SELECT`` of the held rows' ids and tokens says which: portable, where
        ``UPDATE ... RETURNING`` is not. A lease is held only when its own pair is on a row: a
        stale owner and the claim that took its record over, in one process, share the
        record's id, and matching ids alone kept both.
        Within ``bound`` seconds (the renewer's; by default a statement's share of the lock).
        """
        seconds = deadlines.bound(lock_timeout) if bound is None else bound
        connection = self._renewer_connection(seconds)
        q = connection.ops.quote_name
        table = q(IdempotencyKey._meta.db_table)
        where, params = _held(connection, leases)
        unlock_at = prep("unlock_at", timezone.now() + lock_timeout, connection)

        # The record outlives its lock: one whose owner keeps renewing is never expired (and
        # taken over as such), however long it runs past its TTL.
        expires_at = later_of("expires_at", "%s", q)
        sets = f"{q('unlock_at')} = %s, {q('expires_at')} = {expires_at}"

        def renew() -> set[tuple[ClaimHandle, Any]]:
            with connection.cursor() as cursor:
                cursor.execute(
                    f"UPDATE {table} SET {sets} WHERE {where}",
                    [unlock_at, unlock_at, unlock_at, *params],
                )
                if cursor.rowcount == len(leases):
                    return set(leases)
                cursor.execute(
                    f"SELECT {q('id')}, {q('lock_token')} FROM {table} WHERE {where}", params
                )
                rows = {(row[0], _token(row[1])) for row in cursor.fetchall()}
            return {(pk, token) for pk, token in leases if (pk, _token(token)) in rows}

        return self.bounded(connection, seconds, renew)

    def release(
        self,
        pk: int,
        token: uuid.UUID | str,
        *,
        stale_at: datetime | None = None,
        connection: BaseDatabaseWrapper | None = None,
        bound: float | None = None,
    ) -> bool:
        """Delete the claim's record so a retry claims afresh; ``False`` if the lock was lost
        (or, on a ``connection`` of the owner's own, if an earlier delete was applied).

        With ``stale_at`` (an operator releasing a stuck record) only while the lock is still
        expired at that time. An owner's release gives its ``bound`` (:meth:`bounded`).
        """
        on = self.connection if connection is None else connection

        def delete() -> bool:
            return self._fenced(on, "DELETE FROM {table}", [], pk, token, stale_at)

        return delete() if bound is None else self.bounded(on, bound, delete)

    def release_stale(self, record: IdempotencyKey) -> bool:
        """The contract's :meth:`~.contract.StoreContract.release_stale`: :meth:`release` by
        the record's id and token, while it is still stale now."""
        return record.lock_token is not None and self.release(
            record.pk, record.lock_token, stale_at=timezone.now()
        )

    def fail_stale(self, record: IdempotencyKey, stored: StoredResponse) -> bool:
        """The contract's :meth:`~.contract.StoreContract.fail_stale`: :meth:`store_response`
        by the record's id and token, while it is still stale now, under a token of its own:
        the owner's result write matches no row, and its read-back after a fault
        (:meth:`finished`) does not take the operator's failure for its own result."""
        return record.lock_token is not None and self.store_response(
            record.pk, record.lock_token, stored, stale_at=timezone.now(), new_token=uuid.uuid4()
        )

    def _fenced_update(
        self,
        connection: BaseDatabaseWrapper,
        pk: int,
        token: uuid.UUID | str,
        stale_at: datetime | None,
        release: Release | None,
        **changes: Any,
    ) -> bool:
        prepare = self.text_preparers(connection)
        values = []
        for name, value in changes.items():
            if name == HOLD_EXPIRY:  # its value twice (:func:`fenced_sql`)
                values += [prepare["expires_at"](value)] * 2
            else:
                values.append(prepare[name](value))
        return self._fenced(connection, tuple(changes), values, pk, token, stale_at, release)

    def _fenced(
        self,
        connection: BaseDatabaseWrapper,
        statement: Write,
        params: list[Any],
        pk: int,
        token: uuid.UUID | str,
        stale_at: datetime | None,
        release: Release | None = None,
    ) -> bool:
        """Run a write on the claim's own record only: its lock token, still ``processing``
        (and with ``stale_at``, still :data:`~django_idempotency._base.rules.STALE` then).

        Plain SQL: a queryset's ``update()`` and ``delete()`` compile on every call, and
        ``delete()`` may first ``SELECT`` the rows to send signals, which would lose the fence
        between the two statements.
        """
        sql = fenced_sql(
            connection, statement, stale=stale_at is not None, placeholders=self.set_placeholders
        )
        params = [*params, pk, self.text_preparers(connection)["lock_token"](token)]
        if stale_at is not None:
            params += rules.STALE.args(prep("unlock_at", stale_at, connection))
        if release is not None:  # with the outbox's messages it releases
            return bool(fenced_release(self, connection, sql, params, release))
        return bool(count_rows(connection, sql, params))


#: A fenced write's change that keeps ``expires_at`` no earlier than its value (a new lock's
#: end): the record outlives the lock of an owner that shows it is alive.
HOLD_EXPIRY = "expires_at_at_least"

#: A fenced write: a statement's head (``{table}`` for the table's name), or the columns an
#: ``UPDATE`` sets.
Write = str | tuple[str, ...]


@per_connection
def _fenced_statements(connection: BaseDatabaseWrapper) -> dict[tuple[Write, bool], str]:
    return {}


def fenced_sql(
    connection: BaseDatabaseWrapper,
    statement: Write,
    *,
    stale: bool,
    placeholders: Callable[[BaseDatabaseWrapper], dict[str, str]],
) -> str:
    """The SQL of a fenced write (:meth:`FencedWrites._fenced`), made once per connection:
    quoting its dozen names cost a result's write as much as its values.
    ``placeholders`` are the store's :meth:`~.bound.BoundStore.set_placeholders`."""
    made = _fenced_statements(connection)
    sql = made.get((statement, stale))
    if sql is not None:
        return sql
    q = connection.ops.quote_name
    head = statement
    if isinstance(head, tuple):
        marks = placeholders(connection)
        head = "UPDATE {table} SET " + ", ".join(
            f"{q('expires_at')} = {later_of('expires_at', marks.get('expires_at', '%s'), q)}"
            if name == HOLD_EXPIRY
            else f"{q(name)} = {marks.get(name, '%s')}"
            for name in head
        )
    sql = head.format(table=q(IdempotencyKey._meta.db_table))
    sql += f" WHERE {q('id')} = %s AND {q('lock_token')} = %s"
    # The status a live claim has, written out: a constant, not a value to send.
    sql += f" AND {rules.STALE.where(q)}" if stale else f" AND {q('status')} = '{rules.PROCESSING}'"
    made[(statement, stale)] = sql
    return sql


def _held(
    connection: BaseDatabaseWrapper, leases: Sequence[tuple[ClaimHandle, uuid.UUID | str]]
) -> tuple[str, list[Any]]:
    """The condition on the rows still held by ``leases``, and its parameters: each record's
    id and token among the leases', and still ``processing``."""
    q = connection.ops.quote_name
    marks = ", ".join(["%s"] * len(leases))
    where = f"{q('id')} IN ({marks}) AND {q('lock_token')} IN ({marks}) AND {q('status')} = %s"
    params: list[Any] = [pk for pk, _ in leases]
    params += [prep("lock_token", token, connection) for _, token in leases]
    params.append(rules.PROCESSING)
    return where, params
