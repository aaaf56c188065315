"""The claim: one atomic statement decides whether a call owns its key.

The claim inserts with ``INSERT ... ON CONFLICT DO NOTHING`` (or the vendor's equivalent); an
expired or stale record is taken over by an ``UPDATE`` whose ``WHERE`` re-checks that it still
is one. Every decision is made by a statement, never by a check in Python followed by a write.
"""

from __future__ import annotations

import os
import time
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeAlias, TypeVar, Union

from django.conf import settings
from django.db import DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from django_idempotency._base import rules
from django_idempotency._base.durations import EPOCH
from django_idempotency._store import deadlines
from django_idempotency._store.bound import BoundStore
from django_idempotency._store.contract import Lock as Lock  # its home before the contract
from django_idempotency._store.rows import Record, prep, preparers
from django_idempotency._store.statements import CLAIM_LITERALS, CLAIM_PARAMS, TAKEOVER_FRESH
from django_idempotency.models import IdempotencyKey

C = TypeVar("C", covariant=True)
T = TypeVar("T")


class Claimant(Protocol[C]):
    """What the store needs of a call to claim its key, and how the call takes its claim: the
    store knows no type of the layers above it. ``Identity`` is the one claimant."""

    @property
    def scope(self) -> str: ...
    @property
    def key_hash(self) -> str: ...
    @property
    def fingerprint(self) -> str: ...
    @property
    def method(self) -> str: ...
    @property
    def path(self) -> str: ...

    def claimed(
        self,
        *,
        pk: int,
        token_text: str,
        attempt: int,
        recovery_point: str,
        recovery_data: Any,
        alias: str,
        lock_timeout: timedelta,
        held_until: float,
        uncommitted: bool,
        life: int | IdempotencyKey | Record | None = None,
    ) -> C:
        """The call's claim on record ``pk``, which the store has just made; ``life`` is when
        the record's life began as far as the claim knows it without a read (see
        :attr:`.Claim.life`)."""
        ...


#: What :meth:`Claims.claim` returns: the claim, the record of another call that holds the key
#: (a :class:`~.rows.Record` from PostgreSQL's claim function, a model instance elsewhere), or
#: ``None`` when a concurrent claim or release came between two statements (claim again).
ClaimOutcome: TypeAlias = Union[T, IdempotencyKey, Record, None]  # noqa: UP007


def new_token() -> str:
    """A fresh lock token: a random (version 4) UUID's text, made without a ``uuid.UUID``,
    whose making and printing cost a claim more than all its other values."""
    digits = os.urandom(16).hex()
    variant = "89ab"[int(digits[16], 16) & 3]
    return f"{digits[:8]}-{digits[8:12]}-4{digits[13:16]}-{variant}{digits[17:20]}-{digits[20:]}"


class ClaimValues:
    """What a claim writes when it inserts: the call's identity, its fresh lock token, the
    claim's time and the times it derives.

    The time is read as microseconds since the epoch (:attr:`clock`): PostgreSQL's claim
    function is sent that number and derives its times in the statement. The ``datetime``
    values are made only when a store reads them: making a time and writing it out as text
    cost a claim more than all its other values.
    """

    __slots__ = ("_now", "clock", "identity", "lock_timeout", "token", "ttl")

    def __init__(
        self, identity: Claimant[Any], token: str, lock_timeout: timedelta, ttl: timedelta
    ) -> None:
        self.identity = identity
        #: The claim's fresh lock token, as text (:func:`new_token`).
        self.token = token
        self.lock_timeout = lock_timeout
        self.ttl = ttl
        #: The claim's time: microseconds since the epoch, from the clock ``timezone.now()`` reads.
        self.clock = time.time_ns() // 1000
        self._now: datetime | None = None

    @property
    def now(self) -> datetime:
        """The claim's time as ``timezone.now()`` gives it (aware, or naive without ``USE_TZ``)."""
        if self._now is None:
            instant = EPOCH + timedelta(microseconds=self.clock)
            self._now = instant if settings.USE_TZ else instant.astimezone().replace(tzinfo=None)
        return self._now

    @property
    def unlock_at(self) -> datetime:
        return self.now + self.lock_timeout

    @property
    def expires_at(self) -> datetime:
        return self.now + self.ttl

    def params(self, connection: BaseDatabaseWrapper) -> list[Any]:
        """The values of the claim's placeholders (:data:`.statements.CLAIM_PARAMS`), as
        the fields send them to this database."""
        identity = self.identity
        prepare = preparers(connection)
        values: dict[str, Any] = {
            "scope": identity.scope,
            "key_hash": identity.key_hash,
            "method": identity.method,
            "path": identity.path,
            "request_hash": identity.fingerprint,
            "lock_token": self.token,
        }
        values["created_at"] = values["updated_at"] = self.now
        values["unlock_at"] = self.unlock_at
        values["expires_at"] = self.expires_at
        return [prepare[name](values[name]) for name in CLAIM_PARAMS]


