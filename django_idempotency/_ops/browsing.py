"""The records of the stores besides the database (Redis, another of the registry) the
settings and views name, paged for the admin through the store contract
(:meth:`~.._store.contract.StoreContract.browse`, ``records_of``): the database's table has
its ``ModelAdmin``."""

from __future__ import annotations

import contextlib
import re
from typing import Any, NamedTuple

from django.utils.translation import gettext as _

from django_idempotency._base.errors import InvalidKey
from django_idempotency._base.keys import hash_key, parse_key
from django_idempotency._conf.settings import conf
from django_idempotency._conf.values import display_name, store_alias
from django_idempotency._ops import store_checks
from django_idempotency._ops.store_checks import other_stores
from django_idempotency._store import using
from django_idempotency._store.redis import names
from django_idempotency.models import IdempotencyKey

#: A whole key hash, as the search takes it without hashing it again.
_KEY_HASH = re.compile(r"^[0-9a-f]{64}$")


class Browsed(NamedTuple):
    """A store besides the database the admin lists: its mark in the page's URL (a keyed hash
    of its name, never the name, which may be a URL with a password), how people read its
    name, and how its class describes it (``Toy store 'toy://memory'``)."""

    tag: str
    alias: str
    shown: str
    described: str


def browsed() -> list[Browsed]:
    """The stores besides the database of ``STORE`` and of the views' ``store`` options."""
    found = []
    for store in sorted(other_stores()):
        alias = store_alias(store, conf.DATABASE_ALIAS)
        shown = display_name(store)
        described = store_checks.described_alias(alias)
        found.append(Browsed(names.tag(alias), alias, shown, described))
    return found


def entry_label() -> tuple[str, str]:
    """The admin index's entry for these stores' records, singular and plural, as their classes
    name them: the one store as it describes itself (``idempotency keys in the Toy store
    'toy://memory'``), several of one kind by its name (``in Redis``), else "other stores"."""
    stores = sorted(other_stores())
    if len(stores) == 1:
        where = store_checks.described(stores[0])
        return _("idempotency key in the %s") % where, _("idempotency keys in the %s") % where
    kinds = {store_checks.kind_name(store) for store in stores}
    if len(kinds) == 1:
        (kind,) = kinds
        return _("idempotency key in %s") % kind, _("idempotency keys in %s") % kind
    return _("idempotency key in another store"), _("idempotency keys in other stores")


def provides(alias: str, capability: str) -> bool:
    """Whether the store of ``alias`` has ``capability`` of the contract
    (:data:`~.._store.contract.CAPABILITIES`), asked of its class (no call to its server):
    the admin offers only what it has."""
    from django_idempotency._conf import stores as registry
    from django_idempotency._store.contract import provides as has

    kind = registry.kind_of(alias)
    return kind is not None and has(kind, capability)


def find(tag: str) -> Browsed | None:
    """The store whose mark is ``tag`` (``None``: none the settings and views name)."""
    return next((each for each in browsed() if each.tag == tag), None)


def page(
    alias: str, cursor: str, size: int, status: str | None
) -> tuple[list[IdempotencyKey], str | None]:
    """A page of the store's records from ``cursor``, and the next page's cursor."""
    return using(alias).browse(cursor, size=size, status=status)


def search(alias: str, term: str, status: str | None) -> list[IdempotencyKey]:
    """The records of an exact idempotency key (hashed as the header's value is) or a whole
    key hash, in every scope, newest first."""
    hashes = {term.lower()} if _KEY_HASH.match(term.lower()) else set()
    with contextlib.suppress(InvalidKey):
        hashes.add(hash_key(parse_key(term)))
    store = using(alias)
    found = [record for key_hash in sorted(hashes) for record in store.records_of(key_hash)]
    found = [record for record in found if not status or record.status == status]
    return sorted(found, key=lambda record: record.created_at, reverse=True)


def read(alias: str, scope: str, key_hash: str) -> IdempotencyKey | None:
    """The record of ``key_hash`` in ``scope`` (``None``: none, or expired)."""
    if not _KEY_HASH.match(key_hash):
        return None
    return using(alias).read(scope, key_hash)


#: Failed messages an outbox page lists at most (the oldest releases first).
FAILED_SHOWN = 500


class Outbox(NamedTuple):
    """A Redis store's outbox as its admin page shows it: why it has none (a cluster), or its
    backlog and its messages failed for good (each with its key, ``pk``)."""

    refusal: str | None
    backlog: Any
    failed: list[Any]


def outbox(alias: str) -> Outbox:
    """The store's outbox: its backlog and its first :data:`FAILED_SHOWN` failed messages."""
    store = using(alias)
    refusal = store.outbox_refusal()
    if refusal is not None:
        return Outbox(refusal, None, [])
    return Outbox(None, store.backlog(), store.failed_messages()[:FAILED_SHOWN])


def resend(alias: str, keys: list[str]) -> int:
    """Make the store's failed messages ``keys`` pending and due now (the contract's
    ``resend``): only keys of messages it lists failed, never a key a form made up."""
    store = using(alias)
    failed = {message.pk for message in store.failed_messages()}
    return store.resend([key for key in keys if key in failed])
