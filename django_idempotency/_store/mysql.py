"""MySQL and MariaDB (Django's ``mysql`` vendor): no ``RETURNING``, a session lock wait.

One set of statements serves both servers: MariaDB has ``RETURNING`` on ``INSERT`` and
``DELETE`` but not on ``UPDATE``, MySQL none at all, so neither uses it. The claim decides from
a duplicate-key error and affected-row counts (Django connects with ``CLIENT_FOUND_ROWS``: an
``UPDATE`` counts the rows it matched) and from the lock token.
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, cast

from django.conf import settings
from django.db import DatabaseError, IntegrityError, InterfaceError, OperationalError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_idempotency._store import deadlines, galera, mysqlclient, time_zones
from django_idempotency._store.base import Store
from django_idempotency._store.bound import database_key
from django_idempotency._store.claims import ClaimValues
from django_idempotency._store.maintenance import Batch, BatchQuery, SizeQuery
from django_idempotency._store.rows import (
    aware,
    loaded,
    plain_connection,
    prep,
    preparers,
    statement_cursor,
)
from django_idempotency._store.statements import CLAIM_PARAMS, Statements, fill
from django_idempotency.models import IdempotencyKey

logger = logging.getLogger("django_idempotency")

#: ``ER_DUP_ENTRY``: the claim's ``INSERT`` met the key's record. Only this error means so:
#: ``INSERT IGNORE`` would swallow others too (a value too long, a bad date).
DUPLICATE_KEY = 1062
#: ``ER_LOCK_WAIT_TIMEOUT``: waited ``innodb_lock_wait_timeout`` for another transaction's row.
LOCK_WAIT_TIMEOUT = 1205
#: ``ER_LOCK_DEADLOCK``: InnoDB rolled back the whole transaction to break a deadlock, which
#: concurrent inserts of the same key can make (each holds a shared lock on the duplicate, and
#: each wants an exclusive one once its holder rolls back or deletes it).
DEADLOCK = 1213
#: A fault (:meth:`MySQLStore.is_fault`): the server went away (2006), the connection was lost
#: (2013, 2055) or refused (2002, 2003, 1040 too many connections), killed (1927) or timed out
#: (4031), the server is shutting down (1053), or it refuses writes for now: ``read_only``
#: (1290, 1836) or a read-only transaction (1792).
FAULTS = frozenset({1040, 1053, 1290, 1792, 1836, 1927, 2002, 2003, 2006, 2013, 2055, 4031})

#: Where :meth:`MySQLStore.limit_lock_wait` keeps the session's own limit.
_PREVIOUS = "@django_idempotency_lock_wait"
#: Puts back the limit the session had. ``innodb_lock_wait_timeout`` is a session variable,
#: not a transaction's: unlike PostgreSQL's ``SET LOCAL`` it outlives the transaction, so it is
#: always put back.
RESTORE_LOCK_WAIT = f"SET SESSION innodb_lock_wait_timeout = {_PREVIOUS}"
#: The attribute of a connection holding the bound of atomic mode's claim on MariaDB, written
#: into the claim's own statements (``SET STATEMENT ... FOR``).
_IN_STATEMENT = "_django_idempotency_lock_wait"
#: Two cleanups' locks on the secondary indexes can deadlock: the victim's batch is run again.
_DEADLOCK_RETRIES = 5
_EXPIRES_INDEX = next(i.name for i in IdempotencyKey._meta.indexes if i.fields == ["expires_at"])


#: The epoch as a naive time (UTC).
_NAIVE_EPOCH = datetime(1970, 1, 1)
assert CLAIM_PARAMS == (
    "scope",
    "key_hash",
    "method",
    "path",
    "request_hash",
    "lock_token",
    "created_at",
    "updated_at",
    "unlock_at",
    "expires_at",
), CLAIM_PARAMS

#: ``ER_SP_DOES_NOT_EXIST``: the claim procedure is gone (its migration unapplied).
NO_PROCEDURE = 1305

#: The claim procedure: the claim's read, and a new key's insert, in one round trip.
CLAIM_PROCEDURE = "django_idempotency_claim"
#: Sends the claim's values (:data:`.statements.CLAIM_PARAMS`) to it.
CALL = f"CALL {CLAIM_PROCEDURE}({', '.join(['%s'] * len(CLAIM_PARAMS))})"
_HAS_PROCEDURE_SQL = (
    "SELECT COUNT(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = DATABASE() "
    "AND ROUTINE_TYPE = 'PROCEDURE' AND ROUTINE_NAME = %s"
)
#: Whether the claim procedure is there, per database (checked once per process): without
#: it (``--nomigrations``, or no ``CREATE ROUTINE`` privilege) the claim is plain statements.
_HAS_PROCEDURE: dict[tuple[Any, ...], bool] = {}


def claim_procedure_sql(types: dict[str, str]) -> str:
    """``CREATE PROCEDURE``: the claim's read and a new key's insert (:class:`Statements`),
    run inside the database in one round trip (a two-phase first execution one statement,
    as a replay is).

    It reads first: a live record (a replay, a mismatch, an attempt in flight) is answered by
    reads alone, which write nothing and wait on no lock, so replays are served while the
    server refuses writes. A missing key is inserted; a duplicate-key error (a concurrent
    attempt inserted the key in between; InnoDB undoes that statement alone) is left to the
    last read, which returns the record either way. The takeover of an expired or stale
    record, and atomic mode's bound on the lock wait, stay with the caller.

    ``types`` are the parameters' types, each as its column has it (its character set and
    collation too, or comparing would mix collations): read from the table when the procedure
    is made, so a migration that changes a column makes the procedure again. The migration
    that makes it carries a copy of this text; a test checks they agree.
    """
    connection = cast(BaseDatabaseWrapper, _Quoting)
    plain = Statements.plain(connection)
    arguments = ",\n    ".join(f"IN p_{name} {types[name]}" for name in CLAIM_PARAMS)
    select = fill(plain.select, ["p_scope", "p_key_hash"])
    exists = select.replace(f"SELECT {plain.columns} ", "SELECT 1 ", 1)
    insert = fill(plain.insert, [f"p_{name}" for name in CLAIM_PARAMS])
    return f"""CREATE PROCEDURE {CLAIM_PROCEDURE}(
    {arguments}
)
MODIFIES SQL DATA
BEGIN
    DECLARE CONTINUE HANDLER FOR {DUPLICATE_KEY} BEGIN END;
    IF NOT EXISTS ({exists}) THEN
        {insert};
    END IF;
    {select};
