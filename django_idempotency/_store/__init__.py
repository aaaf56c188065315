"""The store: every statement the app runs against its table, and the record at rest.

Owns all SQL (nowhere else in the package runs any), the record's lengths (:mod:`.limits`), a
stored response sealed and unsealed (:mod:`.sealing`: compression, encryption), the database's
time zones (:mod:`.time_zones`), a Galera node's eviction stall (:mod:`.galera`) and a record
read and completed as an operation (:mod:`.operations`). May import :mod:`.._conf`,
:mod:`.._base` and the model.
:class:`~.contract.StoreContract` is what every store offers the callers (the engine, the
operators' actions, the testing helpers) and :class:`~.contract.StoreFeatures` what it can do;
:class:`~.base.Store` is what every database shares; each vendor's
statements, and what its database can do (the store's flags and methods, as Django's
``BaseDatabaseFeatures``: nothing else asks ``connection.vendor``), live in a module of their
own (:mod:`.postgresql`, :mod:`.mysql`, :mod:`.sqlite`), so another database is one more module
and one line in :data:`.vendors.VENDORS`; the hot statements (the claim, the fenced writes,
atomic mode's read) go below the drivers' cursors where nothing else would see them (:mod:`.libpq`,
:mod:`.mysqlclient`). :func:`using` gives the store of a database alias (:func:`served`
asks it what its database can do; :func:`database_store` where only a database's will do);
the engine, the lock renewer and the operators' actions call nothing else. Which class
serves an alias is the store registry's (:mod:`.._conf.stores`): another kind of store is its
module and one line there.
"""

from __future__ import annotations

from django_idempotency._base.errors import StoreUnavailable
from django_idempotency._conf import stores
from django_idempotency._conf.values import display_name
from django_idempotency._store.base import Store
from django_idempotency._store.claims import ClaimOutcome, Lock
from django_idempotency._store.contract import ClaimHandle, StoreContract, StoreFeatures
from django_idempotency._store.maintenance import Batch
from django_idempotency._store.vendors import VENDORS, vendor_store
from django_idempotency._store.writes import StoredResponse

__all__ = [
    "VENDORS",
    "Batch",
    "ClaimHandle",
    "ClaimOutcome",
    "Lock",
    "Store",
    "StoreContract",
    "StoreFeatures",
    "StoredResponse",
    "bound_aliases",
    "database_store",
    "served",
    "using",
    "vendor_store",
]

_BOUND: dict[str, StoreContract] = {}


def using(alias: str) -> StoreContract:
    """The store of ``alias``, made once per alias and shared by every thread (it keeps no
    connection): the class the registry names for its form (:mod:`.._conf.stores`: a database
    alias, ``cache:<alias>`` or a URL) opens it; a name no store serves, or an unsupported
    database, is unavailable (a ``503``). Each is a :class:`~.contract.StoreContract`, and the
    callers ask nothing else of it."""
    try:
        return _BOUND[alias]
    except KeyError:
        pass
    kind = stores.kind_of(alias)
    if kind is None:
        raise StoreUnavailable(f"No store serves {display_name(alias)!r} (docs: 'STORE').")
    # Two threads may both make one; either serves, and the dictionary keeps the first.
    return _BOUND.setdefault(alias, kind.open(alias))


def forget_cache_stores(*, setting: str, **kwargs: object) -> None:
    """The ``setting_changed`` receiver: a ``CACHES`` change (a test's ``override_settings``)
    gives each alias a new cache and client, and a store made on the old one would go on
    using a pool the cache has dropped; the next :func:`using` makes it anew."""
    if setting == "CACHES":
        for alias in [alias for alias in _BOUND if alias.startswith(stores.CACHE_PREFIX)]:
            _BOUND.pop(alias, None)


def bound_aliases() -> list[str]:
    """The aliases whose stores this process made (:func:`using`)."""
    return list(_BOUND)


def served(alias: str) -> StoreContract | None:
    """The store of the database ``alias``, asked what its database can do (the checks, the
    admin); ``None`` where no vendor module serves it (check E030 refuses it)."""
    try:
        return using(alias)
    except StoreUnavailable:
        return None


def database_store(alias: str) -> Store:
    """The store of the database ``alias``, where only a database's will do (the outbox's
    table, which shares the view's transaction); a Redis store's name is unavailable."""
    found = using(alias)
    if not isinstance(found, Store):
        raise StoreUnavailable(f"{display_name(alias)!r} is not a database (the outbox's table).")
    return found
