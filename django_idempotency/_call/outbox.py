"""The outbox (``docs/outbox.rst``): messages an attempt stages with
:meth:`.Claim.enqueue`, released by the write that makes the attempt durable, then sent.

Staging checks the task (a Celery task, or a ``django.tasks`` task on Django 6.0+) and
serialises the arguments at once, so a mistake is the view's exception, not the relay's. Each
message's id is a UUID derived from the record (scope, key hash, primary key, creation time)
and the message's ``name``, or its position among the messages staged since the attempt's
recovery point: stable across takeovers of the record, so the insert of a message staged again
inserts nothing.

Sending (:func:`send`) is shared by the fast path (:func:`released`: in the web process, once
the release committed, on the process's sender thread, so that a slow or dead broker never
holds a response or a worker) and the relay (``manage.py idempotency_relay``): Celery's
``apply_async(args, kwargs, task_id=message_id)``; a ``django.tasks`` task's ``enqueue(*args,
**kwargs)``, the message id given as the keyword argument ``outbox_message_id`` when the task's
function takes it.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import inspect
import json
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from django_idempotency._conf.settings import conf
from django_idempotency._store.contract import StoreContract
from django_idempotency._store.outbox import Message, Release

logger = logging.getLogger("django_idempotency")

_NAMESPACE = uuid.UUID("0b7d5d0e-3c1f-4a53-9f57-64a8e4c2a7b1")
CELERY = "celery"
TASKS = "tasks"
#: The keyword argument a ``django.tasks`` task's function takes to learn its message's id.
MESSAGE_ID_ARGUMENT = "outbox_message_id"

#: What the sender thread is handed: what it does once idle (its connection given back), the
#: work, and when it is too late to start it (``None``: never).
Job = tuple[Callable[[], None], Callable[[], None], float | None]


@dataclass(slots=True)
class Staged:
    """An attempt's messages staged and not yet released, and the positions used so far
    since each recovery point (an unnamed message's id)."""

    #: Which life of the record (its ``created_at``, in microseconds): an expired record
    #: claimed again keeps its primary key but starts anew, and its messages are new ones.
    life: int = 0
    messages: list[Message] = field(default_factory=list)
    positions: dict[str, int] = field(default_factory=dict)
    names: set[str] = field(default_factory=set)
    #: Released in a transaction that may yet roll back: staged still, and the next release
    #: looks for those already there (:func:`released`).
    unsure: bool = False


def stage(claim: Any, task: Any, args: tuple[Any, ...], name: str | None, kwargs: Any) -> str:
    """Stage a message for ``task`` on ``claim`` (a :class:`.Claim`): its id."""
    engine, path = describe(task)
    arguments = serialised(path, args, kwargs)
    staged: Staged | None = claim.outbox
    if staged is None:
        staged = claim.outbox = Staged(life=claim.life)
    if name is None:
        segment = _segment(claim.recovery_point, claim.recovery_data)
        position = staged.positions.get(segment, 0)
        staged.positions[segment] = position + 1
        label = f"#{segment}\0{position}"
    else:
        if not isinstance(name, str) or not name:
            raise TypeError(f"enqueue({path}): name must be a non-empty string, not {name!r}.")
        if name in staged.names:
            raise ValueError(f"enqueue({path}): the attempt already staged a message {name!r}.")
        staged.names.add(name)
        label = f"={name}"
    message_id = str(
        uuid.uuid5(
            _NAMESPACE, f"{claim.scope}\0{claim.key_hash}\0{claim.pk}\0{staged.life}\0{label}"
        )
    )
    staged.messages.append(Message(message_id, engine, path, arguments))
    return message_id


def _segment(point: str, data: Any) -> str:
    """The recovery point unnamed messages are counted from: its name and, when it has any,
    its data. A point set again under its name (a loop marking each item done) is a new point
    by its data; counted by name alone, the takeover resuming at the last one counted from 0
    again, and its next message took the id of one the dead attempt had released at that
    point already: it was never sent."""
    if data is None:
        return point
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return f"{point}\0{hashlib.sha256(canonical.encode()).hexdigest()[:32]}"


def serialised(path: str, args: tuple[Any, ...], kwargs: Any) -> str:
    """A message's arguments as the outbox keeps them: JSON, checked when staged."""
    try:
        return json.dumps(
            {"args": list(args), "kwargs": kwargs}, separators=(",", ":"), allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"enqueue({path}): the arguments must serialise to JSON ({exc}); pass ids and "
            "plain values, and convert dates, decimals and UUIDs to strings."
        ) from exc


def describe(task: Any) -> tuple[str, str]:
    """The engine and the name a task is sent by; ``TypeError`` for anything else."""
    tasks_task = _tasks_task()
    if tasks_task is not None and isinstance(task, tasks_task):
        return TASKS, str(getattr(task, "module_path"))  # noqa: B009 (Django 6.0's Task)
    if callable(getattr(task, "apply_async", None)) and isinstance(
        getattr(task, "name", None), str
    ):
        return CELERY, str(task.name)
    raise TypeError(
        f"enqueue() takes a Celery task (with apply_async) or a django.tasks task (Django "
        f"6.0+), not {task!r}: a plain function cannot be sent to a worker."
    )


def _tasks_task() -> type | None:
    try:
        from django.tasks import Task  # type: ignore[import-not-found,unused-ignore]
    except ImportError:  # Django before 6.0
        return None
    return Task  # type: ignore[no-any-return,unused-ignore]


def release(claim: Any) -> Release | None:
    """What a fenced write of ``claim`` releases: its staged messages (``None``: none)."""
    staged: Staged | None = claim.outbox
    if staged is None or not staged.messages:
        return None
    fast = conf.OUTBOX_FAST_PATH
    return Release(
        claim.pk,
        list(staged.messages),
        conf.OUTBOX_LEASE if fast else timedelta(0),
        notify=not fast,
        fresh=claim.attempt == 1 and not staged.unsure,
    )


def released(claim: Any, store: StoreContract, release: Release | None) -> None:
    """The write carrying ``release`` applied: its messages leave the attempt, and those it
    inserted are sent once every transaction the thread has open commits (the fast path),
    unless it is off, each marked by its key in the store (:meth:`~.StoreContract.message_key`)."""
    if release is None:
        return
    if store.in_transaction():
        # Written in a transaction of the code's own (a recovery point in its atomic block),
        # which may still roll back, and the release with it (an exception the code catches):
        # the messages stay staged, and the next write releases them again, inserting only
        # those not there. Cleared, a rolled-back release left them to nothing. A store whose
        # writes join no transaction (a Redis store's script) has released them for good.
        claim.outbox.unsure = True
    else:
        claim.outbox.messages.clear()
    if not conf.OUTBOX_FAST_PATH or not release.inserted:
        return
    inserted = set(release.inserted)
    keyed = [
        (store.message_key(claim.scope, claim.key_hash, message.message_id), message)
        for message in release.messages
        if message.message_id in inserted
    ]
    after_commits(store, lambda: sender.submit(store, keyed))


def after_commits(store: StoreContract, job: Callable[[], None]) -> None:
    """Run ``job`` once the store's alias commits (where its writes join the thread's
    transaction: :attr:`~.StoreFeatures.shares_transaction`), and then every other transaction
    the thread has open: the view's own, where ``ATOMIC_REQUESTS`` is on another alias than
    the records' (docs: installation). Sent when the records' alias committed, a message
    reached its consumer before the view's writes did (an order not found yet). A transaction
    that rolls back drops it: the relay sends it once its lease has passed."""
    alias = store.alias
    waiting = ([alias] if store.features.shares_transaction else []) + [
        other.alias
        for other in connections.all(initialized_only=True)
        if other.alias != alias and other.in_atomic_block
    ]

    def then(index: int) -> None:
        if index == len(waiting):
            job()
        elif connections[waiting[index]].connection is None and not (
            connections[waiting[index]].in_atomic_block
        ):
            # Closed since the write (a fault met after its commit): no transaction is left to
            # wait for, and ``on_commit`` would connect only to ask whether one is, a 500 while
            # the database is down after the result was stored.
            then(index + 1)
        else:
            transaction.on_commit(partial(then, index + 1), using=waiting[index], robust=True)

    then(0)


class Sender:
    """The process's fast-path thread: it sends what a commit hands it, so that the request's
    thread goes on at once. A broker that accepts connections and never answers made every
    request that staged a message wait out Celery's connect timeout (4 s) before its response;
    here it costs the sender thread, never a response or a web worker's thread.

    Its messages are leased to the process (``OUTBOX_LEASE``): what it does not send, the
    relay does once the lease has passed, so a batch that waited past half its lease (a broker
    hanging on the sends before it) is left to the relay rather than sent twice, and the
    queue is bounded (a full one leaves the batch to the relay). The thread is a daemon; a
    process that exits (a script, a worker stopped) gives it up to :data:`EXIT_WAIT` seconds
    to finish, then leaves what it still holds to the relay. A forked process (gunicorn's
    workers) starts a thread of its own on its first commit.

    A request without a key hands it its messages too (:meth:`hand`), sent however late
    (nothing else would send them), at most once: a full queue loses them, with a log line."""

    def __init__(self, size: int = 1000) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._pid = 0
        self._queue: queue.Queue[Job] = queue.Queue(size)
        self.thread: threading.Thread | None = None
        self._exiting = False

    def submit(self, store: StoreContract, keyed: Sequence[tuple[Any, Message]]) -> None:
        """Hand messages released in ``store`` (committed), each with its key there, to the
        thread (:func:`deliver`)."""
        due = time.monotonic() + conf.OUTBOX_LEASE.total_seconds() / 2
        if not self._put((store.idle_thread, partial(deliver, store, keyed), due)):
            logger.warning("Outbox fast path busy: %d message(s) left to the relay.", len(keyed))

    def hand(self, alias: str, job: Callable[[], None]) -> bool:
        """Run ``job`` on the thread, however long it waits there (a request without a key's
        messages: no relay stands behind them); ``False`` if the queue is full."""
        return self._put((partial(_close, alias), job, None))

    def _put(self, job: Job) -> bool:
        with self._lock:
            if self._pid != os.getpid() or self.thread is None or not self.thread.is_alive():
                self._pid = os.getpid()
                self._queue = queue.Queue(self.size)
                self.thread = threading.Thread(
                    target=self._run, args=(self._queue,), name="idempotency-outbox", daemon=True
                )
                self.thread.start()
                if not self._exiting:
                    self._exiting = True
                    atexit.register(self.settle, EXIT_WAIT)
            try:
                self._queue.put_nowait(job)
            except queue.Full:
                return False
            return True

    def _run(self, jobs: queue.Queue[Job]) -> None:
        while True:
            idle, job, due = jobs.get()
            try:
                if due is None or time.monotonic() < due:
                    job()
            except Exception:  # the thread must live on; the relay delivers these
                logger.exception("Outbox fast path failed; the relay sends its messages.")
            finally:
                if jobs.unfinished_tasks == 1:  # idle now: its connection goes back
                    idle()
                jobs.task_done()

    def settle(self, timeout: float = 10.0) -> bool:
        """Wait until the thread has handled what it was handed (tests): ``False`` if it has
        not within ``timeout`` seconds."""
        jobs = self._queue
        deadline = time.monotonic() + timeout
        with jobs.all_tasks_done:
            while jobs.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                jobs.all_tasks_done.wait(left)
        return True


def _close(alias: str) -> None:
    """A request without a key's messages sent: the thread's connection to ``alias`` (a
    ``django.tasks`` backend's, in the database) goes back if unusable or obsolete, as at a
    request's end (a keyed request's: by its store's :meth:`~.StoreContract.idle_thread`)."""
    with contextlib.suppress(DatabaseError):
        connections[alias].close_if_unusable_or_obsolete()


#: How long an exiting process waits for its sender thread (seconds): a script's messages go
#: at once, and a dead broker delays a worker's exit this much at most.
EXIT_WAIT = 5.0

#: The process's fast-path sender.
sender = Sender()


def deliver(store: StoreContract, keyed: Sequence[tuple[Any, Message]]) -> None:
    """The fast path: send messages just released in ``store`` (leased to this process), and
    mark them by their keys there. A failure is recorded with its backoff; a message not
    marked is the relay's once its lease passes."""
    sent: list[Any] = []
    failed: list[tuple[Any, str]] = []
    for key, message in keyed:
        try:
            send(message.engine, message.task, message.arguments, message.message_id)
        except Exception as exc:  # a broker down, a task renamed: the relay tries again
            logger.warning("Outbox message %s not sent (%s).", message.message_id, exc)
            failed.append((key, f"{type(exc).__name__}: {exc}"))
        else:
            sent.append(key)
    try:
        store.mark_sent(sent, counted=False)
        for key, error in failed:
            store.mark_failed(key, error, retry_at(1), counted=False)
    except DatabaseError:  # the store's (a Redis store's fault is one too)
        logger.warning(
            "Outbox messages sent but not marked; the relay sends them again.", exc_info=True
        )


def retry_at(attempts: int) -> Any:
    """When a message that failed ``attempts`` times is tried again (``None``: never)."""
    if attempts >= conf.OUTBOX_MAX_ATTEMPTS:
        return None
    delay = conf.OUTBOX_RETRY_DELAY * (2 ** min(attempts - 1, 16))
    return timezone.now() + min(delay, timedelta(hours=6))


def send(engine: str, task: str, arguments: str, message_id: str) -> None:
    """Hand one message to its engine (raises what the engine raises)."""
    loaded = json.loads(arguments)
    args, kwargs = loaded["args"], loaded["kwargs"]
    if engine == CELERY:
        _celery_task(task).apply_async(args, kwargs, task_id=message_id)
        return
    if engine == TASKS:
        found = import_string(task)
        if _takes_message_id(found.func):
            kwargs = {**kwargs, MESSAGE_ID_ARGUMENT: message_id}
        found.enqueue(*args, **kwargs)
        return
    raise ValueError(f"Unknown outbox engine {engine!r}.")


def _celery_task(name: str) -> Any:
    """The task registered as ``name`` with the current Celery app, else the object at that
    dotted path (a task's default name is its path)."""
    try:
        from celery import current_app

        return current_app.tasks[name]
    except (ImportError, KeyError):
        found = import_string(name)
        if not callable(getattr(found, "apply_async", None)):
            raise TypeError(f"{name} is not a Celery task.") from None
        return found


_TAKES: dict[Any, bool] = {}


def _takes_message_id(func: Any) -> bool:
    takes = _TAKES.get(func)
    if takes is None:
        parameters = inspect.signature(func).parameters.values()
        takes = _TAKES[func] = any(
            parameter.name == MESSAGE_ID_ARGUMENT or parameter.kind is parameter.VAR_KEYWORD
            for parameter in parameters
        )
    return takes
