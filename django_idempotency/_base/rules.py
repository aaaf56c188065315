"""The record's rules, each written once: as the SQL the store runs, as a ``Q`` for the ORM
(the admin, the commands) and in Python (a record already read).

``tests/test_rules.py`` checks the three agree on every combination of the fields they read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q

#: The status of a record whose attempt is still running: ``IdempotencyKey.Status.PROCESSING``
#: is this value, and the claim's SQL writes it.
PROCESSING = "processing"
#: The statuses of a record whose result is stored (``IdempotencyKey.Status``'s other values).
COMPLETED = "completed"
FAILED = "failed"
#: The least HTTP status of an error: a stored response below it completes its record, one at
#: or above it fails it.
LEAST_ERROR = 400


def is_error(response_status: int | None) -> bool:
    """Whether a stored result is an error's response (a function's result has no status: it
    is none)."""
    return response_status is not None and response_status >= LEAST_ERROR


def stored_status(response_status: int | None) -> str:
    """The status a record keeps with its result: every store writes this one (a status
    endpoint reads an operation's state from it)."""
    return FAILED if is_error(response_status) else COMPLETED


@dataclass(frozen=True)
class Rule:
    """A condition on one record at a time ``now``.

    ``sql`` names columns as ``{column}`` (quoted by :meth:`where`) and takes ``%s``
    placeholders, each named in ``params``: ``now``, ``request_hash`` or ``processing``.
    """

    sql: str
    params: tuple[str, ...]
    q: Callable[[datetime, str], Q]
    test: Callable[[Any, datetime, str], bool]

    def where(self, quote: Callable[[str], str]) -> str:
        """The SQL condition, with this connection's quoting of the column names."""
        return self.sql.format_map(_Quoted(quote))

    def args(self, now: Any, request_hash: str = "") -> list[Any]:
        """The values of :meth:`where`'s placeholders, in order (``now`` as the database takes
        it)."""
        values = {"now": now, "request_hash": request_hash, "processing": PROCESSING}
        return [values[name] for name in self.params]

    def filter(self, now: datetime, request_hash: str = "") -> Q:
        """The condition for a queryset."""
        return self.q(now, request_hash)

    def holds(self, record: Any, now: datetime, request_hash: str = "") -> bool:
        """Whether the rule holds for a record read into Python."""
        return self.test(record, now, request_hash)


class _Quoted(dict[str, str]):
    def __init__(self, quote: Callable[[str], str]) -> None:
        super().__init__()
        self.quote = quote

    def __missing__(self, column: str) -> str:
        return self.quote(column)


def _is_stale(record: Any, now: datetime, request_hash: str = "") -> bool:
    return bool(
        record.status == PROCESSING and record.unlock_at is not None and record.unlock_at <= now
    )


#: Past its ``ttl``: a claim starts it afresh, the cleanup may delete it.
EXPIRED = Rule(
    sql="{expires_at} <= %s",
    params=("now",),
    q=lambda now, _: Q(expires_at__lte=now),
    test=lambda record, now, _: bool(record.expires_at <= now),
)

#: Stuck in ``processing`` with a lock that expired: its worker presumably died.
STALE = Rule(
    sql="{status} = %s AND {unlock_at} <= %s",
    params=("processing", "now"),
    q=lambda now, _: Q(status=PROCESSING, unlock_at__lte=now),
    test=_is_stale,
)

#: What a claim with ``request_hash`` may take over: an expired record, or a stale one of the
#: same request (a retry resuming from the recovery point).
TAKEOVER = Rule(
    sql="({expires_at} <= %s OR ({status} = %s AND {unlock_at} <= %s AND {request_hash} = %s))",
    params=("now", "processing", "now", "request_hash"),
    q=lambda now, request_hash: (
        Q(expires_at__lte=now) | Q(status=PROCESSING, unlock_at__lte=now, request_hash=request_hash)
    ),
    test=lambda record, now, request_hash: (
        EXPIRED.holds(record, now)
        or (_is_stale(record, now) and record.request_hash == request_hash)
    ),
)

#: What the cleanup deletes: expired, and not a ``processing`` record whose lock is live (or
#: has none).
DELETABLE = Rule(
    sql="{expires_at} <= %s AND ({status} <> %s OR {unlock_at} <= %s)",
    params=("now", "processing", "now"),
    q=lambda now, _: Q(expires_at__lte=now) & (~Q(status=PROCESSING) | Q(unlock_at__lte=now)),
    test=lambda record, now, _: (
        EXPIRED.holds(record, now)
        and (
            record.status != PROCESSING
            or (record.unlock_at is not None and record.unlock_at <= now)
        )
    ),
)
