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
