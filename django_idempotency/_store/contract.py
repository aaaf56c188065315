"""The store contract: what the engine, the operators' actions and the testing helpers may ask
of a store (:func:`django_idempotency._store.using`), and nothing else.

Written in the spirit of Django's ``BaseCache`` and kombu's virtual transport: a small core every
store must provide (each raises ``NotImplementedError`` here), the rest given a default that
says what a store without it means (no transaction to share, no table to scan, no fault to ride
out), or written in terms of the core. What a store can do is asked of its :class:`StoreFeatures`
(as Django's ``BaseDatabaseFeatures``), never of its type, its alias or a connection it may not
have: the database's stores (:class:`.base.Store`) and the Redis store
(:class:`.redis.store.RedisStore`) each subclass :class:`StoreContract`, and so may another.

A claim's ``pk`` is a :data:`ClaimHandle`: the store's own handle on the claim's record, which
callers keep and hand back, never read; a final write (the result, the unlock, the release)
spends it, whatever its outcome. The values that cross the contract (:class:`Lock`,
:class:`StoredResponse`, :class:`Batch`, :class:`Backlog`) are defined here, beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, NewType, TypeVar, cast

from django.db import DatabaseError, NotSupportedError

from django_idempotency._base import rules
from django_idempotency._base.errors import LockWaitTimeout, StoreUnavailable
from django_idempotency._conf.values import shown_store
from django_idempotency._store import sealing

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from django_idempotency.models import IdempotencyKey

T = TypeVar("T")

#: The status of a stored response that hands the work on: its operation is still running.
ACCEPTED = 202
#: The recovery point of a record whose operation's task set its progress. An operation's
#: progress is kept as its record's recovery point, which no one reads once the request
#: answered its ``202`` (a completed record is replayed, never resumed), and which a claim of
#: an expired record resets: no column, and no new life shows an old life's progress.
PROGRESS = "operation-progress"


@dataclass(frozen=True)
class Operation:
    """What the status endpoint and ``complete_operation()`` read of a record. ``pk``: the
    database's primary key, or a Redis operation's name (:mod:`.redis.operations`), which its
    id's MAC covers as it covers a primary key; ``alias``: its store's (``""``: the one the
    caller names)."""

    pk: int | str
    scope: str
    key_hash: str
    status: str
    response_status: int | None
    response_headers: Any
    response_body: bytes | None
    created_at: datetime
    expires_at: datetime
    unlock_at: datetime | None = None
    recovery_point: str = ""
    recovery_data: Any = None
    alias: str = ""

    @property
    def progress(self) -> Any:
        """What its task last set with ``set_operation_progress()``; ``None``: nothing yet."""
        if self.recovery_point == PROGRESS and isinstance(self.recovery_data, dict):
            return self.recovery_data.get("progress")
        return None

    @property
    def running(self) -> bool:
        """Its request still runs, or it answered ``202`` and the work goes on elsewhere."""
        return self.status == rules.PROCESSING or self.response_status == ACCEPTED

    def stalled(self, now: datetime) -> bool:
        """Its request's owner is gone: the record is stale (its lock lapsed, no attempt holds
        it), so it never finishes unless the original request is retried, which resumes it."""
        return rules.STALE.holds(self, now)

    def expired(self, now: datetime) -> bool:
        return self.expires_at <= now


#: A claim's handle (``Claim.pk``): the store's own name for the claim's record (the database's
#: row id, the Redis store's number for a live claim of this process). Kept and handed back:
#: a type of its own, so that no caller takes it for a row's id (nothing at run time).
ClaimHandle = NewType("ClaimHandle", int)


class Taken(NamedTuple):
    """A message a relay took (a batch's), of any store's outbox: what it sends, and the
    :attr:`key` the store's ``mark_sent`` and ``mark_failed`` name it by (the database's: its
    message id; the Redis store's: its record's key). One type, so the relay reads either."""

    key: str
    message_id: str
    engine: str
    task: str
    arguments: str
    attempts: int


class Lock(NamedTuple):
    """What a waiter polls: the record's status and when its lock expires."""

    status: str
    unlock_at: datetime | None


@dataclass(frozen=True)
class Batch:
    """One batch of :meth:`StoreContract.delete_expired_batch`."""

    deleted: int
    #: The largest ``expires_at`` seen: the next batch starts there (``None``: nothing left).
    last_expires_at: datetime | None


