"""The store's keys: the prefix every key has, a record's key and its scope's index.

A record's Redis key carries its scope and key hash in a hash tag, so on a cluster each record
is one key in one slot."""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache

from django_idempotency._conf.values import CACHE_PREFIX

#: The prefix of every key the store writes, after the cache alias's ``KEY_PREFIX`` and a colon
#: when it has one (:func:`key_prefix`): records never mix with cache entries, and two sites
#: sharing one Redis database with their own ``KEY_PREFIX`` never share a record.
PREFIX = "idempotency:"


def key_prefix(name: str) -> str:
    """The prefix of a store's keys: :data:`PREFIX`, after its cache alias's ``KEY_PREFIX``
    as Django's caches put it (``<KEY_PREFIX>:``). Sites that share one Redis database tell
    their caches apart by ``KEY_PREFIX``; without it their records would be one site's, each
    replaying the other's responses. ``VERSION`` and ``KEY_FUNCTION`` are not used: a record
    is no cache entry, and a new ``VERSION`` (a cache's invalidation) must not forget the keys
    in flight.
    """
    if name.startswith(CACHE_PREFIX):
        from django.core.cache import caches

        own = getattr(caches[name[len(CACHE_PREFIX) :]], "key_prefix", "")
        if own:
            return f"{own}:{PREFIX}"
    return PREFIX


def glob(text: str) -> str:
    """``text`` matched as it is by a ``SCAN``'s pattern (a ``KEY_PREFIX`` may have ``*``)."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def record_key(scope: str, key_hash: str, prefix: str = PREFIX) -> str:
    """The record's Redis key: its scope (hashed: any length, any character) and key hash in
    one hash tag, so that its one key has one slot on a cluster, and records spread."""
    return f"{prefix}r:{{{_scope_hash(scope)}:{key_hash}}}"


@lru_cache(maxsize=1024)
def _scope_hash(scope: str) -> str:
    """The scope's hash in its records' keys: a user's retries meet it again."""
    return hashlib.sha256(scope.encode()).hexdigest()[:32]


def scope_index(scope: str, prefix: str = PREFIX) -> str:
    """The sorted set of a scope's finished records (key hash, scored by expiry): erasure."""
    return f"{prefix}s:{{{_scope_hash(scope)}}}"
