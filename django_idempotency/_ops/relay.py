"""The outbox's relay (``manage.py idempotency_relay``): the safety net and the worker
for what the fast path did not send.

One pass takes batches of the store, through its contract (:class:`.._store.StoreContract`'s
``take``: leased, never shared with another relay or the fast path; the database's table,
:mod:`.._store.outbox`, or a Redis store's scripts) until one comes back short, sends each
message (:func:`.._call.outbox.send`) and marks it sent, or failed with its backoff. Between
passes it waits for a release's ``NOTIFY`` on PostgreSQL (psycopg 3, :mod:`.listener`), and
polls elsewhere. ``SIGTERM`` and ``SIGINT`` end it after the batch in hand: no message is left
half sent; one killed harder is sent again once its lease passes (at least once).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from types import FrameType
from typing import Any

from django.db import DatabaseError, connections
from django.utils import timezone

from django_idempotency._base.errors import StoreUnavailable
from django_idempotency._call import outbox, telemetry
from django_idempotency._conf.settings import conf
from django_idempotency._ops.listener import Listener
from django_idempotency._store import outbox as table
from django_idempotency._store import using
from django_idempotency._store.contract import StoreContract, Taken

logger = logging.getLogger("django_idempotency")
#: What a batch's time is read from (a test's clock may stand in).
_clock = time.monotonic

#: The longest one of the relay's statements may take (seconds), past which its connection is
#: cut (:mod:`.._store.deadlines`) and the pass made again on a new one. Unbounded, a relay
#: whose connection a blackhole silenced waited on it for good, and nothing more was sent.
STATEMENT_BOUND = 10.0


@dataclass
class Pass:
    """What one pass did."""

    sent: int = 0
    failed: int = 0
    batches: int = 0


#: A failed send: the message, its error, when to try it again (``None``: failed for good).
Failure = tuple[Taken, str, datetime | None]


def _record(store: StoreContract, failures: Sequence[Failure], *, marked: bool) -> None:
    """Record each failed send with its backoff. One refused (on a cluster, its slot moving
    to another primary: the server refuses to create its ``failed`` queue there) is said in
    the log and passed over, its message tried again once its lease passes: it aborted the
    pass, and every message it had sent was sent again. Raised only while nothing of the
    batch was ``marked`` or recorded (the store down: each would wait its bound in turn)."""
    for message, error, retry in failures:
        mark = partial(store.mark_failed, message.key, error, retry, counted=True)
        try:
            store.bounded_here(STATEMENT_BOUND, mark)
        except (DatabaseError, StoreUnavailable) as exc:
            if not marked:
                raise
            logger.warning(
                "Outbox message %s's failed send not recorded, tried again after its lease: %s",
                message.message_id,
                exc,
            )
            continue
        marked = True


class Relay:
    def __init__(
        self,
        alias: str,
        *,
        batch_size: int | None = None,
        interval: float | None = None,
        report: Callable[[str], None] | None = None,
    ) -> None:
        self.alias = alias
        self.batch_size = batch_size or conf.OUTBOX_BATCH_SIZE
        self.interval = conf.OUTBOX_POLL_INTERVAL.total_seconds() if interval is None else interval
        self.stopping = threading.Event()
        self.report = report or (lambda line: None)

    def stop(self, signum: int | None = None, frame: FrameType | None = None) -> None:
        """End after the batch in hand (a signal handler)."""
        self.stopping.set()

    def one_pass(self) -> Pass:
        """Send every message due now, batch by batch, each of the store's calls within
        :data:`STATEMENT_BOUND` (a connection to make first: the store's ``connect_thread``);
        each message sent is marked by its key, with the batch's others, before the failed
        sends are recorded (:func:`_record`): a refused record sends no message twice."""
        done = Pass()
        store = using(self.alias)
        store.connect_thread(STATEMENT_BOUND)
        while not self.stopping.is_set():
            taken = store.bounded_here(
                STATEMENT_BOUND, partial(store.take, self.batch_size, conf.OUTBOX_LEASE)
            )
            if not taken:
                break
            done.batches += 1
            failures: list[Failure] = []
            sent = [message.key for message in self._send_each(taken, done, failures.append)]
            store.bounded_here(STATEMENT_BOUND, partial(store.mark_sent, sent, counted=True))
            done.sent += len(sent)
            _record(store, failures, marked=bool(sent))
            if len(taken) < self.batch_size:
                break
        return done

    def _send_each(
        self,
        taken: Sequence[Taken],
        done: Pass,
        failed: Callable[[Failure], None],
    ) -> list[Taken]:
        """Send each message taken: those sent; each that failed is handed to ``failed``
        (message, error, when to try it again: its backoff)."""
        sent: list[Taken] = []
        # The batch is leased for OUTBOX_LEASE: sending on past it, another relay could take
        # what is left (its lease run out) and send it too. What is left waits for its lease.
        ends = _clock() + conf.OUTBOX_LEASE.total_seconds() / 2
        for position, message in enumerate(taken):
            if _clock() > ends:
                logger.info(
                    "Outbox batch cut at half its lease: %s message(s) left until it passes.",
                    len(taken) - position,
                )
                break
            try:
                outbox.send(message.engine, message.task, message.arguments, message.message_id)
            except Exception as exc:  # the broker's, the task's: recorded, tried again later
                error = f"{type(exc).__name__}: {exc}"
                retry = outbox.retry_at(message.attempts)
                logger.warning(
                    "Outbox message %s not sent (attempt %s%s): %s",
                    message.message_id,
                    message.attempts,
                    "" if retry else ", the last",
                    error,
                )
                failed((message, error, retry))
                done.failed += 1
            else:
                sent.append(message)
        return sent

    def run(self, *, once: bool = False) -> Pass:
        """Pass after pass until stopped (``once``: one pass). Installs the ``SIGTERM`` and
        ``SIGINT`` handlers when run in the main thread."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.stop)
            signal.signal(signal.SIGINT, self.stop)
        total = Pass()
        store = using(self.alias)
        listener = None if once or not store.features.notifies else Listener(self.alias)
        if listener is not None:
            listener.listen(STATEMENT_BOUND)
        if not once:  # said once the signals are handled: an operator's (or a test's) cue
            self.report("Relaying; SIGTERM or SIGINT stops after the batch in hand.")
        announced = True  # the first pass's work was released before the listener
        said: str | None = None  # the misconfiguration said at ERROR, said once
        try:
            while not self.stopping.is_set():
                try:
                    done, said = self.one_pass(), None
                except (DatabaseError, StoreUnavailable) as exc:
                    if once:
                        raise
                    said = self._failed(store, exc, said)
                    store.drop_thread_connection()
                    done = Pass()
                if telemetry.gauging_outbox():
                    self._gauge()
                total.sent += done.sent
                total.failed += done.failed
                total.batches += done.batches
                if done.sent or done.failed:
                    self.report(f"Sent {done.sent}, failed {done.failed}.")
                if once:
                    break
                if listener is not None and done.batches and not announced:
                    listener.drop()  # work no notification announced: it missed one
                announced = True
                if done.batches == 0 or not done.sent + done.failed:
                    announced = self._wait(listener)
        finally:
            if listener is not None:
                listener.drop()
        return total

    def _failed(self, store: StoreContract, exc: BaseException, said: str | None) -> str | None:
        """Log a failed pass, tried again after the interval: an outage as a warning; a
        misconfiguration (a refused password) once at ``ERROR`` with its cause, since no
        retry mends it (then as a warning each pass, so the relay is never silent). What
        was said at ``ERROR``, for the next pass."""
        why = store.misconfigured(exc)
        if why is None:
            logger.warning("Outbox relay: the store failed (%s); trying again.", exc)
            return None
        where = store.describe(self.alias)
        if why != said:
            logger.error(
                "Outbox relay: the %s is misconfigured: %s. No message is sent until it is "
                "fixed; the relay tries again every %.3g s.",
                *(where, why, self.interval),
            )
        else:
            logger.warning("Outbox relay: the %s is still misconfigured: %s.", where, why)
        return why

    def _gauge(self) -> None:
        """Set the backlog's gauges (OpenTelemetry), read once per pass within
        :data:`STATEMENT_BOUND`, as the pass's statements are: a read silenced on the relay's
        connection held the relay, which sent nothing more. A failed read's connection is
        discarded (the next pass makes a new one)."""
        store = using(self.alias)
        try:
            figures = store.bounded_here(STATEMENT_BOUND, partial(backlog, self.alias))
        except (DatabaseError, StoreUnavailable):
            store.drop_thread_connection()
            return
        age = figures["outbox_oldest_undelivered_age_seconds"] or 0.0
        telemetry.outbox_backlog(figures["outbox_pending"], figures["outbox_failed"], age)

    def _wait(self, listener: Listener | None) -> bool:
        """Wait for a release's notification or the poll interval, a second at a time (so
        that a stop is prompt): whether a notification came. A listener lost meanwhile
        listens again at the next second (:mod:`.listener`)."""
        deadline = time.monotonic() + self.interval
        while not self.stopping.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if listener is not None and listener.listen(STATEMENT_BOUND):
                if listener.wait(min(left, 1.0)):
                    return True
            else:
                self.stopping.wait(min(left, 1.0))
        return False


def backlog(alias: str) -> dict[str, Any]:
    """The outbox's figures for ``idempotency_stats --json`` (every key always present), of
    the store of ``alias`` (a database alias, or a Redis store's name): ``None`` each where
    the store has no outbox (``outbox_refusal()``), so a monitor never reads "none pending"
    of a store that cannot have any."""
    bound = using(alias)
    if bound.outbox_refusal() is not None:
        return dict.fromkeys(_BACKLOG_KEYS)
    left = bound.backlog()
    age = None
    if left.oldest is not None:
        age = max(0.0, (timezone.now() - left.oldest).total_seconds())
    return {
        "outbox_pending": left.pending,
        "outbox_failed": left.failed,
        "outbox_oldest_undelivered_age_seconds": age,
    }


_BACKLOG_KEYS = ("outbox_pending", "outbox_failed", "outbox_oldest_undelivered_age_seconds")


def refusal(alias: str) -> str | None:
    """Why the store of ``alias`` has no outbox to relay (``None``: it has one)."""
    return using(alias).outbox_refusal()


def failed(alias: str) -> list[Any]:
    """The messages failed for good, oldest release first (``idempotency_relay --failed``)."""
    return using(alias).failed_messages()


def retry_failed(alias: str, messages: list[Any]) -> int:
    """Make ``messages`` pending and due now, as the admin's re-send does (``--retry-failed``):
    those still failed; the count."""
    return using(alias).resend([message.pk for message in messages])


def line(message: Any) -> str:
    """One failed message as ``--failed`` lists it: id, task, sends, release, last error."""
    error = (message.last_error or "").strip().splitlines()
    return (
        f"{message.message_id}  {message.task}  attempts {message.attempts}  released "
        f"{message.released_at.isoformat(timespec='seconds')}  {error[-1] if error else '-'}"
    )


def warnings(figures: dict[str, Any], options: str = "") -> list[str]:
    """``idempotency_stats``' warnings of the outbox: messages failed for good; the commands
    it suggests reach the store with ``options`` (``" --store redis"``)."""
    failed = figures["outbox_failed"]
    if not failed:
        return []
    return [
        f"{failed:,} outbox message(s) failed (OUTBOX_MAX_ATTEMPTS sends refused): list them "
        f"with idempotency_relay{options} --failed, send them again with idempotency_relay"
        f"{options} --retry-failed once the cause is fixed."
    ]


def describe(figures: dict[str, Any]) -> str:
    """The outbox's line of ``idempotency_stats`` (``none``: a store without one)."""
    if figures["outbox_pending"] is None:
        return "none (the store has no outbox)"
    age = figures["outbox_oldest_undelivered_age_seconds"]
    line = f"{figures['outbox_pending']:,} pending, {figures['outbox_failed']:,} failed"
    return line if age is None else f"{line} (oldest {age:,.0f} s)"


def delete_delivered(alias: str, batch_size: int, *, sleep: float = 0.0) -> int:
    """Delete sent messages whose record is gone, batch by batch (``idempotency_cleanup``)."""
    connection = connections[alias]
    deleted = 0
    while count := table.delete_delivered(connection, batch_size):
        deleted += count
        if count < batch_size:
            break
        time.sleep(sleep)
    return deleted


def resend(alias: str, ids: list[int]) -> int:
    """Make messages pending and due now (the admin's re-send)."""
    return table.resend(connections[alias], ids)
