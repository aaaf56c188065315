"""The relay's marks on the Redis store's outbox (:mod:`.outbox`): a batch's messages marked
sent, a failed send recorded, failed messages made due again (:mod:`.outbox_scripts`'
``MARK_SENT``, ``MARK_FAILED``, ``RESEND``). On a cluster each slot's messages are marked by
that slot's script, one slot after another: one refused (its keys moving to another primary)
holds back no other."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from django_idempotency._store.redis import outbox_slots
from django_idempotency._store.redis.codec import as_micros
from django_idempotency._store.redis.faults import RedisFault
from django_idempotency._store.redis.outbox import Queues, _node_name, queues

logger = logging.getLogger("django_idempotency")


def _by_slot(prefix: str, keys: Sequence[str], cluster: bool) -> dict[Queues, list[str]]:
    """Message ``keys`` (each once) grouped by their queues: one script per slot on a
    cluster."""
    grouped: dict[Queues, list[str]] = {}
    for key in dict.fromkeys(keys):
        grouped.setdefault(queues(prefix, key, cluster), []).append(key)
    return grouped


#: When each primary last failed to answer a mark (``time.monotonic``), by its name.
_silent: dict[str, float] = {}
#: How long (seconds) a primary that failed to answer is marked after the others.
SILENT_FOR = 60.0


def _by_node(
    client: Any, prefix: str, keys: Sequence[str], cluster: bool
) -> list[tuple[str, Queues, list[str]]]:
    """Each slot's keys with its primary's name, a primary that lately failed to answer
    after the others (so that its wait delays no other primary's marks past their lease)."""
    grouped = _by_slot(prefix, keys, cluster)
    named = [
        (_node_name(client, q.left) if cluster else "", q, each) for q, each in grouped.items()
    ]
    now = time.monotonic()
    return sorted(named, key=lambda slot: now - _silent.get(slot[0], now - SILENT_FOR) < SILENT_FOR)


def _each_slot(
    client: Any,
    prefix: str,
    keys: Sequence[str],
    cluster: bool,
    what: str,
    run: Callable[[Queues, list[str]], int],
) -> int:
    """``run`` on each slot's keys in turn, the counts summed. A slot refused (moving to
    another primary past the call's bound) is said in the log and passed over: it aborted
    the whole pass, and every other slot's messages were sent again after their lease. After
    a connection's failure, the other slots of that primary are passed over too: each waited
    its socket timeout in turn, past the healthy primaries' lease. Only when every slot was
    refused is the first refusal raised."""
    done, ran = 0, False
    failed: RedisFault | None = None
    down: dict[str, RedisFault] = {}
    for node, queued, each in _by_node(client, prefix, keys, cluster):
        try:
            if node in down:
                raise down[node]
            done += run(queued, each)
        except RedisFault as exc:
            logger.warning(
                "The outbox's %s of %s message(s) in %s failed, passed over: %s",
                *(what, len(each), queued.left, exc),
            )
            failed = failed or exc
            if cluster and outbox_slots.unreachable(exc):
                down[node], _silent[node] = exc, time.monotonic()
            continue
        ran = True
        _silent.pop(node, None)
    if failed is not None and not ran:
        raise failed
    return done


def mark_sent(
    client_run: Any, client: Any, prefix: str, keys: Sequence[str], *, counted: bool, cluster: bool
) -> int:
    """Mark messages sent, slot by slot (:func:`_each_slot`). A slot whose count falls short
    (a message its node does not hold: expired with its record, or moving) is said in the
    log and marked again once; a message still missing then was sent and is not marked (sent
    again after its lease, if it exists elsewhere)."""

    def mark(queued: Queues, each: list[str]) -> int:
        args = ["1" if counted else "0", queued.due, queued.failed, *each]
        marked = int(client_run("MARK_SENT", [queued.left], args))
        if marked < len(each):
            logger.warning(
                "The outbox marked %s of %s message(s) in %s sent; marking them again.",
                marked,
                len(each),
                queued.left,
            )
            marked = int(client_run("MARK_SENT", [queued.left], args))
        return marked

    return _each_slot(client, prefix, keys, cluster, "mark", mark)


def mark_failed(
    client_run: Any,
    prefix: str,
    key: str,
    error: str,
    retry_at: datetime | None,
    *,
    counted: bool,
    cluster: bool,
) -> int:
    delay = "" if retry_at is None else as_micros(max(retry_at - timezone.now(), timedelta(0)))
    queued = queues(prefix, key, cluster)
    args = [key, error[:4000], delay, "1" if counted else "0", queued.failed]
    return int(client_run("MARK_FAILED", [queued.due], args))


def resend(client_run: Any, client: Any, prefix: str, keys: Sequence[str], cluster: bool) -> int:
    """Failed messages made due now, slot by slot (:func:`_each_slot`); on a cluster, their
    slots indexed (:mod:`.outbox_slots`)."""

    def made_due(queued: Queues, each: list[str]) -> int:
        count = int(client_run("RESEND", [queued.failed], [queued.due, *each]))
        if count and cluster:
            outbox_slots.indexed(client, prefix, [outbox_slots.tag_of(queued.due)])
        return count

    return _each_slot(client, prefix, keys, cluster, "re-send", made_due)
