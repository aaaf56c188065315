"""A record's fields as the scripts read and write them: durations and times in microseconds,
text, JSON, and a ``found`` claim's reply decoded by position into a :class:`~.rows.Record`
(each field converted when first read)."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta
from operator import itemgetter
from typing import Any

from django.conf import settings
from django.utils import timezone

from django_idempotency._base.durations import EPOCH, MICROSECOND
from django_idempotency._store.redis import scripts
from django_idempotency._store.rows import ATTNAMES, Converters, Record


def as_micros(delta: timedelta) -> int:
    """A duration as the scripts take it: microseconds."""
    return max(0, delta // MICROSECOND)


def as_time(us: Any) -> datetime | None:
    """A time the scripts wrote (microseconds since the epoch), naive without ``USE_TZ``."""
    if us is None or us is False or us == b"":
        return None
    instant = EPOCH + timedelta(microseconds=int(us))
    return instant if settings.USE_TZ else timezone.make_naive(instant)


def as_instant(us: Any) -> datetime:
    """A time a record always has (``ca``, ``ea``), as :func:`as_time` reads it."""
    instant = as_time(us)
    if instant is None:
        raise ValueError("A Redis record without its time.")
    return instant


def as_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def as_json(value: Any) -> Any:
    return None if value in (None, False, b"") else json.loads(value)


def _optional_int(value: bytes) -> int | None:
    return int(value) if value else None


def _token(value: bytes) -> uuid.UUID:
    return uuid.UUID(value.decode())


#: The Redis fields of the model's attributes, in their order (``rows.ATTNAMES``).
_ROW_FIELDS = (
    "id", "scope", "key_hash", "m", "p", "fp", "st", "rs", "rh", "rb", "rp", "rd", "tok", "att",
    "ca", "up", "ua", "ea",
)  # fmt: skip
assert len(_ROW_FIELDS) == len(ATTNAMES), ATTNAMES
_RP = _ROW_FIELDS.index("rp")
#: Where each row field after the key hash is in a ``found`` reply (``reply[2:]`` is the
#: fields in :data:`.scripts.FIELDS`' order; the unlock time ``ua`` may be absent: ``None``),
#: and the row fields the server's time stands in for when absent.
_FROM_REPLY = itemgetter(*(2 + scripts.FIELDS.index(name) for name in _ROW_FIELDS[3:]))
_OR_NOW = tuple(_ROW_FIELDS.index(name) for name in ("ca", "up", "ea"))
#: How each becomes the field's value (``None``: kept as it is), when first read.
_CONVERTERS = Converters(
    [
        None,
        None,
        None,
        as_text,
        as_text,
        as_text,
        as_text,
        _optional_int,
        json.loads,
        bytes,
        as_text,
        as_json,
        _token,
        int,
        as_time,
        as_time,
        as_time,
        as_time,
    ]
)


def record(scope: str, key_hash: str, reply: list[Any]) -> Record:
    """Another call's record, as a claim's ``found`` reply (or a read made like one) gives it:
    a :class:`~.rows.Record` that converts a field when it is first read (a replay reads
    five), and makes the model's instance (unsaved: it lives in Redis) only for a signal's
    receivers."""
    now = reply[1]
    row = [None, scope, key_hash, *_FROM_REPLY(reply)]
    for at in _OR_NOW:  # created, updated, expiry: the server's time when absent
        row[at] = row[at] or now
    if row[_RP] is None:
        row[_RP] = b""
    return Record(row, _CONVERTERS)


def claimed(reply: list[Any]) -> tuple[int, str, Any, int | None]:
    """A claim's own reply (``new``, ``own``, ``takeover``): its attempt, recovery point and
    data, and the record's life (its ``ca``) from the reply itself, never read later: an owner
    whose record was lost and made again by another claim read the new record's life and
    presented its fencing pair as the new owner's."""
    if reply[0] == b"new":
        return 1, "", None, int(reply[1])
    life = int(reply[5]) if len(reply) > 5 and reply[5] else None
    return int(reply[2]), as_text(reply[3] or b""), as_json(reply[4]), life
