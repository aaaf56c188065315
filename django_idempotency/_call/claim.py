"""``request.idempotency``: what a protected view knows of its own attempt."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from django_idempotency._base.durations import microseconds
from django_idempotency._base.errors import LockLost

if TYPE_CHECKING:
    from django_idempotency._call.fencing import Written
    from django_idempotency._store import ClaimHandle, StoreContract
    from django_idempotency._store.outbox import Release

__all__ = ["Claim"]

logger = logging.getLogger("django_idempotency")

_DERIVED_NAMESPACE = uuid.UUID("5b0c3c52-7e4b-4a43-9d0c-2a7c1c0f6d11")


class Holder(Protocol):
    """Whose claim it is, as :class:`Claim` reads it (an ``Identity``: typed here without
    importing it, so that the two modules make no cycle)."""

    @property
    def key(self) -> str: ...
    @property
    def scope(self) -> str: ...
    @property
    def key_hash(self) -> str: ...


@dataclass
class Claim:
    """An attempt's ownership of a record: made by the claim, fenced by ``lock_token``.

    ``attempt`` is 1 for the first attempt and grows with each takeover of a stale record;
    ``recovery_point`` and ``recovery_data`` are where the previous attempt got to.
    """

    #: The call that holds the claim: its key, scope and fingerprint, never copied here.
    identity: Holder = field(repr=False)
    #: The store's handle on the claim's record: kept and handed back, never read.
    pk: ClaimHandle
    #: The lock token (a random UUID's text), as the record and the fenced writes have it:
    #: the claim makes it as text, which costs a fraction of a ``uuid.UUID``.
    token_text: str
    attempt: int
    recovery_point: str
    recovery_data: Any
    alias: str = field(repr=False)
    lock_timeout: timedelta = field(repr=False)
    #: Set (from the renewer's thread) when a renewal found the record no longer this
    #: attempt's: taken over after its lock expired, or released by an operator.
    lock_lost: bool = field(default=False, repr=False, compare=False)
    #: Until when (``time.monotonic()``) the lock is known held: the claim's or the last
    #: renewal's start plus ``lock_timeout``. An owner's final write is tried again until then;
    #: after it, a retry may have taken the key over.
    held_until: float = field(default=0.0, repr=False, compare=False)
    #: Made inside a transaction (atomic mode, or a caller's): no other connection sees the
    #: record until that transaction commits, so none renews it or writes it again after a
    #: fault.
    uncommitted: bool = field(default=False, repr=False, compare=False)
    #: Whether the record may hold a recovery point: the attempt resumed from one, or set (or
    #: tried to set) one. Its release then keeps the record at the point.
    progressed: bool = field(default=False, repr=False, compare=False)
    #: When the record's life began, as the claim knew it without a read: microseconds since
    #: the epoch (a record it inserted), or the row as its statements left it (with a
    #: ``created_at``); ``None``: read when first needed (:attr:`life`).
    known_life: Any = field(default=None, repr=False, compare=False)
    #: The outbox's messages staged and not yet released (an ``outbox.Staged``; ``None``:
    #: none staged, and a write has nothing more to do).
    outbox: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.recovery_point:
            self.progressed = True
        if not self.held_until:
            self.held_until = time.monotonic() + self.lock_timeout.total_seconds()

    @property
    def key(self) -> str:
        """The client's idempotency key."""
        return self.identity.key

    @property
    def scope(self) -> str:
        """Whose key it is."""
        return self.identity.scope

    @property
    def key_hash(self) -> str:
        """The key as the record keeps it (SHA-256)."""
        return self.identity.key_hash

    @property
    def lock_token(self) -> uuid.UUID:
        """The lock token fencing every write of this attempt (:attr:`token_text` as a UUID)."""
        return uuid.UUID(self.token_text)

    @property
    def life(self) -> int:
        """When the record's life began (its ``created_at``, microseconds since the epoch):
        stable across every attempt on it (a takeover keeps it), new when an expired record is
        claimed again (which keeps its primary key). The outbox's message ids and the
        operation id are made from it. Known from the claim's own statements; otherwise
        (a store that did not say) read once, when first needed (one read by primary key).
        Raises :class:`~django_idempotency.LockLost` if the record is gone."""
        known = self.known_life
        if type(known) is int:
            return known
        # Imported here: see set_recovery_point.
        from django_idempotency._store.operations import created_at

        made = known.created_at if known is not None else created_at(self.alias, self.pk)
        if made is None:
            self.lock_lost = True
            self.check_held()
            raise AssertionError("check_held() raises once the lock is lost")
        self.known_life = life = microseconds(made)
        return life

    @property
    def operation_id(self) -> str:
        """The record's operation id: stable across every attempt, unguessable,
        never the key. Hand it to the background task that finishes the work, which calls
        :func:`~django_idempotency.complete_operation` with it. Made from
        :attr:`life` when first read."""
        made = self.__dict__.get("_operation_id")
        if made is None:
            from django_idempotency._call.operations import make_id  # see set_recovery_point
            from django_idempotency._store.operations import name_of

            # A Redis record's pk is a number of this process: its operation's own name.
            made = make_id(name_of(self.alias, self.pk), self.scope, self.key_hash, self.life)
            self.__dict__["_operation_id"] = made
        return str(made)

    @property
    def operation_url(self) -> str:
        """The operation's status URL (a path, ``GET``), from ``django_idempotency.urls``:
        the ``Location`` of a ``202 Accepted``. Raises ``ImproperlyConfigured`` when the
        URLconf does not include them."""
        from django_idempotency._call.operations import status_url  # see set_recovery_point

        return status_url(self.operation_id)

    def held_for(self, since: float) -> None:
        """The lock was pushed forward by a write started at ``since`` (monotonic)."""
        self.held_until = max(self.held_until, since + self.lock_timeout.total_seconds())

    @property
    def is_takeover(self) -> bool:
        return self.attempt > 1

    def check_held(self) -> None:
        """Raise :class:`~django_idempotency.LockLost` if the attempt is known to
        have lost its record (:attr:`lock_lost`)."""
        if self.lock_lost:
            raise LockLost(
                f"The lock on idempotency record {self.pk} was lost (taken over or released); "
                "stop: another attempt owns the key."
            )

    def set_recovery_point(self, name: str, data: Any = None) -> None:
        """Record that the view got as far as ``name`` (with JSON ``data``) and renew the lock.

        In two-phase mode this commits at once, so a retry that takes over after a crash, or
        after the view raised, resumes from here. A database fault is ridden out as for the
        result: the write is tried again on a new connection while the lock holds. Raises
        :class:`~django_idempotency.LockLost` when another attempt has taken the record over
        (stop, the new owner is doing the work), and
        :class:`~django_idempotency.StoreUnavailable` when the database did not answer in
        time; a protected view that lets either propagate answers ``409`` or ``503``.
        Raises :class:`ValueError` before any write for ``data`` holding a NUL (U+0000) in a
        string or key, on every store: PostgreSQL's ``jsonb`` cannot keep one.
        """
        # Imported here: Claim is a name of the package, importable before Django is set up
        # (a type hint's import), and these read the model's fields.
        from django_idempotency._store.limits import MAX_RECOVERY_POINT

        self.check_held()
        if len(name) > MAX_RECOVERY_POINT:
            raise ValueError(f"A recovery point name is at most {MAX_RECOVERY_POINT} characters.")
        check_recovery_data(name, data)
        self.save_point(name, data)
        logger.debug(
            "Idempotency record %s: recovery point %r.",
            self.pk,
            name,
            extra=self.facts("recovery_point"),
        )
        self.recovery_point = name
        self.recovery_data = data

    def save_point(self, name: str, data: Any) -> None:
        """Write a recovery point as durably as the result (:func:`.fencing.fenced_write`):
        tried again on a new connection while the lock holds, and confirmed by the lock token
        when the reply to the write that applied it was lost. Raises
        :class:`~django_idempotency.LockLost` when the record is no longer the attempt's, and
        :class:`~django_idempotency.StoreUnavailable` when the database did not answer in time,
        never a driver's error: a view's answer is then a ``409`` or a ``503``, and the record
        is kept at its last recovery point for the retry.

        On the thread's connection inside a transaction (the point written with the view's own
        writes, docs/consumers.rst) a fault is raised at once: the transaction is lost with it,
        and a point written on another connection would claim work that was rolled back.
        """
        # Imported here, as in set_recovery_point: the store reads the model's fields.
        from django_idempotency._call import outbox
        from django_idempotency._call.fencing import Written
        from django_idempotency._store import using

        store = using(self.alias)
        self.progressed = True  # applied or not, from now on the record may hold it
        since = time.monotonic()
        messages = None if self.outbox is None else outbox.release(self)
        written = self._write_point(store, name, data, messages)
        if written is Written.REFUSED:
            raise LockLost(f"The lock on idempotency record {self.pk} was taken over.")
        outbox.released(self, store, messages)
        self.held_for(since)

    def _write_point(
        self, store: StoreContract, name: str, data: Any, messages: Release | None
    ) -> Written:
        """The point's fenced write, the outbox's staged ``messages`` released with it; a
        database error the view sees as the store's refusal (a ``503``), never a driver's."""
        from django.db import DatabaseError

        from django_idempotency._call.fencing import fenced_write

        try:
            return fenced_write(
                store,
                self,
                lambda own, bound: store.save_recovery_point(
                    self.pk,
                    self.token_text,
                    name,
                    data,
                    self.lock_timeout,
                    connection=own,
                    bound=bound,
                    release=messages,
                ),
                atomic=store.in_transaction(),
                applied=lambda own: store.has_recovery_point(self.pk, self.token_text, name, own),
            )
        except DatabaseError as exc:
            logger.warning(
                "Idempotency record %s: could not save recovery point %r (%s).", self.pk, name, exc
            )
            raise store.refusal(exc) from exc

    def enqueue(self, task: Any, /, *args: Any, name: str | None = None, **kwargs: Any) -> str:
        """Stage a message for ``task`` (a Celery task, or a ``django.tasks`` task on Django
        6.0+) with JSON-serialisable ``args`` and ``kwargs``; nothing is sent now.

        The message is released with the attempt's result (in the same transaction), or with
        the next recovery point, and then delivered at least once (``docs/outbox.rst``);
        nothing staged by an attempt that raises, is released (a 5xx), loses its lock or whose
        result is not stored is ever sent. Returns the message's id, which the consumer gets
        (Celery's ``task_id``): derived from the record and ``name`` (default: the message's
        position since the last recovery point), it is the same when a takeover stages the
        message again, which then releases nothing new. ``TypeError`` for anything but a
        task, or arguments that do not serialise; :class:`~django_idempotency.LockLost`
        once the attempt is known to have lost its record; ``django.db.NotSupportedError``,
        before anything is staged, on a store that has no outbox (:attr:`serves_outbox`).
        """
        from django_idempotency._call.outbox import stage  # see set_recovery_point

        self.check_held()
        self._serves_outbox()
        return stage(self, task, args, name, kwargs)

    @property
    def serves_outbox(self) -> bool:
        """Whether :meth:`enqueue` can stage a message on the claim's store: false on a store
        without an outbox (a store of your own that has none). A view may ask it before its
        writes, since :meth:`enqueue` on such a store raises after them."""
        return self._outbox_refusal() is None

    def _outbox_refusal(self) -> str | None:
        """Why the claim's store has no outbox (the contract's ``outbox_refusal``)."""
        from django_idempotency._store import using

        return using(self.alias).outbox_refusal()

    def _serves_outbox(self) -> None:
        """``NotSupportedError`` (the contract's refusal of a capability a store has not) when
        the claim's store cannot release messages with its record, in its class's words."""
        why = self._outbox_refusal()
        if why:
            from django.db import NotSupportedError

            from django_idempotency._conf import stores

            kind = stores.kind_of(self.alias)
            store = kind.describe(self.alias) if kind is not None else repr(self.alias)
            raise NotSupportedError(
                f"enqueue() cannot stage a message on the {store}: {why}. Give the view or "
                'function a store with an outbox (store="database", or a Redis store), or '
                "ask request.idempotency.serves_outbox before the view's writes."
            )

    def facts(self, outcome: str) -> dict[str, Any]:
        """The ``extra`` of a log line about this claim (:func:`.telemetry.log_facts`)."""
        from django_idempotency._call.telemetry import log_facts  # see set_recovery_point

        return log_facts(outcome, self.key_hash, self.scope, self.attempt, self.token_text)

    def derived_key(self, purpose: str = "") -> str:
        """A UUID for a downstream service's own idempotency key, stable across every attempt.

        It depends only on the scope, the key and ``purpose``, so a retried or taken-over attempt
        hands the payment provider the same key and cannot charge twice downstream. Raises
        :class:`~django_idempotency.LockLost` once lock renewal found the record
        taken: the new owner makes the downstream call.
        """
        self.check_held()
        return str(uuid.uuid5(_DERIVED_NAMESPACE, f"{self.scope}\0{self.key_hash}\0{purpose}"))


def check_recovery_data(name: str, data: Any) -> None:
    """Refuse recovery data no store keeps exactly, on every store and without a key alike
    (a view behaves the same with and without one): a NUL, which PostgreSQL's jsonb refuses."""
    if _holds_nul(data):
        raise ValueError(
            f"set_recovery_point({name!r}): its data holds a NUL character (U+0000), which "
            "PostgreSQL's jsonb cannot keep; encode it (base64, say) before saving it."
        )


def _holds_nul(data: Any) -> bool:
    """Whether JSON ``data`` holds a NUL in a string or a key, however deep."""
    if isinstance(data, str):
        return "\x00" in data
    if isinstance(data, dict):
        return any(_holds_nul(key) or _holds_nul(value) for key, value in data.items())
    if isinstance(data, (list, tuple)):
        return any(_holds_nul(item) for item in data)
    return False