class Backlog(NamedTuple):
    """What is left to deliver: pending messages, failed ones, the oldest undelivered one's
    release time (``None``: none)."""

    pending: int
    failed: int
    oldest: datetime | None


@dataclass(frozen=True)
class StoredResponse:
    """A final result as the record keeps it: a view's response, or a function's result.

    A function's result has no status and no headers (``response_status`` NULL, the headers
    ``[]``): it is no HTTP response. It was once stored shaped as one, status ``200``
    with the serializer's ``Content-Type``; a record stored so is read as it is, since a
    function's replay reads the body alone (and an operator's ``failed`` from the status).
    No migration: ``response_status`` has always been nullable.
    """

    #: The response's status code; ``None``: a function's result.
    status: int | None
    headers: list[list[str]]
    #: ``None``: the body was over ``MAX_BODY_SIZE`` (or ``MAX_STORED_BODY_SIZE``), not kept
    body: bytes | None
    #: Its own TTL (``store_for()``), counted from when it is stored; ``None``: ``expires_at``
    #: stays as the claim set it.
    ttl: timedelta | None = None
    #: The scope and key hash of the record it is stored in: encrypted, it opens for that
    #: record only (:mod:`.sealing`). ``None``: for none (encrypted so, it opens nowhere).
    owner: tuple[str, str] | None = None
    #: The headers and body columns' values: compressed, encrypted (:mod:`.._sealing`). Made
    #: with it, once: ``MAX_STORED_BODY_SIZE`` reads them before the store writes them (and a
    #: ``cached_property`` would cost a lock on every read).
    sealed: tuple[Any, bytes | None] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sealed", sealing.seal(self.headers, self.body, self.owner))


@dataclass(frozen=True)
class StoreFeatures:
    """What a store can do, asked by the code every store shares instead of the store's type
    (as Django's ``BaseDatabaseFeatures``). The defaults are a store that keeps nothing in the
    view's database: a store sets those it differs on (:func:`dataclasses.replace`)."""

    #: Whether the claim can run inside the view's transaction (atomic mode).
    supports_atomic: bool = False
    #: Whether the store's writes can join the transaction the calling thread is in (a recovery
    #: point written with the view's own writes; the outbox released with the result).
    shares_transaction: bool = False
    #: Whether the store's own writes ride a fault out within the bound they are given (the
    #: Redis store: a script is tried again on its client's pool): an owner's fenced write then
    #: gives it all the time its lock has left, not one statement's share.
    rides_out_faults: bool = False
    #: Whether the store is a server reached over a network (not a file): a connection made
    #: again after a fault is given a connect timeout.
    has_server: bool = True
    #: Whether writers take turns on the whole store (SQLite): a renewal may wait for the lock
    #: the owners' writes hold, and the outbox's batch has no row lock to skip.
    one_writer: bool = False
    #: Whether the store keeps every scope exactly, whatever its session's and table's character
    #: sets (MySQL and MariaDB may fold or refuse one: check E034, :mod:`.charsets`).
    keeps_every_scope: bool = True
    #: Whether a committed transaction can wake a waiting connection (``LISTEN``/``NOTIFY``):
    #: the outbox's relays wait for a release rather than poll.
    notifies: bool = False
    #: Whether the bound atomic mode's claim puts on its lock wait outlives the transaction
    #: (a MySQL session setting): it is put back whatever happens.
    lock_wait_outlives_transaction: bool = False
    #: Whether the store's records are the app's table (the operators' queries, the admin).
    keeps_table: bool = False


def _missing(member: str) -> NotImplementedError:
    return NotImplementedError(f"subclasses of StoreContract must provide {member}()")


