"""The store registry: which store serves each form of a store's name, as Django's ``CACHES``
names a backend by its dotted path and kombu a transport by its alias.

A store's name is ``STORE``'s value (or a view's ``store``, a command's ``--store``):
``"database"``, a URL, or a ``CACHES`` alias; the store layer knows it as the database's alias,
the URL, or ``cache:<alias>`` (:func:`.values.store_alias`). Its *form* is ``"database"``, the
URL's scheme with its ``://`` (``redis://``: no URL takes the database's line), or the alias's
``BACKEND``, and :data:`STORES` maps each form to the dotted path of its store's class (a
:class:`~.._store.contract.StoreContract`), imported when first asked.
A new store is its module and one line here: nothing else asks which kind a store is, and the
settings' checks, ``using()`` and the commands ask the class (:class:`StoreKind`).
"""

from __future__ import annotations

from typing import Any, Protocol, cast

from django.utils.module_loading import import_string

#: ``STORE``'s value for the database (``DATABASE_ALIAS``).
DATABASE = "database"
#: The prefix of the name the store layer gives a store named by a cache alias.
CACHE_PREFIX = "cache:"

#: The store class of each form of a store's name (see the module's docstring).
STORES: dict[str, str] = {
    DATABASE: "django_idempotency._store.vendors.Databases",
    **dict.fromkeys(
        (
            *("redis://", "rediss://", "unix://", "redis+sentinel://", "rediss+sentinel://"),
            *("redis+cluster://", "rediss+cluster://"),
            *("django.core.cache.backends.redis.RedisCache", "django_redis.cache.RedisCache"),
        ),
        "django_idempotency._store.redis.RedisStore",
    ),
}


class StoreKind(Protocol):
    """What the registry asks of a store's class (the contract's class methods)."""

    #: The store's kind for people (``Redis``, ``PostgreSQL``): messages name it so.
    name: str

    def open(self, alias: str) -> Any:
        """The store of ``alias`` (a name the store layer knows it by)."""

    def validate(self, value: str, name: str) -> None:
        """``ValueError`` for a value of its form that can never work (``STORE``: E060)."""

    def describe(self, alias: str) -> str:
        """How a command names the store (``database 'default'``), without secrets."""

    @property
    def expiry(self) -> str:
        """How its records go, as ``idempotency_stats`` says (``""``: nothing said)."""


def form(name: str) -> str | None:
    """The form of a store's name as the store layer knows it (a database alias, a URL,
    ``cache:<alias>``); ``None``: a cache alias ``CACHES`` does not have."""
    if "://" in name:
        return name.partition("://")[0] + "://"
    if name.startswith(CACHE_PREFIX):
        return backend(name.removeprefix(CACHE_PREFIX))
    return DATABASE


def backend(alias: str) -> str | None:
    """The ``BACKEND`` of the ``CACHES`` alias (``None``: no such alias)."""
    from django.conf import settings

    cache = getattr(settings, "CACHES", {}).get(alias)
    return None if cache is None else str(cache.get("BACKEND", ""))


def kind(form: str | None) -> StoreKind | None:
    """The store class of a form (:data:`STORES`); ``None``: no store serves it."""
    path = STORES.get(form or "")
    return None if path is None else cast(StoreKind, import_string(path))


def path_of(name: str) -> str | None:
    """The dotted path of the class that serves ``name``, without importing it (a store's own
    modules ask which names are theirs); ``None``: none serves it."""
    return STORES.get(form(name) or "")


def kind_of(name: str) -> StoreKind | None:
    """The store class that serves the store layer's name ``name``; ``None``: none does."""
    return kind(form(name))
