"""Erasure of one principal's records now, not at their expiry: GDPR's right to
erasure, for code handling erasure requests and ``idempotency_cleanup --scope``."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from django.db import DatabaseError, NotSupportedError
from django.db.models import QuerySet

from django_idempotency import _store as store
from django_idempotency._base import rules
from django_idempotency._base.errors import StoreUnavailable
from django_idempotency._call import telemetry
from django_idempotency._conf.settings import conf
from django_idempotency._conf.values import short_error, store_alias
from django_idempotency._ops import maintenance
from django_idempotency._ops.store_checks import other_stores
from django_idempotency._store.limits import HASHED_SCOPE, bounded_scope, unkeepable
from django_idempotency.models import IdempotencyKey

__all__ = ["Erasure", "erase_scope"]

_T = TypeVar("_T")
logger = logging.getLogger("django_idempotency")

#: The most records one statement deletes: a short lock on each database.
BATCH_SIZE = 1000
#: Times a batch that met another writer's lock (a claim, a cleanup) is tried again.
_CONTENTION_TRIES = 5
#: A scope as stored hashed (:func:`.bounded_scope`): what the admin shows for it.
STORED_HASH = re.compile(re.escape(HASHED_SCOPE) + "[0-9a-f]{64}")


@dataclass(frozen=True)
class Erasure:
    """What :func:`erase_scope` did (or, with ``dry_run``, would do)."""

    scope: str
    #: Finished records deleted (with ``dry_run``: that would be).
    deleted: int
    #: Records still ``processing``, left to finish: erase again once they have.
    in_progress: int
    dry_run: bool = False


def erase_scope(
    scope: str,
    *,
    using: str | None = None,
    batch_size: int = BATCH_SIZE,
    dry_run: bool = False,
    stored: bool = False,
) -> Erasure:
    """Delete every finished record (``completed`` or ``failed``) of ``scope`` now, expired or
    not, in short batches; a record still ``processing`` is left to finish and counted in
    :attr:`Erasure.in_progress`, so call again once it has.

    ``scope`` is what the scope function returns for the principal (``user:42`` for
    :func:`~django_idempotency.user_scope`); ``using`` is the database alias
    (``DATABASE_ALIAS`` by default). Without ``using``, the records of the Redis stores that
    ``STORE`` and the URLconf's views name are erased too. With ``dry_run`` nothing is
    deleted: the counts say what would be. Retries of the erased keys run their views again,
    as for new keys.

    A scope longer than 255 characters, or one that begins with ``sha256:``, is stored as
    ``sha256:`` and 64 lowercase hex digits, which is what the admin shows. ``scope`` is always
    taken as the scope function returns it, so ``sha256:<hex>`` copied from the admin names
    another scope (itself stored as its own hash) and erases nothing; pass ``stored=True`` to
    give the stored form instead: the records stored under exactly that. The two are never
    guessed from the text: a principal whose scope is ``sha256:<hex>`` (a tenant's name, say)
    must not erase the records whose stored form that is. With ``stored=True`` a text no record
    can be stored as (``sha256:`` with anything but 64 lowercase hex digits, or a scope that
    would be stored hashed) is a :class:`ValueError`. Another store that does not answer is
    :class:`~django_idempotency.StoreUnavailable`, raised before any record is erased.
    """
    _check(scope, batch_size=batch_size, stored=stored)
    alias = using or conf.DATABASE_ALIAS
    kept = scope if stored else bounded_scope(scope)
    elsewhere = [0, 0] if using else _erase_in_redis(kept, alias, dry_run=dry_run)
    records = IdempotencyKey.objects.using(alias).filter(scope=kept)
    if dry_run:
        finished = records.exclude(status=rules.PROCESSING).count() + elsewhere[0]
        return Erasure(scope, finished, _in_progress(records) + elsewhere[1], dry_run=True)
    bound = store.using(alias)
    deleted = maintenance.in_batches(
        lambda size: _batch(bound, kept, size), min(batch_size, BATCH_SIZE)
    ).deleted
    erasure = Erasure(scope, deleted + elsewhere[0], _in_progress(records) + elsewhere[1])
    _log(erasure, kept, stored=stored)
    return erasure


def _check(scope: str, *, batch_size: int, stored: bool) -> None:
    """Refuse, before anything is read, a scope no record can have and a batch size that is
    not one: a :class:`ValueError` the caller can correct."""
    if not isinstance(scope, str) or not scope:
        raise ValueError(f"The scope to erase must be a non-empty string, not {scope!r}.")
    if reason := unkeepable(scope):
        # Never made: on MySQL and MariaDB a padded one would erase the scope
        # without its padding, on PostgreSQL one with a NUL the scope cut there.
        raise ValueError(f"The scope to erase is given {reason}; no record has such a scope.")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive integer, not {batch_size!r}.")
    if stored and bounded_scope(scope) != scope and not STORED_HASH.fullmatch(scope):
        raise ValueError(
            "stored=True takes a scope as a record stores it: the scope itself (255 characters "
            "or fewer, not beginning with sha256:) or sha256: and 64 lowercase hex digits, as "
            f"the admin shows it; no record is stored as {scope[:80]!r}."
        )


def _erase_in_redis(kept: str, alias: str, *, dry_run: bool) -> list[int]:
    """The stored scope erased in each Redis store the settings and the URLconf's views name:
    its finished records and those left in progress, counted together."""
    from django_idempotency._store.contract import provides

    named = [store.using(store_alias(name, alias)) for name in sorted(other_stores())]
    # Asked of every store before any erases: an erasure must not stop half done.
    unable = [s.describe(s.alias) for s in named if not provides(s, "erasure")]
    if unable:
        raise NotSupportedError(
            f"The {', '.join(unable)} cannot erase a scope (no erase_scope()): nothing was erased."
        )
    for bound in named:  # every store answers before any erases
        _answering(bound, bound.ping, "nothing was erased")
    elsewhere = [0, 0]
    for bound in named:
        found = _answering(
            bound, partial(bound.erase_scope, kept, dry_run=dry_run), "erase the scope again"
        )
        elsewhere = [elsewhere[0] + found[0], elsewhere[1] + found[1]]
    return elsewhere


def _answering(bound: store.StoreContract, call: Callable[[], _T], then: str) -> _T:
    """``call``'s answer; a store's failure is :class:`StoreUnavailable`, said as commands say
    it (its class and first line, no secret): the ``idempotency_cleanup --scope`` of a Redis
    store down printed redis-py's traceback."""
    try:
        return call()
    except NotSupportedError:
        raise
    except Exception as exc:
        shown = short_error(exc, bound.alias)
        raise StoreUnavailable(
            f"The {bound.describe(bound.alias)} did not answer ({shown}): {then}."
        ) from exc


def _log(erasure: Erasure, kept: str, *, stored: bool) -> None:
    """An erasure is logged as a warning (records were deleted on purpose), counting every
    store's records as the returned :class:`Erasure` does; one that found nothing under a
    scope written as the admin shows a hashed one says how to erase that."""
    logger.warning(
        "Erased %s finished idempotency record%s of a scope; %s in progress left to finish.",
        erasure.deleted,
        "" if erasure.deleted == 1 else "s",
        erasure.in_progress,
        extra=telemetry.log_facts("erased", scope=kept),
    )
    scope = erasure.scope
    if not (stored or erasure.deleted or erasure.in_progress) and STORED_HASH.fullmatch(scope):
        logger.warning(
            "No idempotency record has the scope %r, which is how the admin shows a scope "
            "stored hashed: to erase the records stored under it, pass stored=True "
            "(idempotency_cleanup --scope ... --stored).",
            scope,
        )


def _batch(bound: store.StoreContract, scope: str, size: int) -> int:
    delay = 0.02
    for attempt in range(_CONTENTION_TRIES):
        try:
            return bound.erase_batch(scope, size=size)
        except DatabaseError as exc:
            if not bound.is_contention(exc) or attempt == _CONTENTION_TRIES - 1:
                raise
        time.sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")


def _in_progress(records: QuerySet[IdempotencyKey]) -> int:
    return records.filter(status=rules.PROCESSING).count()
