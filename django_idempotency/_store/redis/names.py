"""A Redis operation's name: what its operation id's MAC covers in place of a primary key
(``r<store>-<oid>``, :mod:`.operations`), made, parsed and its store found. Apart from the
rest of :mod:`.operations` so that the database store's operations (:mod:`.._store.operations`),
which the Redis ones build on, can tell an id of a Redis store's without importing them."""

from __future__ import annotations

import base64
import os

from django.utils.crypto import salted_hmac

#: The first letter of a Redis operation's name: a database's primary key is all digits.
MARK = "r"
_TAG = 8
_SALT = "django_idempotency.redis-store"


def new_id() -> str:
    """A record's operation id: 128 random bits, URL-safe (no ``.``: the MAC follows one)."""
    return base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode("ascii")


def tag(alias: str, secret: str | None = None) -> str:
    """The store's mark in its operations' names: a keyed hash of its alias (``SECRET_KEY``,
    or ``secret``), never the alias, nor a plain hash of it (a URL's password would be
    open to guesses tested against any id)."""
    return salted_hmac(_SALT, alias, secret=secret, algorithm="sha256").hexdigest()[:_TAG]


def name(alias: str, oid: str) -> str:
    """The operation's name, which the operation id's MAC covers."""
    return f"{MARK}{tag(alias)}-{oid}"


def parse(operation_id: str) -> tuple[str, str] | None:
    """(store tag, oid) of a Redis operation's id; ``None``: it is none's shape."""
    named = operation_id.partition(".")[0]
    store, dash, oid = named[1:].partition("-")
    if not named.startswith(MARK) or not dash or len(store) != _TAG or not 0 < len(oid) <= 43:
        return None
    if not (store + oid).replace("-", "").replace("_", "").isalnum() or not named.isascii():
        return None
    return store, oid


#: The registry's path of this package's store class (:data:`.._conf.stores.STORES`).
_STORE_CLASS = "django_idempotency._store.redis.RedisStore"


def resolve(store: str) -> str | None:
    """The alias of the Redis store whose :func:`tag` is ``store``, among those this process
    knows: ``STORE``, every Redis alias of ``CACHES``, every store a view or function named
    (:func:`.._conf.values.named_stores`) and every store in use."""
    from django.conf import settings

    from django_idempotency._conf import stores
    from django_idempotency._conf.settings import conf
    from django_idempotency._conf.values import named_stores, store_alias
    from django_idempotency._store import bound_aliases

    known = {store_alias(conf.STORE, conf.DATABASE_ALIAS), *bound_aliases(), *named_stores()}
    known |= {stores.CACHE_PREFIX + alias for alias in getattr(settings, "CACHES", {})}
    known = {each for each in known if stores.path_of(each) == _STORE_CLASS}
    secrets = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", ())]
    return next(
        (each for each in known if any(tag(each, secret) == store for secret in secrets)),
        None,
    )
