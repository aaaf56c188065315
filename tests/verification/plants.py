"""Bugs planted on purpose (``--plant NAME``), in the server processes only: each breaks one
guarantee, and the checker must find it by that guarantee's invariant.

The plants patch the database store's statements and the record's rules (SQLite, PostgreSQL and
MariaDB alike, through the shared SQL; ``test_plants.py`` runs them on SQLite).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from django.db.models import Q

#: Each plant and the invariant that must find it.
PLANTS = {
    "no-fencing": 2,
    "shared-scope": 3,
    "early-takeover": 1,
    "no-renewal": 1,
    "no-expiry-check": 5,
    "release-on-failure": 6,
    "operation-any-reader": 7,
    "resume-from-start": 9,
    "completion-dropped": 7,
}


def _no_fencing() -> None:
    """A late owner's writes match the record whoever holds it, whatever its status."""
    from django_idempotency._store import writes

    made = writes.fenced_sql

    def unfenced(connection: Any, statement: Any, **options: Any) -> str:
        sql = made(connection, statement, **options)
        q = connection.ops.quote_name
        head, _, _ = sql.partition(f" AND {q('lock_token')} = %s")
        return f"{head} AND %s IS NOT NULL"  # the token's placeholder, matching anything

    writes.fenced_sql = unfenced
    # A stale_at's parameters would be left over: a late owner writes without one.
    original = writes.FencedWrites._fenced

    def fenced(self: Any, connection: Any, statement: Any, params: Any, pk: Any, token: Any,
               stale_at: Any, release: Any = None) -> bool:  # fmt: skip
        return original(self, connection, statement, params, pk, token, None, release)

    writes.FencedWrites._fenced = fenced  # type: ignore[method-assign]


def _shared_scope() -> None:
    """Every request in one scope: two principals' keys meet."""
    from django_idempotency._http import scopes

    def shared(request: Any) -> str:
        return "shared"

    # In place: whoever resolved the function already (settings, ninja) holds this object.
    scopes.user_scope.__code__ = shared.__code__


def _early_takeover() -> None:
    """A processing record of the same request is taken over before its ``unlock_at``."""
    from django_idempotency._base import rules

    rules.TAKEOVER = rules.Rule(
        sql="({expires_at} <= %s OR ({status} = %s AND %s IS NOT NULL AND {request_hash} = %s))",
        params=rules.TAKEOVER.params,
        q=lambda now, request_hash: Q(expires_at__lte=now) | Q(request_hash=request_hash),
        test=lambda record, now, request_hash: bool(
            record.expires_at <= now
            or (record.status == rules.PROCESSING and record.request_hash == request_hash)
        ),
    )


def _no_renewal() -> None:
    """Renewal silently off: every lease reported renewed, none written."""
    from django_idempotency._store import writes

    def renew(self: Any, leases: Sequence[tuple[int, Any]], lock_timeout: timedelta) -> set[int]:
        return {pk for pk, _ in leases}

    writes.FencedWrites.renew = renew  # type: ignore[method-assign]


def _no_expiry_check() -> None:
    """An expired record is treated as live: replayed, never started afresh."""
    from django_idempotency._base import rules

    stale = rules.TAKEOVER
    rules.TAKEOVER = rules.Rule(
        sql="(%s IS NULL OR ({status} = %s AND {unlock_at} <= %s AND {request_hash} = %s))",
        params=stale.params,
        q=lambda now, request_hash: Q(status=rules.PROCESSING, unlock_at__lte=now),
        test=lambda record, now, request_hash: bool(
            record.status == rules.PROCESSING
            and record.unlock_at is not None
            and record.unlock_at <= now
            and record.request_hash == request_hash
        ),
    )
    rules.EXPIRED = rules.Rule(
        sql="%s IS NULL",
        params=("now",),
        q=lambda now, _: Q(pk__in=[]),
        test=lambda record, now, _: False,
    )


def _release_on_failure() -> None:
    """A two-phase attempt whose record is released (it raised, answered a 5xx) releases the
    messages it staged first, as if its result had been kept (on either store)."""
    from django.db import connections, transaction

    from django_idempotency._call import outbox, writing
    from django_idempotency._conf import stores as kinds
    from django_idempotency._store import outbox as store
    from django_idempotency._store import using

    original = writing.release

    def release(attempt: Any, *, reason: str, raised: bool, undo: bool = False) -> None:
        claim, alias = attempt.claim, attempt.policy.alias
        messages = None if claim is None or claim.outbox is None else outbox.release(claim)
        if messages is not None and kinds.form(alias) != kinds.DATABASE:
            # The Redis store releases messages only with a fenced write: its recovery point
            # written again (its record deleted just after) releases them.
            using(alias).save_recovery_point(claim.pk, claim.token_text, claim.recovery_point,
                                             claim.recovery_data, claim.lock_timeout,
                                             release=messages)  # fmt: skip
            outbox.released(claim, using(alias), messages)
        elif messages is not None and not attempt.policy.atomic:
            with transaction.atomic(using=alias):
                store._insert(using(alias), connections[alias], messages)
                outbox.released(claim, using(alias), messages)
        original(attempt, reason=reason, raised=raised, undo=undo)

    writing.release = release


def _operation_any_reader() -> None:
    """The status endpoint shows an operation to every principal: the asking request proves,
    besides its own, every user's scope and the anonymous one."""
    from django.contrib.auth import get_user_model

    from django_idempotency._http import operations, scopes

    original = operations._scopes

    def everyone(request: Any) -> tuple[str, ...]:
        users = get_user_model().objects.values_list("pk", flat=True)
        return (*original(request), *(f"user:{pk}" for pk in users), scopes.ANONYMOUS_SCOPE)

    operations._scopes = everyone


def _resume_from_start() -> None:
    """A takeover ignores the recovery point its record holds: the view starts from the
    beginning, as a first attempt does."""
    from django_idempotency._call.identity import Identity

    original = Identity.claimed

    def claimed(self: Any, **given: Any) -> Any:
        return original(self, **{**given, "recovery_point": "", "recovery_data": None})

    Identity.claimed = claimed  # type: ignore[method-assign]


def _completion_dropped() -> None:
    """``complete_operation`` reports the operation completed and stores nothing: it runs
    until its TTL, and a retry of its request is answered its ``202`` until then."""
    from django_idempotency._store import operations

    def complete(alias: str, operation: Any, stored: Any) -> bool:
        return True

    operations.complete = complete


_APPLY: dict[str, Callable[[], None]] = {
    "no-fencing": _no_fencing,
    "shared-scope": _shared_scope,
    "early-takeover": _early_takeover,
    "no-renewal": _no_renewal,
    "no-expiry-check": _no_expiry_check,
    "release-on-failure": _release_on_failure,
    "operation-any-reader": _operation_any_reader,
    "resume-from-start": _resume_from_start,
    "completion-dropped": _completion_dropped,
}


def apply(name: str) -> None:
    if name:
        _APPLY[name]()
