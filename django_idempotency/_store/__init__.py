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
and one line in :data:`VENDORS`; the hot statements (the claim, the fenced writes, atomic mode's
read) go below the drivers' cursors where nothing else would see them (:mod:`.libpq`,
:mod:`.mysqlclient`). :func:`using` gives the store of a database alias (:func:`served`
asks it what its database can do; :func:`database_store` where only a database's will do);
the engine, the lock renewer and the operators' actions call nothing else.
"""

from __future__ import annotations

from django.db import connections

from django_idempotency._base.errors import StoreUnavailable
from django_idempotency._conf.settings import conf
from django_idempotency._conf.values import display_name, is_redis
from django_idempotency._store.base import Store
from django_idempotency._store.bound import unsupported
from django_idempotency._store.claims import ClaimOutcome, Lock
from django_idempotency._store.contract import ClaimHandle, StoreContract, StoreFeatures
from django_idempotency._store.maintenance import Batch
from django_idempotency._store.mysql import MySQLStore
from django_idempotency._store.postgresql import PostgreSQLStore
from django_idempotency._store.sqlite import SQLiteStore
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
]

#: The store of each supported ``connection.vendor`` (check E030 refuses any other).
VENDORS: dict[str, type[Store]] = {
    store.vendor: store for store in (PostgreSQLStore, MySQLStore, SQLiteStore)
}

_BOUND: dict[str, StoreContract] = {}


def using(alias: str) -> StoreContract:
    """The store of the database ``alias``, made once per alias and shared by every thread
    (it keeps no connection); an unsupported database is unavailable (a ``503``). A name with
    a colon is a Redis store's (:mod:`.redis`: ``cache:<alias>`` or a URL). Either is a
    :class:`~.contract.StoreContract`, and the callers ask nothing else of it."""
    try:
        return _BOUND[alias]
    except KeyError:
        pass
    if is_redis(alias):  # a cache alias's, or a URL
        from django_idempotency._store.redis import RedisStore

        # A database error of the project's code (the scope function reading the user) is
        # the app's database's store's to judge.
        def judge(exc: BaseException) -> bool:
            return using(conf.DATABASE_ALIAS).is_transient(exc)

        return _BOUND.setdefault(alias, RedisStore(alias, judge))
    connection = connections[alias]
    vendor = VENDORS.get(connection.vendor)
    if vendor is None:
        raise unsupported(connection)
    # Two threads may both make one; either serves, and the dictionary keeps the first.
    return _BOUND.setdefault(alias, vendor(alias))


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
