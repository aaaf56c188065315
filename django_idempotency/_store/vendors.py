"""The database's stores, one per vendor: the registry's ``"database"`` line
(:mod:`.._conf.stores`) names :class:`Databases`, which opens the store of an alias's vendor.
A new database vendor is its module and one line in :data:`VENDORS`."""

from __future__ import annotations

from django.db import connections

from django_idempotency._store.base import Store
from django_idempotency._store.bound import unsupported
from django_idempotency._store.mysql import MySQLStore
from django_idempotency._store.postgresql import PostgreSQLStore
from django_idempotency._store.sqlite import SQLiteStore

#: The store of each supported ``connection.vendor`` (check E030 refuses any other).
VENDORS: dict[str, type[Store]] = {
    store.vendor: store for store in (PostgreSQLStore, MySQLStore, SQLiteStore)
}


def vendor_store(alias: str) -> Store:
    """A new store of the database ``alias``: its vendor's (:data:`VENDORS`); an unsupported
    database is unavailable (a ``503``)."""
    connection = connections[alias]
    vendor = VENDORS.get(connection.vendor)
    if vendor is None:
        raise unsupported(connection)
    return vendor(alias)


class Databases(Store):
    """The registry's ``"database"`` line: what every database's store says of itself, and
    an alias's store is its vendor's."""

    @classmethod
    def open(cls, alias: str) -> Store:
        return vendor_store(alias)