END"""


class _Quoting:
    """What :meth:`Statements.plain` reads of a connection: MySQL's quoting of names."""

    class ops:  # the attribute of a connection
        @staticmethod
        def quote_name(name: str) -> str:
            return f"`{name}`"


def error_code(exc: BaseException) -> int | None:
    """The server's error number behind a Django database error (``None`` for another)."""
    cause = exc.__cause__ if isinstance(exc, DatabaseError) else exc
    args = getattr(cause, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


@dataclass(frozen=True)
class MySQLStatements(Statements):
    #: The record under a claim's lock token: the read after a takeover.
    select_owned: str


class MySQLStore(Store):
    vendor = "mysql"
    name = "MySQL/MariaDB"
    # A claim in atomic mode must read the rows other attempts committed after its
    # transaction's snapshot.
    isolation_level = "read committed"
    features = replace(Store.features, lock_wait_outlives_transaction=True, keeps_every_scope=False)
    socket_read_first = True
    ignore_duplicate = " ON DUPLICATE KEY UPDATE {column} = {column}"

    def converts_dates_to(self, zone: str) -> bool:
        """Only with the server's time-zone tables, for a named zone (:mod:`.time_zones`)."""
        if not settings.USE_TZ:
            return True
        return time_zones.converts(self.alias, self.connection.timezone_name, zone)

    def eviction_stall(self) -> timedelta | None:
        """A Galera node's ``evs.suspect_timeout``; ``None`` for a server that is no Galera
        node (:mod:`.galera`)."""
        with self.connection.cursor() as cursor:
            return galera.suspect_timeout(cursor)

    def fetch_row(self, connection: BaseDatabaseWrapper, sql: str, params: list[Any]) -> Any:
        """Through mysqlclient's connection itself where nothing else would see the statement
        (:mod:`.mysqlclient`); every result it leaves is read."""
        raw = plain_connection(connection)
        if raw is None:
            return super().fetch_row(connection, sql, params)
        connection.validate_no_broken_transaction()
        with connection.wrap_database_errors:
            return mysqlclient.first_row(raw, sql, params)

    def claim_params(self, connection: BaseDatabaseWrapper, values: ClaimValues) -> list[Any]:
        """With ``USE_TZ`` and the connection's zone UTC, the times are naive text in UTC:
        written from the claim's clock, as the field would write them (``str()`` of the naive
        time), without an aware time made and converted four times. The lock token
        as its field writes it: the text of a UUID for MariaDB's own type, its 32 hex digits
        for a char(32) column, with no ``uuid.UUID`` made."""
        if not (settings.USE_TZ and connection.timezone_name == "UTC"):
            return values.params(connection)
        identity = values.identity
        token = values.token
        if not connection.features.has_native_uuid_field:
            token = token.replace("-", "")
        instant = _NAIVE_EPOCH + timedelta(microseconds=values.clock)
        now = str(instant)
        prepare = preparers(connection)
        fields = (identity.scope, identity.key_hash, identity.method, identity.path)
        params = [
            prepare[name](value)
            for name, value in zip(CLAIM_PARAMS[:5], (*fields, identity.fingerprint), strict=True)
        ]
        return [
            *params,
            token,
            now,
            now,
            str(instant + values.lock_timeout),
            str(instant + values.ttl),
        ]

    def build_statements(self, connection: BaseDatabaseWrapper) -> MySQLStatements:
        plain = Statements.plain(connection)
        q = connection.ops.quote_name
        return MySQLStatements(
            **vars(plain),
            select_owned=f"SELECT {plain.columns} FROM {plain.table} WHERE {q('id')} = %s "
            f"AND {q('lock_token')} = %s",
        )

    def insert_or_load(
        self, connection: BaseDatabaseWrapper, values: ClaimValues
    ) -> int | IdempotencyKey | None:
        """The record is read first; a new key is then claimed outright (its primary key).

        The read writes nothing and takes no lock, so a replay costs one statement and is
        served while the server refuses writes (``read_only``, a read-only transaction). A
        plain ``INSERT`` follows only when no record was there, its duplicate-key error caught
        (a concurrent attempt inserted the key in between: the record is read again): InnoDB
        undoes the failed statement alone, so no savepoint is needed even inside a
        transaction, and ``lastrowid`` is all it reads back. ``ON DUPLICATE KEY UPDATE``
        would lock the live record exclusively, and with ``CLIENT_FOUND_ROWS`` its row count
        does not tell an insert from a duplicate.

        A deadlock outside a transaction made this statement alone its victim: ``None``, claim
        again. Inside one, InnoDB rolled the whole transaction back: it is raised (``409``).
        """
        statements = self.statements(connection)
        key = [values.identity.scope, values.identity.key_hash]
        try:
            if self.has_procedure(connection):
                try:
                    return self._call(connection, values)
                except OperationalError as exc:
                    if error_code(exc) != NO_PROCEDURE:
                        raise
                    # Dropped since (the migration unapplied): plain statements from now on.
                    _HAS_PROCEDURE[database_key(connection)] = False
            bound = _bound(connection)
            found = self.first(connection, bound + statements.select, key)
            if found is not None:
                return found
            with connection.cursor() as cursor:
                try:
                    cursor.execute(bound + statements.insert, self.claim_params(connection, values))
                except IntegrityError as exc:
                    if error_code(exc) != DUPLICATE_KEY:
                        raise
                else:
                    return int(cursor.lastrowid)
            return self.first(connection, bound + statements.select, key)
        except OperationalError as exc:
            if error_code(exc) == DEADLOCK and not connection.in_atomic_block:
                return None
            raise

    def _call(self, connection: BaseDatabaseWrapper, values: ClaimValues) -> IdempotencyKey | None:
        """One call of the claim procedure: the key's record, this call's if it inserted it
        (its lock token says so), or ``None`` if a concurrent release deleted it meanwhile.

        The call's results are read to the end (the procedure's status follows its rows):
        a connection with results left unread refuses the next statement."""
        sql, params = _bound(connection) + CALL, self.claim_params(connection, values)
        if plain_connection(connection) is not None:  # on mysqlclient's connection
            row = self.fetch_row(connection, sql, params)
        else:
            with statement_cursor(connection) as cursor:
                cursor.execute(sql, params)
                row = cursor.fetchone()
                while cursor.nextset():
                    pass
        return None if row is None else loaded(connection, row)

    def has_procedure(self, connection: BaseDatabaseWrapper) -> bool:
        database = database_key(connection)
        present = _HAS_PROCEDURE.get(database)
        if present is None:
            with self.guard(), connection.cursor() as cursor:
                cursor.execute(_HAS_PROCEDURE_SQL, [CLAIM_PROCEDURE])
                present = _HAS_PROCEDURE[database] = bool(cursor.fetchone()[0])
        return present

    def take_over(
        self, connection: BaseDatabaseWrapper, pk: int, values: list[Any], token: str
    ) -> IdempotencyKey | None:
        """No ``RETURNING``: the row count says whether it took over, then its token's row."""
        statements = self.statements(connection)
        assert isinstance(statements, MySQLStatements)
        with connection.cursor() as cursor:
            cursor.execute(_bound(connection) + statements.take_over, values)
            if not cursor.rowcount:
                return None
        owned = [pk, prep("lock_token", token, connection)]
        return self.first(connection, statements.select_owned, owned)

    def limit_lock_wait(self, timeout: timedelta) -> object:
        """Keep the session's lock wait limit aside and set ``timeout``, in one round trip.

        On MariaDB nothing is sent: each claim statement carries the bound itself
        (``SET STATEMENT innodb_lock_wait_timeout = ... FOR``), which sets it for that
        statement alone and puts the session's back after it, even when it fails: two round
        trips fewer for every atomic claim. MySQL has no such clause.

        The limit is whole seconds, at least one: a wait limit below a second waits a second.
        """
        connection = self.connection
        if getattr(connection, "mysql_is_mariadb", False):
            seconds = max(1, math.ceil(timeout.total_seconds()))
            connection.__dict__[_IN_STATEMENT] = (
                f"SET STATEMENT innodb_lock_wait_timeout = {seconds} FOR "
            )
            return _InTheStatement(connection)
        with self.guard(), connection.cursor() as cursor:
            cursor.execute(limit_lock_wait_sql(timeout))
        return RESTORE_LOCK_WAIT

    def restore_lock_wait(self, previous: object) -> None:
        if isinstance(previous, _InTheStatement):
            previous.connection.__dict__.pop(_IN_STATEMENT, None)
            return
        if previous is None:
            return
        with self.guard(), self.connection.cursor() as cursor:
            cursor.execute(RESTORE_LOCK_WAIT)

    def batch_from(self, connection: BaseDatabaseWrapper) -> str:
        """The batch must walk ``expires_at``: when most rows match (a backlog of expired
        records) the optimizer prefers a full scan and a sort, which reads, and with ``FOR
        UPDATE`` locks, every matching row for a batch of a few: a second cleanup then finds
        them all locked and skips the lot."""
        q = connection.ops.quote_name
        return f"{super().batch_from(connection)} FORCE INDEX ({q(_EXPIRES_INDEX)})"

    def delete_batch(self, connection: BaseDatabaseWrapper, batch: BatchQuery) -> Batch:
        """The rows locked with ``FOR UPDATE SKIP LOCKED`` (two runs share them), then deleted
        by id; a deadlock between two runs rolls the victim's batch back whole, and it is run
        again, after a random pause.

        A batch still deadlocked after its retries ends this run as an empty one would: another
        run is deleting the same rows (on a Galera cluster ``SKIP LOCKED`` does not see another
        node's locks, so two runs through two nodes keep picking them), and the rows left are
        that run's, or the next one's. Nothing was deleted by the victim, nothing is lost.
        """
        for retry in range(_DEADLOCK_RETRIES + 1):
            try:
                return self._delete_batch(connection, batch)
            except OperationalError as exc:
                if error_code(exc) != DEADLOCK:
                    raise
            if retry < _DEADLOCK_RETRIES:
                # A random pause, growing: two runs that keep picking the same rows fall out
                # of step.
                time.sleep(random.uniform(0, 0.01 * 2**retry))
        logger.warning(
            "Cleanup batch deadlocked %s times with another writer of the same rows (another "
            "cleanup run?); this run stops here and leaves them to it.",
            _DEADLOCK_RETRIES + 1,
        )
        return Batch(0, None)

    def _delete_batch(self, connection: BaseDatabaseWrapper, batch: BatchQuery) -> Batch:
        q = connection.ops.quote_name
        table = q(IdempotencyKey._meta.db_table)
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            cursor.execute(f"{batch.select} FOR UPDATE SKIP LOCKED", [*batch.params, batch.size])
            rows = cursor.fetchall()
            if not rows:
                return Batch(0, None)
            in_ids, in_params = self.in_ids(connection, [row[0] for row in rows])
            cursor.execute(delete_locked_sql(table, q("id"), in_ids), in_params)
            deleted = cursor.rowcount
        return Batch(deleted, aware(connection, max(row[1] for row in rows)))

    def is_lock_timeout(self, exc: BaseException) -> bool:
        """A lock wait that ran out, or a deadlock whose victim was this transaction."""
        return error_code(exc) in (LOCK_WAIT_TIMEOUT, DEADLOCK)

    def is_fault(self, exc: BaseException) -> bool:
        """A code of :data:`FAULTS`, an ``InterfaceError`` (a connection already closed), or a
        connection cut at its statement's deadline (:class:`.deadlines.Late`)."""
        return isinstance(exc, (InterfaceError, deadlines.Late)) or error_code(exc) in FAULTS

    def size_query(self, table: str) -> SizeQuery:
        return SizeQuery(
            "SELECT data_length, index_length FROM information_schema.TABLES "
            "WHERE table_schema = DATABASE() AND table_name = %s",
            [table],
            "information_schema.TABLES",
        )


class _InTheStatement:
    """What :meth:`MySQLStore.limit_lock_wait` returns on MariaDB: the connection whose claim
    statements carry the bound."""

    __slots__ = ("connection",)

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.connection = connection


def _bound(connection: BaseDatabaseWrapper) -> str:
    """The ``SET STATEMENT ... FOR`` a claim statement starts with (``""``: none)."""
    return connection.__dict__.get(_IN_STATEMENT, "")  # type: ignore[no-any-return]


def limit_lock_wait_sql(timeout: timedelta) -> str:
    """Keep the session's limit in :data:`_PREVIOUS` and set ``timeout`` (whole seconds)."""
    seconds = max(1, math.ceil(timeout.total_seconds()))
    return (
        f"SET {_PREVIOUS} = @@SESSION.innodb_lock_wait_timeout, "
        f"SESSION innodb_lock_wait_timeout = {seconds}"
    )


def delete_locked_sql(table: str, id_column: str, in_ids: str) -> str:
    """Delete the rows a batch locked, by id, without waiting on anyone else's row.

    A plain ``DELETE ... WHERE id IN (...)`` may scan the whole table when it is small, and a
    scanning ``DELETE`` waits on every row another transaction holds. Here a non-locking read
    picks the ids and the join reaches each row by its primary key.
    """
    return (
        f"DELETE {table} FROM (SELECT {id_column} FROM {table} WHERE {in_ids}) AS batch "
        f"STRAIGHT_JOIN {table} ON {table}.{id_column} = batch.{id_column}"
    )
