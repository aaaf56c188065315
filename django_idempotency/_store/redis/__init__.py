"""The Redis store: a second kind of store beside the database's vendors, for
endpoints that trade durability and a shared transaction for latency (docs: 'Choosing the
store'). Its modules, each one concern, from the bottom up:

- :mod:`.urls`: a Redis URL read as redis-py reads it (its places, its options), and the
  refusal of one it would read as another server (``STORE``'s check, E060);
- :mod:`.keyspace`: the prefix of the store's keys, a record's key and its scope's index;
- :mod:`.names`: an operation's name, made and parsed (the database store's operations read it);
- :mod:`.clients`: the redis-py client of a store name by topology (a cache alias's, one
  server, TLS, Sentinel, Cluster), and the pool the store may take connections from;
- :mod:`.faults`: :class:`~.faults.RedisFault`, what redis-py raises, a reply that is not the
  script's, the refusals that pass, which refusals are an outage;
- :mod:`.connections`: the store's own connections, one exchange within a call's time;
- :mod:`.scripts`: the Lua; :mod:`.codec`: a record's fields and replies, by position;
- :mod:`.waits`: ``REDIS_REPLICAS``' ``WAIT``/``WAITAOF`` and its check;
- :mod:`.running`: one script's tries within its bound, on the store's own connection or
  through redis-py's ``Script``;
- :mod:`.renewal`: many locks renewed at once (a cluster's node by node);
- :mod:`.scans`: erasure, the count, a key's records, the census;
- :mod:`.operations`: a record as an operation: its own id, the index that finds it, its
  status read, the scripts of its final response and progress, the stuck ones;
- :mod:`.outbox_scripts`: the outbox's Lua; :mod:`.outbox`: its keys, a release's keys and
  arguments, the relay's side, and whether a store name can serve it;
- :mod:`.server`: the store's one client, its prefix, its connections and scripts, and a
  script's run followed by its replicas' wait;
- :mod:`.handles`: this process's live claims, each a number mapped to its record's key;
- :mod:`.claiming`: the claim, and a record's reads (as found, its life, its status polled);
- :mod:`.fencing`: a live claim's fenced writes (the result and its messages, a recovery
  point, the unlock, the release, the renewal) and the indexes they move;
- :mod:`.kept_operations`: the operations the store keeps: ids handed out, read, listed,
  completed and their progress set, fenced by their ``202``;
- :mod:`.store`: :class:`RedisStore`, the interface the core calls, composing the rest, and
  what the store registry (:mod:`.._conf.stores`) asks of its class: open a store, judge a
  ``STORE`` value, name it for the commands.

Each imports, of these, only the ones above it in the list (and of ``_store`` and the layers
below what any store module may)."""

from __future__ import annotations

from django_idempotency._store.redis.store import RedisStore

__all__ = ["RedisStore"]