class Claims(BoundStore):
    """The claim and what bounds its wait; a vendor writes :meth:`insert_or_load` (and may
    write :meth:`take_over` and the lock-wait bound)."""

    def claim(
        self,
        identity: Claimant[C],
        *,
        ttl: timedelta,
        lock_timeout: timedelta,
        token: str | None = None,
        bound: float | None = None,
    ) -> ClaimOutcome[C]:
        """Claim the call's key, or return the record that holds it.

        A new key costs one statement and so does a live key's record (the replay's only one).
        An expired record, or a stale ``processing`` one with the same fingerprint, is taken
        over by one more, fenced ``UPDATE`` (inside the same statement on PostgreSQL). A claim
        made again after a fault passes the ``token`` of the first: a record found under it is
        the first's, applied with its reply lost, and so this call's.

        Its statements end within ``bound`` seconds (default :func:`.deadlines.bound` of
        ``lock_timeout``), or the connection is cut and the claim fails as on a lost one.
        """
        started = time.monotonic()  # before now: the lock is surely held until lock_timeout later
        values = ClaimValues(identity, token or new_token(), lock_timeout, ttl)
        # Errors become the app's own (guard()), without a generator's context manager: this
        # is every protected call's path. Preparing a value may connect (MariaDB's UUID type).
        try:
            connection = self.connection
            watch = deadlines.watch(
                connection,
                deadlines.bound(lock_timeout) if bound is None else bound,
                self.socket_read_first,
            )
            try:
                outcome = self._claim_on(identity, connection, values, lock_timeout, started)
            finally:
                cut = deadlines.unwatch(watch)
            if cut:  # its reply came as the connection was cut: it is dead all the same
                raise deadlines.Late(f"No reply from {self.alias!r} in time.")
            return outcome
        except DatabaseError as exc:
            self.faulted(exc)
            raise self.refusal(exc) from exc

    def _claim_on(
        self,
        identity: Claimant[C],
        connection: BaseDatabaseWrapper,
        values: ClaimValues,
        lock_timeout: timedelta,
        started: float,
    ) -> ClaimOutcome[C]:
        """The claim's statements (:meth:`claim` watches them)."""
        token = values.token
        found = self.insert_or_load(connection, values)
        if found is None:
            return None
        if isinstance(found, int):  # inserted, not read back: a first attempt
            return self._claim(identity, connection, values, lock_timeout, started, found)
        if isinstance(found, Record):  # the claim function took over what it could
            return (
                self._claim(identity, connection, values, lock_timeout, started, found.pk, found)
                if found.holds_token(token)
                else found
            )
        if str(found.lock_token) != token:  # not this call's row: another call's record
            if not rules.TAKEOVER.holds(found, values.now, identity.fingerprint):
                return found
            params = self.claim_params(connection, values)
            again = take_over_params(connection, found.pk, params, values.now, identity.fingerprint)
            found = self.take_over(connection, found.pk, again, token)
            if found is None:
                return None
        return self._claim(identity, connection, values, lock_timeout, started, found.pk, found)

    def _claim(
        self,
        identity: Claimant[C],
        connection: BaseDatabaseWrapper,
        values: ClaimValues,
        lock_timeout: timedelta,
        started: float,
        pk: int,
        record: IdempotencyKey | Record | None = None,
    ) -> C:
        """The claim on record ``pk``, as ``record`` reads (``None``: a first attempt's)."""
        return identity.claimed(
            pk=pk,
            token_text=values.token,
            attempt=1 if record is None else record.attempt,
            recovery_point="" if record is None else record.recovery_point,
            recovery_data=None if record is None else record.recovery_data,
            alias=self.alias,
            lock_timeout=lock_timeout,
            held_until=started + lock_timeout.total_seconds(),
            uncommitted=connection.in_atomic_block,
            # The claim's own time for a record it inserted without reading it back (exact:
            # it wrote it; without USE_TZ a local time read back may fall in a DST fold, so
            # it is read as the status endpoint reads it); else the row as the claim left it.
            life=(values.clock if settings.USE_TZ else None) if record is None else record,
        )

    def insert_or_load(
        self, connection: BaseDatabaseWrapper, values: ClaimValues
    ) -> int | IdempotencyKey | Record | None:
        """Read the key's record, or insert a new one; ``None`` when neither is visible.

        The inserted record carries ``values.token``; a store that knows it inserted without
        reading the row back returns its primary key. A :class:`~.rows.Record` comes from a
        statement that also took over an expired or stale record (PostgreSQL's function).
        """
        raise NotImplementedError

    def claim_params(self, connection: BaseDatabaseWrapper, values: ClaimValues) -> list[Any]:
        """The values of the claim's placeholders (:meth:`ClaimValues.params`); a vendor may
        write them for less."""
        return values.params(connection)

    def read_finished(
        self, identity: Claimant[Any], bound: float
    ) -> IdempotencyKey | Record | None:
        """The key's record when it is finished and not expired, read on its own: what a
        replay (or a mismatch) answers from, with no claim and no transaction; ``None``: no
        such record, so the key is claimed (atomic mode).

        The claim finds such a record and leaves it as it is, so the answer is the claim's.
        The read ends within ``bound`` seconds, as every statement of the app does.
        Raises :class:`~.exceptions.StoreUnavailable`.
        """
        try:
            connection = self.connection
            return self.bounded(
                connection, bound, lambda: self.select_finished(connection, identity)
            )
        except DatabaseError as exc:
            raise self.refusal(exc) from exc

    def select_finished(
        self, connection: BaseDatabaseWrapper, identity: Claimant[Any]
    ) -> IdempotencyKey | Record | None:
        now = prep("expires_at", timezone.now(), connection)
        return self.first(
            connection,
            self.statements(connection).finished,
            [identity.scope, identity.key_hash, now],
        )

    def take_over(
        self, connection: BaseDatabaseWrapper, pk: int, values: list[Any], token: str
    ) -> IdempotencyKey | None:
        """Make an expired or stale record this call's, if it still is one: the record as
        taken over, or ``None``. ``values`` are :func:`take_over_params`.

        The ``WHERE`` repeats the test (:data:`~django_idempotency._base.rules.TAKEOVER`), so of
        concurrent calls exactly one wins: the database re-checks it against the row a
        concurrent winner left. An expired record starts afresh; a stale one keeps its recovery
        point, attempt + 1.
        """
        return self.first(connection, self.statements(connection).take_over, values)

    def peek_status(self, scope: str, key_hash: str, bound: float | None = None) -> Lock | None:
        """The cheap poll of a waiter: status and ``unlock_at`` only (within ``bound``
        seconds, :meth:`bounded`)."""
        with self.guard():
            row = self.read_status(self.connection, scope, key_hash, bound)
        return None if row is None else Lock(*row)

    def read_status(
        self, connection: BaseDatabaseWrapper, scope: str, key_hash: str, bound: float | None
    ) -> tuple[str, Any] | None:
        """:meth:`peek_status`'s read, its database errors raised as they are."""

        def read() -> tuple[str, Any] | None:
            return (
                IdempotencyKey.objects.using(connection.alias)
                .filter(scope=scope, key_hash=key_hash)
                .values_list("status", "unlock_at")
                .first()
            )

        return read() if bound is None else self.bounded(connection, bound, read)

    def limit_lock_wait(self, timeout: timedelta) -> object:
        """Bound how long the claim waits for another transaction's uncommitted row (atomic
        mode); returns what :meth:`restore_lock_wait` puts back, ``None`` for nothing."""
        return None

    def restore_lock_wait(self, previous: object) -> None:
        """Put back what :meth:`limit_lock_wait` replaced, before the caller's own code runs."""

    def atomic(self, wait: timedelta) -> AbstractContextManager[Any]:
        """Atomic mode's transaction (a savepoint inside the caller's); ``wait`` bounds a wait
        for the write lock where the database takes it for the whole transaction (SQLite)."""
        return transaction.atomic(using=self.alias)

    def hold(self, scope: str, key_hash: str) -> None:
        """An atomic attempt of this process claimed its key (see :meth:`holds`)."""

    def let_go(self, scope: str, key_hash: str) -> None:
        """That attempt's transaction ended."""

    def holds(self, scope: str, key_hash: str) -> bool:
        """Whether an atomic attempt of this process holds the key now, where the database
        cannot say who holds the lock a duplicate waited for (SQLite)."""
        return False

    def in_nested_transaction(self) -> bool:
        """Whether the innermost atomic block is a savepoint inside a caller's transaction."""
        return len(connections[self.alias].atomic_blocks) > 1


def take_over_params(
    connection: BaseDatabaseWrapper, pk: int, params: list[Any], now: datetime, request_hash: str
) -> list[Any]:
    """The values of :attr:`.Statements.take_over`'s placeholders, in order, from the claim's
    own (``params``)."""
    fresh = dict(zip(CLAIM_PARAMS, params, strict=True))
    db_now = prep("updated_at", now, connection)
    values = [fresh[name] for name in TAKEOVER_FRESH if name not in CLAIM_LITERALS]
    values += [db_now, db_now, db_now]  # expired? for recovery_point, recovery_data, attempt
    values += [db_now, fresh["created_at"]]
    values += [db_now, fresh["expires_at"], fresh["unlock_at"], fresh["unlock_at"]]
    return [*values, pk, *rules.TAKEOVER.args(db_now, request_hash)]
