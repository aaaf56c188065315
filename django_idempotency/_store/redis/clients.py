"""The redis-py client of a store name, by its topology: a Django cache alias's own, or one
made from a URL for one server (``redis://``, TLS ``rediss://``), a Sentinel's master
(``redis+sentinel://``) or a Redis Cluster (``redis+cluster://``); and which of its pools the
store may take its own connections from (:mod:`.connections`)."""

from __future__ import annotations

from typing import Any

from django_idempotency._base.errors import StoreUnavailable
from django_idempotency._conf.values import CACHE_PREFIX, display_name
from django_idempotency._store.redis.urls import SENTINEL_CREDENTIALS, redis_options, redis_places

#: The socket timeout given to a client made from a URL (seconds).
SOCKET_TIMEOUT = 5.0
#: A store named by Redis Sentinel: its sentinels, and the master's name (TLS: ``rediss+``).
SENTINEL = ("redis+sentinel://", "rediss+sentinel://")
#: A store named by Redis Cluster: some of its nodes (TLS: ``rediss+``).
CLUSTER = ("redis+cluster://", "rediss+cluster://")


def make_client(name: str) -> Any:
    """The store's client (:func:`client_for`); one that cannot be made is the connection's
    fault (a ``503``, as a server down is), not a ``500``."""
    import redis

    try:
        return client_for(name)
    except StoreUnavailable as exc:  # not a Redis cache: nothing to try again
        raise redis.ConnectionError(str(exc)) from exc
    except Exception as exc:
        # A cluster not reachable (its client asks a node for the slots), an option
        # the client refuses: a 503, as a server down is.
        raise redis.ConnectionError(
            f"The client of Redis store {display_name(name)!r} could not be made: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def is_cluster(client: Any) -> bool:
    """Whether ``client`` is a cluster's: a script touches one slot, so a record's index is
    written apart from it."""
    return type(client).__name__ == "RedisCluster"


def own_pool(client: Any) -> Any:
    """The client's plain connection pool, which the store takes its own connections from, or
    ``None`` where its connections are not to be kept (a cluster, Sentinel's, a blocking or
    caching pool, a client bound to one connection)."""
    import redis

    pool = getattr(client, "connection_pool", None)
    if (
        not is_cluster(client)
        and type(pool) is redis.ConnectionPool
        and getattr(pool, "cache", None) is None
        and getattr(client, "connection", None) is None
    ):
        return pool
    return None


def client_for(name: str) -> Any:
    """The redis-py client of a store name: the cache alias's own (its connection pool), or
    one made from the URL."""
    import redis

    if name.startswith(CACHE_PREFIX):
        from django.core.cache import caches

        cache = caches[name[len(CACHE_PREFIX) :]]
        inner = getattr(cache, "_cache", None)  # Django's RedisCache
        if inner is not None and hasattr(inner, "get_client"):
            return inner.get_client(write=True)
        client = getattr(cache, "client", None)  # django-redis
        if client is not None and hasattr(client, "get_client"):
            return client.get_client(write=True)
        raise StoreUnavailable(f"CACHES[{name[len(CACHE_PREFIX) :]!r}] is not a Redis cache.")
    if name.startswith(SENTINEL):
        return sentinel_client(name)
    if name.startswith(CLUSTER):
        return cluster_client(name)
    return redis.Redis.from_url(
        name, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_TIMEOUT
    )


def cluster_client(url: str) -> Any:
    """The client of ``redis[s]+cluster://[user:password@]host:port[,host:port...][?options]``:
    redis-py's ``RedisCluster``, which learns the slots from any node it is given and follows
    them as they move; every node is given the URL's credentials and TLS options."""
    from redis.backoff import NoBackoff
    from redis.cluster import ClusterNode, RedisCluster
    from redis.retry import Retry

    nodes = [
        ClusterNode(host, port)  # type: ignore[no-untyped-call, unused-ignore]
        for host, port in redis_places(url, 6379)
    ]
    # No retries of its own (three with backoff by default, seconds in a failover): the
    # store's own, within each call's bound, decide, so a claim meets a failover as it meets
    # a server down (503 at once, Retry-After) and a result write rides it out within its lock.
    options = {
        "socket_timeout": SOCKET_TIMEOUT,
        "socket_connect_timeout": SOCKET_TIMEOUT,
        **redis_options(url),
    }
    return RedisCluster(startup_nodes=nodes, retry=Retry(NoBackoff(), 0), **options)


def sentinel_client(url: str) -> Any:
    """The master's client of
    ``redis[s]+sentinel://[user:password@]host:port[,host:port...]/master[/db][?options]``:
    Redis Sentinel's, which asks the sentinels for the master again after a failover. The
    URL's credentials are the master's (and its replicas'); the sentinels' own, if they have
    any, are the query's ``sentinel_username`` and ``sentinel_password``. TLS (``rediss+``)
    and its options are both's."""
    from urllib.parse import urlsplit

    from redis.sentinel import Sentinel

    hosts = redis_places(url, 26379)
    names = [part for part in urlsplit(url).path.split("/") if part]
    if not names:
        raise StoreUnavailable(
            f"{display_name(url)!r} names no master: redis+sentinel://host:port/master."
        )
    db = int(names[1]) if len(names) > 1 else 0
    master = {
        "socket_timeout": SOCKET_TIMEOUT,
        "socket_connect_timeout": SOCKET_TIMEOUT,
        **redis_options(url),
    }
    master.pop("db", None)
    own = {
        name.removeprefix("sentinel_"): master.pop(name)
        for name in SENTINEL_CREDENTIALS
        if name in master
    }
    shared = {name: value for name, value in master.items() if name not in ("username", "password")}
    # redis-py types Sentinel from 8.2 on; before, it is untyped (the ignores cover both).
    sentinel = Sentinel(  # type: ignore[no-untyped-call, unused-ignore]
        hosts, sentinel_kwargs={**shared, **own}, **master
    )
    return sentinel.master_for(names[0], db=db)  # type: ignore[no-untyped-call, unused-ignore]
