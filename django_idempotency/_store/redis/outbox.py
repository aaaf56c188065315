"""The outbox on the Redis store (``docs/outbox.rst``): messages released by the very script
that writes the kept result (or a recovery point), so that they exist exactly when it does, and
taken by the relay under a lease, as the database's outbox rows are.

Keys (``P`` the store's prefix, ``T`` the record's hash tag, :func:`.keyspace.record_key`):

* ``P o:m:{T}:<message id>``, a hash per message: ``id``, ``e`` engine, ``t`` task, ``a``
  arguments (JSON), ``n`` sends tried, ``st`` state (``pending``, ``sent``, ``failed``),
  ``ra``/``sa`` released and sent times (microseconds, the server's clock), ``le`` the last
  error, ``rk`` its record's key. It shares the record's hash tag: one slot with its record.
* ``o:<message id>`` fields of the record's own hash: which messages the record's life has
  released, so that a takeover (or a write tried again) staging one again releases nothing new.
  They go with the record (its TTL, its release, its erasure), as message ids are its life's.
* ``P o:due`` (a sorted set of message keys by the time they may be taken: a release's lease,
  a batch's lease, a retry's backoff), ``P o:failed`` (failed for good, by release time) and
  ``P o:left`` (every undelivered message, by release time: the backlog's oldest).

The three sorted sets are the store's, not a record's: a script that writes a record and them
touches two slots, which a Redis Cluster refuses. The outbox is served on one server (or a
Sentinel's master); a cluster store is refused by check E065 and before a view runs.

A relay takes a batch (:data:`.outbox_scripts.TAKE`) by pushing each message's score forward
by its lease and counting its send: one killed between the take and the mark leaves the
message due again once the lease passes (at least once). Sent messages are kept until their
record expires (for the operator's eye), then Redis deletes them. The scripts are
:mod:`.outbox_scripts`'.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, NamedTuple

from django.utils import timezone

from django_idempotency._conf.values import CACHE_PREFIX
from django_idempotency._store.outbox import Backlog, Release
from django_idempotency._store.redis import clients
from django_idempotency._store.redis.codec import as_micros, as_time


class Taken(NamedTuple):
    """A message a relay took: as :class:`.._store.outbox.Taken`, its ``id`` the message's key."""

    id: str
    message_id: str
    engine: str
    task: str
    arguments: str
    attempts: int

    @property
    def key(self) -> str:
        """What the store's ``mark_sent`` and ``mark_failed`` name it by: its key."""
        return self.id


class FailedMessage(NamedTuple):
    """A message failed for good, as ``idempotency_relay --failed`` lists it (the fields it
    reads of the database's ``OutboxMessage``); ``pk`` is its key."""

    pk: str
    message_id: str
    task: str
    attempts: int
    released_at: datetime
    last_error: str


def due_key(prefix: str) -> str:
    return f"{prefix}o:due"


def failed_key(prefix: str) -> str:
    return f"{prefix}o:failed"


def left_key(prefix: str) -> str:
    return f"{prefix}o:left"


def message_key(record: str, message_id: str, prefix: str) -> str:
    """A message's key: its record's hash tag (one slot with it), then its id."""
    tag = record[record.index("{") :]
    return f"{prefix}o:m:{tag}:{message_id}"


def releasing(
    keys: list[str], args: list[Any], release: Release, index: str, prefix: str
) -> tuple[list[str], list[Any]]:
    """A fenced write's keys and arguments with ``release``'s messages after them."""
    record = keys[0]
    more = [record, index, due_key(prefix), left_key(prefix)]
    more += [message_key(record, message.message_id, prefix) for message in release.messages]
    flat = [value for message in release.messages for value in message]
    return more, [*args, *flat, as_micros(release.lease)]


def released(reply: Any, release: Release) -> Any:
    """A releasing script's result; the ids it inserted are set on ``release``."""
    done, inserted = reply
    release.inserted = [_text(value) for value in inserted]
    return done


#: Why the outbox is not served on a Redis Cluster.
ON_CLUSTER = (
    "on a Redis Cluster a script touches one slot, and the outbox's queue (which the relay "
    "reads) is in another than the record it is released with"
)


@lru_cache(maxsize=64)
def refusal(name: str) -> str | None:
    """Why the outbox cannot be served on the store ``name`` (a store layer's name: a
    ``cache:`` alias or a URL), or ``None``: a Redis Cluster (:data:`ON_CLUSTER`), known by
    its URL, or by its cache's client (made, not connected). Asked at each request of a view
    that calls ``enqueue``: a name's topology is read once."""
    if name.startswith(clients.CLUSTER):
        return ON_CLUSTER
    if name.startswith(CACHE_PREFIX):
        try:
            client = clients.client_for(name)
        except Exception:
            return None  # not a Redis cache: E060 says so
        if clients.is_cluster(client):
            return ON_CLUSTER
    return None


def take(client_run: Any, prefix: str, size: int, lease: timedelta) -> list[Taken]:
    """Claim up to ``size`` messages due now for ``lease`` (:data:`.outbox_scripts.TAKE`)."""
    reply = client_run("TAKE", [due_key(prefix)], [size, as_micros(lease)])
    return [
        Taken(_text(key), _text(id_), _text(engine), _text(task), _text(arguments), int(sends))
        for key, id_, engine, task, arguments, sends in reply
    ]


def mark_sent(client_run: Any, prefix: str, keys: Sequence[str], *, counted: bool) -> int:
    if not keys:
        return 0
    args = ["1" if counted else "0", *keys]
    keys_ = [due_key(prefix), left_key(prefix), failed_key(prefix)]
    return int(client_run("MARK_SENT", keys_, args))


def mark_failed(
    client_run: Any,
    prefix: str,
    key: str,
    error: str,
    retry_at: datetime | None,
    *,
    counted: bool,
) -> int:
    delay = "" if retry_at is None else as_micros(max(retry_at - timezone.now(), timedelta(0)))
    args = [key, error[:4000], delay, "1" if counted else "0"]
    return int(client_run("MARK_FAILED", [due_key(prefix), failed_key(prefix)], args))


def resend(client_run: Any, prefix: str, keys: Sequence[str]) -> int:
    if not keys:
        return 0
    return int(client_run("RESEND", [due_key(prefix), failed_key(prefix)], list(keys)))


def backlog(client: Any, prefix: str) -> Backlog:
    """Pending and failed messages, and the oldest undelivered one's release."""
    pipe = client.pipeline(transaction=False)
    pipe.zcard(due_key(prefix))
    pipe.zcard(failed_key(prefix))
    pipe.zrange(left_key(prefix), 0, 0, withscores=True)
    pending, failed, oldest = pipe.execute()
    first = as_time(int(oldest[0][1])) if oldest else None
    return Backlog(int(pending), int(failed), first)


def failed(client: Any, prefix: str) -> list[FailedMessage]:
    """The messages failed for good, oldest release first."""
    found = []
    for key in client.zrange(failed_key(prefix), 0, -1):
        fields = client.hmget(key, "id", "t", "n", "ra", "le")
        if fields[0] is None:
            continue
        id_, task, sends, at, error = fields
        released_at = as_time(int(at))
        assert released_at is not None
        found.append(
            FailedMessage(
                _text(key), _text(id_), _text(task), int(sends), released_at, _text(error or b"")
            )
        )
    return found


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