class StoreContract:
    """A store of idempotency records on one alias (see the module's docstring).

    The core (the claim, its fenced writes and the status poll) must be provided; every other
    member has a default, overridden where the store has more to say.
    """

    #: The store's name for ``connection.vendor``-like keys and for people.
    vendor = ""
    name = ""
    #: The only ``isolation_level`` option a claim in atomic mode works under (``None``: any).
    isolation_level: str | None = None
    features = StoreFeatures()
    #: How the store's records go by themselves, as the operators' commands say (``""``: they
    #: say nothing; a store that says it has nothing for ``idempotency_cleanup`` to delete).
    expiry = ""
    #: A key of ``idempotency_stats --json`` that lists this kind's census besides ``stores``
    #: (the Redis store's ``redis_stores``, kept for the monitors that read it); ``""``: none.
    stats_group = ""
    #: The alias the store was made for (:func:`django_idempotency._store.using`).
    alias: str

    # -- what the registry asks of the class (:mod:`.._conf.stores`) ---------------------------

    @classmethod
    def open(cls, alias: str) -> StoreContract:
        """The store of ``alias``, made once per alias by :func:`django_idempotency._store.using`
        (a store that needs more than its alias says so here)."""
        return cls(alias)  # type: ignore[call-arg]

    @classmethod
    def validate(cls, value: str, name: str) -> None:
        """``ValueError`` (or ``TypeError``) for a value naming this store (``STORE``, a view's
        ``store``) that can never work, in words without its secrets: refused at startup (E060),
        not at the first request. The registry already matched its form."""

    @classmethod
    def describe(cls, alias: str) -> str:
        """How commands name the store of ``alias``: its kind and its name without secrets."""
        return f"{cls.name} store {shown_store(alias)!r}"

    # -- the core ------------------------------------------------------------------------------

    def claim(
        self,
        identity: Any,
        *,
        ttl: timedelta,
        lock_timeout: timedelta,
        token: str | None = None,
        bound: float | None = None,
    ) -> Any:
        """Claim ``identity``'s key: its new claim (``identity.claimed(...)``), the record found
        (a replay, a mismatch, one in progress), or ``None`` to claim again (a race)."""
        raise _missing("claim")

    def peek_status(self, scope: str, key_hash: str, bound: float | None = None) -> Lock | None:
        """The key's status and when its lock lapses (a waiter's poll); ``None``: no record."""
        raise _missing("peek_status")

    def store_response(
        self,
        pk: ClaimHandle,
        token: Any,
        stored: StoredResponse,
        *,
        stale_at: datetime | None = None,
        connection: Any = None,
        bound: float | None = None,
        release: Any = None,
    ) -> bool:
        """Finish the claim with its result, fenced by ``token``; ``False``: no longer its own."""
        raise _missing("store_response")

    def save_recovery_point(
        self,
        pk: ClaimHandle,
        token: Any,
        name: str,
        data: Any,
        lock_timeout: timedelta,
        *,
        connection: Any = None,
        bound: float | None = None,
        release: Any = None,
    ) -> bool:
        """Write a recovery point and push the lock forward, fenced by ``token``."""
        raise _missing("save_recovery_point")

    def unlock(
        self, pk: ClaimHandle, token: Any, *, connection: Any = None, bound: float | None = None
    ) -> bool:
        """Let go of the claim's lock, its record and recovery point kept (a retry resumes)."""
        raise _missing("unlock")

    def release(
        self,
        pk: ClaimHandle,
        token: Any,
        *,
        stale_at: datetime | None = None,
        connection: Any = None,
        bound: float | None = None,
    ) -> bool:
        """Delete the claim's record (a failure the client may retry as a first request)."""
        raise _missing("release")

    def renew(
        self,
        leases: Sequence[tuple[ClaimHandle, Any]],
        lock_timeout: timedelta,
        bound: float | None = None,
    ) -> set[tuple[ClaimHandle, Any]]:
        """Push the locks of many claims forward; the leases still held."""
        raise _missing("renew")

    def read(self, scope: str, key_hash: str) -> IdempotencyKey | None:
        """The key's record, as a claim that found it would read it (tests, operators)."""
        raise _missing("read")

    def created_at(self, pk: ClaimHandle) -> datetime | None:
        """When a claim's record began (its operation's id); ``None``: no such record."""
        raise _missing("created_at")

    # -- errors --------------------------------------------------------------------------------

    def is_fault(self, exc: BaseException) -> bool:
        """Whether a call failed for its connection or server, to be tried on a new connection
        (a store that rides faults out itself has none left to try)."""
        return False

    def is_contention(self, exc: BaseException) -> bool:
        """Whether a write failed only because another writer held a lock it needed."""
        return False

    def is_transient(self, exc: BaseException) -> bool:
        """Whether an error says the store is unavailable for now (a ``503``)."""
        return self.is_contention(exc) or self.is_fault(exc)

    def expected_fault(self, exc: BaseException) -> bool:
        """Whether a refusal is an outage the store knows, logged on one line."""
        return False

    def misconfigured(self, exc: BaseException) -> str | None:
        """Why ``exc`` is a misconfiguration no retry mends (a refused password), in words
        without secrets; ``None``: none the store knows (a long-running loop, the relay,
        says it at ``ERROR`` once instead of as an outage)."""
        return None

    def faulted(self, exc: BaseException) -> None:
        """After a call's error: what the store does about a fault (drain a pool)."""

    def refusal(self, exc: BaseException) -> LockWaitTimeout | StoreUnavailable:
        """What :meth:`guard` raises for ``exc`` (``raise store.refusal(exc) from exc``)."""
        return StoreUnavailable(str(exc))

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Translate the store's database errors into the app's own (:meth:`refusal`)."""
        try:
            yield
        except DatabaseError as exc:
            raise self.refusal(exc) from exc

    # -- the calling thread's connection ---------------------------------------------------------

    def bounded(self, connection: Any, seconds: float, statement: Callable[[], T]) -> T:
        """Run ``statement()`` (on ``connection``, where the store has connections) within
        ``seconds``; a store that bounds each call itself just runs it."""
        return statement()

    def bounded_here(self, seconds: float, statement: Callable[[], T]) -> T:
        """:meth:`bounded` on the calling thread's own connection."""
        return self.bounded(None, seconds, statement)

    def in_transaction(self) -> bool:
        """Whether the calling thread's work on the store is inside a transaction: a write
        then is part of it, and raised at once on an error."""
        return False

    def reconnect_thread(self, exc: BaseException) -> bool:
        """Close the calling thread's connection after a fault ``exc`` left it unusable,
        outside any transaction, so a claim may be made again on a new one; ``False``: not so
        (nothing was closed)."""
        return False

    def drop_thread_connection(self) -> None:
        """After a fault: close the thread's connection unless it is in a transaction, so the
        thread's next query makes a new one."""

    def idle_thread(self) -> None:
        """The calling thread has nothing more to do for now (the outbox's sender, its queue
        empty): its connection goes back if unusable or obsolete, as at a request's end; a
        store whose connections go back after each call has nothing to give back."""

    def narrow_charsets(self, seconds: float) -> Any | None:
        """What folds or refuses a scope on the store's connection (``charsets.known_narrow``),
        asked within ``seconds``; ``None``: nothing (:attr:`StoreFeatures.keeps_every_scope`)."""
        return None

    # -- atomic mode -------------------------------------------------------------------------------

    def atomic(self, wait: timedelta) -> AbstractContextManager[Any]:
        """Atomic mode's transaction (:attr:`StoreFeatures.supports_atomic`)."""
        raise NotSupportedError(f"The {self.name} store has no atomic mode.")

    def read_finished(self, identity: Any, bound: float) -> Any:
        """Atomic mode: the key's finished record, read before the transaction opens."""
        return None

    def limit_lock_wait(self, timeout: timedelta) -> object:
        """Bound atomic mode's claim's wait for another transaction's row; what to put back."""
        return None

    def restore_lock_wait(self, previous: object) -> None:
        """Put back what :meth:`limit_lock_wait` replaced."""

    def in_nested_transaction(self) -> bool:
        """Whether the innermost atomic block is a savepoint inside a caller's transaction."""
        return False

    def hold(self, scope: str, key_hash: str) -> None:
        """An atomic attempt of this process claimed its key (see :meth:`holds`)."""

    def let_go(self, scope: str, key_hash: str) -> None:
        """That attempt's transaction ended."""

    def holds(self, scope: str, key_hash: str) -> bool:
        """Whether an atomic attempt of this process holds the key now."""
        return False

    def finished(self, pk: ClaimHandle, token: Any, connection: Any) -> bool:
        """Whether a result write whose reply was lost was applied (read back by ``token``)."""
        return False

    def has_recovery_point(self, pk: ClaimHandle, token: Any, name: str, connection: Any) -> bool:
        """Whether a recovery point write whose reply was lost was applied."""
        return False

    # -- what the checks and the admin ask ------------------------------------------------------

    def converts_dates_to(self, zone: str) -> bool:
        """Whether the store converts its datetimes to the time zone ``zone``."""
        return True

    def eviction_stall(self) -> timedelta | None:
        """How long a cluster's surviving nodes stall writes evicting a dead one."""
        return None

    def ping(self) -> None:
        """Raise (the store's own error, said in ``check --deploy``'s E062) unless the store
        answers now; ``ImproperlyConfigured`` where it answers, but refuses what it is set
        to use (a database number its server has not). The default, for a store without a
        server (records in this process's memory), asks nothing: such a store always answers."""

    def eviction_policies(self) -> dict[str, str]:
        """The policy by which each of the store's servers frees memory, by server (``""``:
        its only one), to tell one that evicts records (E063); empty: none ever evicts a
        record (the default: records leave by their expiry or the cleanup only). Raises
        where the server will not say (W062)."""
        return {}

    def unpersisted(self) -> list[str]:
        """The store's servers (``""``: its only one) that acknowledge writes a restart or a
        crash loses (W060); empty: none, the default (a store without a server, or one that
        cannot tell). Raises where the server will not say (nothing is warned)."""
        return []

    def unbounded_pool(self) -> str | None:
        """The name of what can hold a call for good on a frozen server: a pool whose
        connections have no socket timeout and that the store cannot bound call by call
        (W061); ``None``: every call is bounded (the default)."""
        return None

    @property
    def client(self) -> Any:
        """The store's client of its server (``None``: it has none of its own)."""
        return None

    @property
    def bounds_each_call(self) -> bool:
        """Whether each call sets its own timeouts."""
        return True

    # -- the operators' records ------------------------------------------------------------------

    def expire(self, scope: str, key_hash: str) -> IdempotencyKey | None:
        """Expire the key's record now, as its TTL would; the record (``None``: none)."""
        raise _missing("expire")

    def release_stale(self, record: IdempotencyKey) -> bool:
        """An operator's release of a stale ``record`` (as :meth:`read` or :meth:`browse` gave
        it): delete it so the client's retry runs afresh. Fenced as the owner's own writes are:
        only while it is still ``processing`` under the lock token read and
        :data:`~.._base.rules.STALE` (its lock lapsed); ``False``: finished, taken over, renewed
        or gone meanwhile. An owner alive after all then has its writes refused."""
        raise NotSupportedError(f"The {self.name} store cannot release a stale record.")

    def fail_stale(self, record: IdempotencyKey, stored: StoredResponse) -> bool:
        """An operator's failure of a stale ``record``: ``stored`` becomes its final response
        (retries replay it), fenced as :meth:`release_stale`; the owner's result write, if it
        comes after all, is refused (``False``), never taken for its own."""
        raise NotSupportedError(f"The {self.name} store cannot fail a stale record.")

    def records_of(self, key_hash: str) -> list[IdempotencyKey]:
        """The key's records in every scope, oldest first: ``testing.key_records`` and the
        admin's search read a key through it. A store that cannot says so: an empty list would
        pass for a key it never saw."""
        raise NotSupportedError(f"The {self.name} store cannot list a key's records (records_of).")

    def browse(
        self, cursor: str, *, size: int, status: str | None = None
    ) -> tuple[list[IdempotencyKey], str | None]:
        """A page of the store's records (``status``'s only, if given) from ``cursor`` (``"0"``:
        the first), about ``size`` of them, and the next page's cursor (``None``: the last page):
        the admin's list of a store that keeps no table (a table's is its ``ModelAdmin``)."""
        raise NotSupportedError(f"The {self.name} store's records are listed by its table's admin.")

    def count(self) -> int:
        """How many records the store holds."""
        raise _missing("count")

    def census(self, stuck_after: timedelta = timedelta(hours=1)) -> dict[str, Any]:
        """The store's records by status, its stale ones, and its operations running and stuck
        (silent for ``stuck_after``), where it can say (``None``)."""
        unknown = dict.fromkeys(("by_status", "stale", "operations_running", "operations_stuck"))
        return {"total": self.count(), **unknown}

    # -- operations: a record read and completed as an operation (:mod:`.operations`) ----------

    def operation_name(self, pk: ClaimHandle) -> int | str:
        """What a live claim's operation id is made of (its operation's name from then on)."""
        raise NotSupportedError(f"The {self.name} store keeps no operations.")

    def found_operation(self, record: Any) -> tuple[int | str, datetime] | None:
        """The operation name and life of another call's record its claim found (a
        duplicate's ``202``); ``None``: it has none."""
        raise NotSupportedError(f"The {self.name} store keeps no operations.")

    def read_operation(self, name: int | str) -> Operation | None:
        """The operation ``name`` names (``None``: none)."""
        raise NotSupportedError(f"The {self.name} store keeps no operations.")

    def of_scopes(
        self, scopes: set[str], *, before: int | None, limit: int, state: str | None
    ) -> list[Operation]:
        """The scopes' unexpired operations, newest first, at most ``limit``, before the
        cursor ``before`` (:func:`.operations.cursor`), in ``state`` if given."""
        raise NotSupportedError(f"The {self.name} store keeps no operations.")

    def stuck(self, older_than: timedelta) -> QuerySet[IdempotencyKey] | list[IdempotencyKey]:
        """Operations handed on with no word for ``older_than``, oldest word first."""
        raise NotSupportedError(f"The {self.name} store keeps no operations.")

    def complete_operation(self, operation: Operation, stored: StoredResponse) -> bool:
        """Replace the operation's stored ``202`` by its final response, once."""
        raise NotSupportedError(f"The {self.name} store keeps no operations.")

    def set_progress(self, operation: Operation, name: str, data: Any) -> bool:
        """Set the operation's progress (its recovery point ``name``), fenced by its ``202``."""
        raise NotSupportedError(f"The {self.name} store keeps no operations.")

    # -- the outbox's relay ---------------------------------------------------------------------
    # A relay's pass (:mod:`.._ops.relay`): the thread's connection made (:meth:`connect_thread`),
    # then batches taken, each within a bound (:meth:`bounded_here`), their messages marked by
    # their :attr:`~.outbox.Taken.key`.

    def outbox_refusal(self) -> str | None:
        """Why the store cannot serve the outbox (``None``: it can): a store that has none
        says so (``enqueue`` refused before staging, the relay refused), and one that keeps
        an outbox returns ``None``."""
        return f"the {self.name} store has no outbox"

    def connect_thread(self, seconds: float) -> None:
        """Make the calling thread's connection if it has none, each attempt bounded by
        ``seconds`` (:mod:`.connecting`); a store without connections of its own has nothing
        to make."""

    def backlog(self) -> Any:
        """The outbox's pending and failed messages, and its oldest undelivered release
        (:class:`Backlog`): none, where the store has no outbox (the stats)."""
        return Backlog(0, 0, None)

    def failed_messages(self) -> list[Any]:
        """The outbox's messages failed for good, oldest release first."""
        raise NotSupportedError(f"The {self.name} store has no outbox.")

    def resend(self, keys: Sequence[Any]) -> int:
        """Make failed messages (their ids) pending and due now: how many were still failed."""
        raise NotSupportedError(f"The {self.name} store has no outbox.")

    def take(self, size: int, lease: timedelta) -> Sequence[Taken]:
        """Lease up to ``size`` messages due now (a relay's batch), in the order released."""
        raise NotSupportedError(f"The {self.name} store has no outbox.")

    def mark_sent(self, keys: Sequence[Any], *, counted: bool) -> int:
        """Mark taken messages (their keys) sent."""
        raise NotSupportedError(f"The {self.name} store has no outbox.")

    def mark_failed(self, key: Any, error: str, retry_at: datetime | None, *, counted: bool) -> int:
        """Record a failed send: tried again at ``retry_at``, or failed for good (``None``)."""
        raise NotSupportedError(f"The {self.name} store has no outbox.")

    def message_key(self, scope: str, key_hash: str, message_id: str) -> Any:
        """How :meth:`mark_sent` names a message the record ``(scope, key_hash)`` released."""
        raise NotSupportedError(f"The {self.name} store has no outbox.")

    def erase_scope(self, scope: str, *, dry_run: bool = False) -> tuple[int, int]:
        """Delete the scope's finished records now: (deleted, in progress). A store keeping the
        app's table is erased in batches (:meth:`erase_batch`) by the caller instead."""
        raise NotSupportedError(f"The {self.name} store erases a scope in batches.")

    def erase_batch(self, scope: str, *, size: int) -> int:
        """Delete up to ``size`` finished records of ``scope``; how many."""
        raise NotSupportedError(f"The {self.name} store erases a scope at once.")

    def stale_records(self, *, older_than: timedelta = timedelta(0)) -> QuerySet[IdempotencyKey]:
        """The table's records stuck in ``processing``: none, where the store keeps no table."""
        return self._no_records()

    def expired_records(self, *, now: datetime | None = None) -> QuerySet[IdempotencyKey]:
        """The table's records cleanup would delete: none, where the store keeps no table (its
        records expire by themselves)."""
        return self._no_records()

    def delete_expired_batch(
        self,
        *,
        now: datetime,
        batch_size: int,
        after: datetime | None = None,
        pks: list[int] | None = None,
    ) -> Batch:
        """Delete a batch of expired records: nothing, where they expire by themselves."""
        return Batch(0, None)

    def table_size(self) -> tuple[int | None, int | None, str]:
        """``(table bytes, index bytes, how they were measured)``: unknown without a table."""
        return None, None, "unknown"

    def _no_records(self) -> QuerySet[IdempotencyKey]:
        from django_idempotency.models import IdempotencyKey

        return IdempotencyKey.objects.none()


