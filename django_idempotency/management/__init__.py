"""What the two commands share."""

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


def redis_store(store: str, database: str | None) -> str:
    """The store layer's name of the Redis store ``store`` (a ``CACHES`` alias or a URL, as
    ``STORE`` takes it); ``CommandError`` if it is none, or with ``--database``."""
    from django_idempotency._conf.values import DATABASE, store_alias
    from django_idempotency._conf.values import store as store_value

    if database:
        raise CommandError("Give --database (its outbox) or --store (a Redis store's), not both.")
    if store == DATABASE:
        raise CommandError("--store names a Redis store; without it the database's is relayed.")
    try:
        checked = store_value(store, "--store")
    except (TypeError, ValueError) as exc:
        raise CommandError(str(exc)) from exc
    return store_alias(checked, "")
