"""What the commands share."""

from __future__ import annotations

from django.core.management.base import CommandError
from django.db import connections

from django_idempotency._conf.settings import conf


def database_alias(alias: str | None) -> str:
    """The database alias to use, the app's own by default; ``CommandError`` if unknown."""
    alias = alias or conf.DATABASE_ALIAS
    if alias not in connections.settings:
        raise CommandError(f"Unknown database {alias!r}.")
    return alias


def store_of(store: str | None, database: str | None) -> str:
    """The store layer's name of the store a command works on: ``--database``'s, ``--store``'s
    (``database``, a ``CACHES`` alias or a URL, as ``STORE`` takes it), or else ``STORE``'s,
    the one the project's views use: on a project whose ``STORE`` is Redis, a relay started
    without ``--store`` relayed the database's empty outbox and said "Sent 0". A
    ``CommandError`` for both given, or a store that is none."""
    from django_idempotency._conf.values import DATABASE, store_alias
    from django_idempotency._conf.values import store as store_value

    if database:
        if store:
            raise CommandError("Give --database (its outbox) or --store, not both.")
        return database_alias(database)
    try:
        checked = store_value(conf.STORE if store is None else store, "--store")
    except (TypeError, ValueError) as exc:
        raise CommandError(str(exc)) from exc
    if checked == DATABASE:
        return database_alias(None)
    return store_alias(checked, "")


def store_option(store: str, database: str) -> str:
    """The options a suggested command line needs to reach a store: ``store`` as ``STORE``
    names it (``database``: the one of alias ``database``). None for ``STORE``'s, the
    commands' default; else ``--store`` (a Redis store, as its display name shows it) or
    ``--database``."""
    from django_idempotency._conf.values import DATABASE, display_name

    if store != DATABASE:
        return "" if store == conf.STORE else f" --store {display_name(store)}"
    if database != conf.DATABASE_ALIAS:
        return f" --database {database}"
    return "" if conf.STORE == DATABASE else " --store database"