#: What every store must write: the members whose default raises ``NotImplementedError``
#: (docs/stores.rst lists them; ``tests/test_store_contract.py`` checks both lists). Atomic
#: mode (``atomic()``) and the table's batches (``erase_batch()``) are the database's stores'
#: own: no capability of another store (atomic mode is refused on any other).
REQUIRED = (
    *("claim", "peek_status", "store_response", "save_recovery_point", "unlock", "release"),
    *("renew", "read", "created_at", "expire", "count"),
)


class Capability(NamedTuple):
    """An optional part of the contract: the members a store overrides to have it, and what a
    store without it costs (the list of docs/stores.rst, checked against this one)."""

    name: str
    members: tuple[str, ...]
    without: str


CAPABILITIES = (
    Capability(
        "erasure",
        ("erase_scope",),
        "erasure (``erase_scope()``, ``idempotency_cleanup --scope``) refused for the whole "
        "project while the store is named, before any store erases anything (the database's "
        "stores erase their table by ``erase_batch`` instead)",
    ),
    Capability(
        "outbox",
        (
            *("outbox_refusal", "backlog", "take", "mark_sent", "mark_failed", "message_key"),
            *("failed_messages", "resend"),
        ),
        "``enqueue`` raises ``NotSupportedError`` before staging (a claim's ``serves_outbox`` "
        "is false), ``idempotency_relay`` refuses the store, its outbox figures in "
        "``idempotency_stats --json`` are ``null``",
    ),
    Capability(
        "operations",
        (
            *("operation_name", "found_operation", "read_operation", "of_scopes", "stuck"),
            *("complete_operation", "set_progress"),
        ),
        'operations refused (a view with ``in_progress="accepted"`` answers ``500 '
        "idempotency-misconfigured``, a claim's ``operation_id`` raises "
        "``NotSupportedError``); ``idempotency_recover --operations`` finds none stuck",
    ),
    Capability(
        "release_stale",
        ("release_stale",),
        "the admin offers no *release stale* action on its records",
    ),
    Capability(
        "fail_stale",
        ("fail_stale",),
        "the admin offers no *mark stale as failed* action on its records",
    ),
    Capability(
        "browse",
        ("browse",),
        "the admin's list of its records says it does not list them (its search still works)",
    ),
    Capability(
        "records_of",
        ("records_of",),
        "``testing.key_records()`` and the admin's search refused in words",
    ),
    Capability(
        "census",
        ("census",),
        "``idempotency_stats`` counts its records (``count()``) and shows its other figures "
        "(by status, stale, operations) as *unknown* (``null``)",
    ),
)


def provides(store: object, capability: str) -> bool:
    """Whether ``store`` (a store, or its class: the registry's) overrides each member of
    ``capability`` (:data:`CAPABILITIES`); a store's outbox also needs its
    ``outbox_refusal()`` to say none (asked of an instance only: it may ask its server)."""
    kind = store if isinstance(store, type) else type(store)
    (found,) = (each for each in CAPABILITIES if each.name == capability)
    for name in found.members:
        member = getattr(kind, name, None)
        if member is None or member is getattr(StoreContract, name):
            return False
    if capability != "outbox" or isinstance(store, type):
        return True
    return cast(StoreContract, store).outbox_refusal() is None
