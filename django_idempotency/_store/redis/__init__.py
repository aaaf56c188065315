"""The Redis store: a second kind of store beside the database's vendors, for
endpoints that trade durability and a shared transaction for latency (docs: 'Choosing the
store'). :mod:`.store` speaks the interface the core calls; :mod:`.scripts` holds its Lua."""

from __future__ import annotations

from django_idempotency._store.redis.store import RedisStore

__all__ = ["RedisStore"]
