"""An operation's state, from its record: ``stalled`` while the record is stale (the
request's owner died, its lock lapsed: only a retry of the request resumes it), ``running``
while the request runs or its stored response is a ``202`` (the work handed on), else its
final response's. Written twice, as the record's other rules are (:mod:`.._base.rules`): as
``Q`` for a queryset (the admin's filter, the list endpoint) and as Python for a record read
(the status endpoint, a Redis store's records), with a test that they agree. Below every
store, so that each reads it without importing the other's modules."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Q

from django_idempotency._base import rules
from django_idempotency._store.contract import ACCEPTED

#: An operation's states, as the status endpoint, the list endpoint and the admin name them.
RUNNING, STALLED, SUCCEEDED, FAILED = "running", "stalled", "succeeded", "failed"
STATES = (RUNNING, STALLED, SUCCEEDED, FAILED)


def state_filter(state: str, now: datetime) -> Q:
    """The records whose operation is in ``state`` at ``now``, for a queryset (the admin's
    filter); :func:`state_of` says the same of one record."""
    stalled = rules.STALE.filter(now)
    handed_on = Q(status=rules.COMPLETED, response_status=ACCEPTED)
    if state == RUNNING:
        return (Q(status=rules.PROCESSING) & ~stalled) | handed_on
    if state == STALLED:
        return stalled
    if state == SUCCEEDED:
        return Q(status=rules.COMPLETED) & ~Q(response_status=ACCEPTED)
    if state == FAILED:
        return Q(status=rules.FAILED)
    raise ValueError(f"No operation state {state!r}.")


def state_of(record: Any, now: datetime) -> str:
    """The state of a record's operation at ``now``: ``stalled`` when its owner is gone,
    ``running`` while its request runs or its stored response is a ``202``, then the final
    response's."""
    if rules.STALE.holds(record, now):
        return STALLED
    if record.status == rules.PROCESSING or record.response_status == ACCEPTED:
        return RUNNING
    if record.status == rules.FAILED or rules.is_error(record.response_status):
        return FAILED
    return SUCCEEDED
