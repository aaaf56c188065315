"""The Redis store: the same contract as the database's (SPEC sections 2 and 3) but atomic
mode, on one Redis server (a Sentinel's master) or a Redis Cluster, through the client of a
Django cache alias (Django's ``RedisCache``, django-redis) or one made from a URL.

It speaks the interface the core calls (:class:`.._store.Store`'s claim, fenced writes,
renewal, status poll), each a Lua script of :mod:`.scripts`; no transaction is shared with the
view's database. A record's Redis key carries its scope and key hash in a hash tag, so on a
cluster each record is one key in one slot. The core's ``pk`` of a claim is a number of this
process (the claim's writes are always this process's), mapped to the record's Redis key.
"""

from __future__ import annotations

import hashlib
import importlib
import itertools
import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from functools import lru_cache
from operator import itemgetter
from typing import Any, TypeVar

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from django_idempotency._base import rules
from django_idempotency._base.errors import StoreUnavailable
from django_idempotency._conf.values import (
    CACHE_PREFIX,
    SENTINEL_CREDENTIALS,
    display_name,
    redis_options,
    redis_places,
)
from django_idempotency._store import deadlines
from django_idempotency._store.claims import Lock, new_token
from django_idempotency._store.redis import scripts
from django_idempotency._store.rows import ATTNAMES, EPOCH, Record, _Converters
from django_idempotency._store.writes import RenewalShortfall, StoredResponse
from django_idempotency.models import IdempotencyKey

logger = logging.getLogger("django_idempotency")

T = TypeVar("T")

#: The prefix of every key the store writes, after the cache alias's ``KEY_PREFIX`` and a colon
#: when it has one (:func:`key_prefix`): records never mix with cache entries, and two sites
#: sharing one Redis database with their own ``KEY_PREFIX`` never share a record.
PREFIX = "idempotency:"
#: How often a script that met a fault is tried again within its bound, and the first pause.
_FIRST_RETRY = 0.02
_MAX_RETRY = 0.25
#: The socket timeout given to a client made from a URL (seconds).
SOCKET_TIMEOUT = 5.0
#: A store named by Redis Sentinel: its sentinels, and the master's name (TLS: ``rediss+``).
SENTINEL = ("redis+sentinel://", "rediss+sentinel://")
#: A store named by Redis Cluster: some of its nodes (TLS: ``rediss+``).
CLUSTER = ("redis+cluster://", "rediss+cluster://")
#: The least time one try of a call is given (seconds): its bound's last moments.
_LEAST_TRY = 0.05
#: The name of the threads that renew a cluster node's locks (:meth:`RedisStore._renew_cluster`).
THREAD_PREFIX = "django-idempotency-renew-"
#: How many times a claim is sent when it meets a fault (its reply lost: the second finds the
#: first's record by its token).
_CLAIM_TRIES = 2

#: hiredis's packer of a command, in C (the redis extra installs hiredis): redis-py 8.2's own,
#: with hiredis, encodes each argument in Python first (a claim's seven: 0.14M instructions).
_pack_command: Any
try:
    _pack_command = importlib.import_module("hiredis").pack_command
except ImportError:  # pragma: no cover - redis-py's parser and packer in Python
    _pack_command = None


class RedisFault(DatabaseError):
    """A Redis command that failed for its connection or its server (a ``DatabaseError``, so
    that the core's writes report it as they report the database's)."""


class _NoConnection:
    """What the core reads of a store's Django connection: the Redis store has none, and is
    never in the view's transaction."""

    in_atomic_block = False
    connection = None
    alias = ""


_NO_CONNECTION = _NoConnection()


def key_prefix(name: str) -> str:
    """The prefix of a store's keys: :data:`PREFIX`, after its cache alias's ``KEY_PREFIX``
    as Django's caches put it (``<KEY_PREFIX>:``). Sites that share one Redis database tell
    their caches apart by ``KEY_PREFIX``; their records were one site's, each replayed the
    other's responses. ``VERSION`` and ``KEY_FUNCTION`` are not used: a record is no cache
    entry, and a new ``VERSION`` (a cache's invalidation) must not forget the keys in flight.
    """
    if name.startswith(CACHE_PREFIX):
        from django.core.cache import caches

        own = getattr(caches[name[len(CACHE_PREFIX) :]], "key_prefix", "")
        if own:
            return f"{own}:{PREFIX}"
    return PREFIX


def _glob(text: str) -> str:
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


def failures() -> tuple[type[Exception], ...]:
    """What redis-py raises for a server, a connection or a cluster that fails: its
    ``RedisError``, and a cluster's ``RedisClusterException`` (not one: an unreachable cluster
    at a worker's first call was a ``500``)."""
    import redis
    from redis.exceptions import RedisClusterException

    return (redis.RedisError, RedisClusterException)


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


def _packed(connection: Any, parts: tuple[Any, ...]) -> Any:
    """A command as the connection sends it: hiredis packs our parts (str, int, bytes) as
    redis-py's own packer does, in C (tests/test_redis_store.py compares the two)."""
    if _pack_command is None:
        return connection.pack_command(*parts)
    return [_pack_command(parts)]


#: The scripts a ``REDIS_REPLICAS`` wait follows: the claim and the result.
_WAITED = frozenset(("CLAIM", "COMPLETE"))
#: The share of a try's time its wait may take: its reply must come before the socket's
#: timeout, or the fault is the connection's.
_WAIT_SHARE = 0.8


def _has_waitaof(version: str) -> bool:
    """Whether a server of ``version`` has ``WAITAOF`` (Redis 7.2 and later)."""
    major, minor = (int(part) for part in [*version.split("."), "0"][:2])
    return (major, minor) >= (7, 2)


def _found(name: str, reply: Any) -> bool:
    """Whether a claim found a record and wrote nothing: a replay or a duplicate, whose wait
    for replicas is moot (a new primary without its replicas yet still replays)."""
    return name == "CLAIM" and reply[0] == b"found"


def _check_wait(name: str, wait: tuple[Any, ...], reply: Any) -> None:
    """Raise :class:`redis.TimeoutError` (a fault) when the wait fell short."""
    import redis

    if isinstance(reply, Exception):
        raise reply
    wanted = wait[2] if wait[0] == "WAITAOF" else wait[1]
    got = int(reply[1]) if isinstance(reply, list) else int(reply)
    if got < wanted:
        # A fault (tried again within the call's bound, then 503), marked as the wait's.
        short = redis.TimeoutError(
            f"{name}: {got} of {wanted} replica(s) acknowledged it within {wait[-1]} ms "
            f"({wait[0]}, REDIS_REPLICAS)"
        )
        short.short_wait = True  # type: ignore[attr-defined]
        raise short


def _limit(connection: Any, seconds: float) -> None:
    """Bound a connection's next reads and writes (and a reconnection) by ``seconds``:
    redis-py reads with its socket's own timeout."""
    connection.socket_timeout = seconds
    connection.socket_connect_timeout = seconds
    sock = getattr(connection, "_sock", None)
    if sock is not None:
        sock.settimeout(seconds)


def _us(delta: timedelta) -> int:
    """A duration as the scripts take it: microseconds."""
    return max(0, delta // timedelta(microseconds=1))


def _time(us: Any) -> datetime | None:
    if us is None or us is False or us == b"":
        return None
    instant = EPOCH + timedelta(microseconds=int(us))
    return instant if settings.USE_TZ else timezone.make_naive(instant)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _data(value: Any) -> Any:
    return None if value in (None, False, b"") else json.loads(value)


class RedisStore:
    """The store of one Redis server (see the module's docstring)."""

    vendor = "redis"
    name = "Redis"
    #: :meth:`_run` tries a script again within its bound: an owner's result write is given
    #: what its lock has left (:func:`django_idempotency._call.fencing.fenced_write`).
    rides_out_faults = True
    lock_wait_outlives_transaction = False

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self._client: Any = None
        self._prefix: str | None = None
        self._cluster: bool | None = None
        self._scripts: dict[str, Any] = {}
        #: The client's plain connection pool (:meth:`_eval`), ``None`` where its connections
        #: are not to be kept (a cluster, Sentinel's, a blocking or caching pool).
        self._pool: Any = None
        self._idle: list[Any] = []
        #: A cluster's renewal connections, each node's own (:meth:`_renew_cluster`).
        self._node_idle: dict[str, list[Any]] = {}
        self._pid = os.getpid()
        #: The records of this process's live claims: pk -> (Redis key, scope, key hash).
        self._records: dict[int, tuple[str, str, str]] = {}
        #: Whether the server has ``WAITAOF`` (Redis 7.2+), read at the first wait.
        self._waitaof: bool | None = None
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()

    # -- what the core reads of every store --------------------------------------------------

    @property
    def connection(self) -> Any:
        return _NO_CONNECTION

    @property
    def prefix(self) -> str:
        """The prefix of the store's keys (:func:`key_prefix`), read once."""
        if self._prefix is None:
            self._prefix = key_prefix(self.alias)
        return self._prefix

    @property
    def client(self) -> Any:
        if self._client is None:
            with self._lock:  # one client: a second one's end would close the first's sockets
                self._make_client()
        return self._client

    def _make_client(self) -> None:
        """The store's one client, made by the first call of the process. Made twice by two
        first calls at once, the one dropped closed its pool when collected (redis-py's
        ``Redis.__del__``: a client made from a URL owns its pool), with the connections our
        idle list and the other threads' calls had from it: a read in flight met a closed
        socket, a ``500`` (CI's Redis fault leg; 1 of 42 fresh apps sent 20 requests at once)."""
        if self._client is None:
            import redis

            try:
                client = client_for(self.alias)
            except StoreUnavailable as exc:  # not a Redis cache: nothing to try again
                raise redis.ConnectionError(str(exc)) from exc
            except Exception as exc:
                # A cluster not reachable (its client asks a node for the slots), an option
                # the client refuses: a 503, as a server down is.
                raise redis.ConnectionError(
                    f"The client of Redis store {display_name(self.alias)!r} could not be made: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            #: A cluster's client: a script touches one slot, so a record's index is written
            #: apart from it (:meth:`_index`).
            self._cluster = type(client).__name__ == "RedisCluster"
            pool = getattr(client, "connection_pool", None)
            if (
                not self._cluster
                and type(pool) is redis.ConnectionPool
                and getattr(pool, "cache", None) is None
                and getattr(client, "connection", None) is None
            ):
                self._pool = pool
            self._client = client

    def _script(self, name: str) -> Any:
        script = self._scripts.get(name)
        if script is None:
            script = self._scripts[name] = self.client.register_script(getattr(scripts, name))
        return script

    def is_lock_timeout(self, exc: BaseException) -> bool:
        return False

    def is_contention(self, exc: BaseException) -> bool:
        return False

    def is_fault(self, exc: BaseException) -> bool:
        # Faults are ridden out inside each call (:meth:`_run`), within its bound: the core's
        # reconnection on a new Django connection has nothing to do here.
        return False

    def is_transient(self, exc: BaseException) -> bool:
        """A database error of the project's code (the scope function reading the user):
        as the database's store says."""
        if isinstance(exc, RedisFault):
            return True
        from django_idempotency._conf.settings import conf
        from django_idempotency._store import using

        return using(conf.DATABASE_ALIAS).is_transient(exc)

    def faulted(self, exc: BaseException) -> None:
        pass

    def refusal(self, exc: BaseException) -> StoreUnavailable:
        return StoreUnavailable(str(exc))

    @property
    def display_name(self) -> str:
        """How messages and logs name the store: without the URL's password."""
        return display_name(self.alias)

    def expected_fault(self, exc: BaseException) -> bool:
        """A refusal caused by the connection or the server (refused, cut, timed out, loading,
        read-only): an outage, one log line per refused call. A 3 s outage logged 790 chained
        tracebacks at ``ERROR``; what redis-py does not name as its own keeps its traceback."""
        import redis

        seen: BaseException | None = exc
        known = False
        while seen is not None:
            if getattr(seen, _UNEXPECTED, False):
                return False
            if isinstance(seen, (redis.ConnectionError, redis.TimeoutError)) or (
                isinstance(seen, redis.ResponseError) and _passing(seen)
            ):
                known = True
            seen = seen.__cause__
        return known

    @contextmanager
    def guard(self) -> Iterator[None]:
        try:
            yield
        except DatabaseError as exc:
            raise self.refusal(exc) from exc

    def bounded(self, connection: Any, seconds: float, statement: Callable[[], T]) -> T:
        return statement()

    def hold(self, scope: str, key_hash: str) -> None:
        pass

    def let_go(self, scope: str, key_hash: str) -> None:
        pass

    def holds(self, scope: str, key_hash: str) -> bool:
        return False

    def in_nested_transaction(self) -> bool:
        return False

    # -- running a script --------------------------------------------------------------------

    def _run(
        self,
        name: str,
        keys: list[str],
        args: list[Any],
        bound: float | None,
        tries: int | None = None,
    ) -> Any:
        """Run a script, again after a fault (a lost connection, a timeout, a server loading
        or refusing writes) until ``bound`` seconds have passed (or ``tries`` were made);
        then :class:`RedisFault`. Every script is safe to run twice: the second finds the
        first's effect by the token. An owner's write rides a fault out while its lock holds;
        a claim tries twice (a new connection after a dead one), then answers ``503``."""
        import redis

        deadline = time.monotonic() + (deadlines.LEAST if bound is None else bound)
        delay = _FIRST_RETRY
        while True:
            if tries is not None:
                tries -= 1
            try:
                return self._eval(name, keys, args, max(deadline - time.monotonic(), _LEAST_TRY))
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError) as exc:
                if isinstance(exc, redis.ResponseError) and not _passing(exc):
                    raise RedisFault(f"Redis refused {name}: {exc}") from exc
                # A claim's wait for replicas that fell short took its time already: not
                # again (a result write's is, within its lock: a failover may be under way).
                short = tries is not None and getattr(exc, "short_wait", False)
                if short or tries == 0 or time.monotonic() + delay >= deadline:
                    raise RedisFault(f"Redis store {self.display_name!r}: {exc}") from exc
                logger.log(
                    # A claim's second try: its refusal, if any, is the call's one line.
                    logging.WARNING if tries is None else logging.DEBUG,
                    "Idempotency store %r failed (%s); trying again in %.2gs.",
                    self.display_name,
                    exc,
                    delay,
                )
            except failures() as exc:
                raise RedisFault(f"Redis store {self.display_name!r}: {exc}") from exc
            time.sleep(delay)
            delay = min(delay * 2, _MAX_RETRY)

    def _eval(self, name: str, keys: list[str], args: list[Any], seconds: float) -> Any:
        """``EVALSHA`` on a connection of the store's own, sent and read below redis-py's
        command machinery (its retry wrapper, its timing): every protected call's claim and
        result, as the database store's statements go below the drivers' cursors: on the
        hot path those layers cost as much as the call. A server that lost its scripts (a
        restart) gets it loaded; a cluster, Sentinel's master, or a client without a plain pool
        runs it through redis-py's ``Script``.
        ``seconds``: what the try may take, its connect and handshake included."""
        import redis

        script = self._script(name)
        wait = self._wait_command(name, seconds)
        if self._pool is None:
            return self._by_client(script, name, keys, args, wait)
        commands: list[tuple[Any, ...]] = [("EVALSHA", script.sha, len(keys), *keys, *args)]
        if wait is not None:
            commands.append(wait)
        replies = self._exchange(commands, seconds, name)
        if isinstance(replies[0], redis.exceptions.NoScriptError):
            (loaded,) = self._exchange([("SCRIPT", "LOAD", script.script)], seconds, name)
            if isinstance(loaded, Exception):
                raise loaded
            replies = self._exchange(commands, seconds, name)
        reply = replies[0]
        if isinstance(reply, Exception):
            raise reply
        if not _understood(name, reply):
            raise _connection_fault(name, reply)
        if wait is not None and not _found(name, reply):
            _check_wait(name, wait, replies[1])
        return reply

    def _server_version(self, seconds: float) -> str:
        if self._pool is None:
            return str(self.client.info("server").get("redis_version", "0"))
        (info,) = self._exchange([("INFO", "server")], seconds, "INFO")
        if isinstance(info, Exception):
            raise info
        for line in _text(info).splitlines():
            if line.startswith("redis_version:"):
                return line.partition(":")[2].strip()
        return "0"

    def _wait_command(self, name: str, seconds: float) -> tuple[Any, ...] | None:
        """The ``WAIT`` (``WAITAOF`` on Redis 7.2 and later) that follows a claim or a result
        write on its connection when ``REDIS_REPLICAS`` asks for replicas, its
        timeout within what the try has left (never 0: that is forever)."""
        if name not in _WAITED:
            return None
        from django_idempotency._conf.settings import conf

        replicas = conf.REDIS_REPLICAS
        if not replicas:
            return None
        if self._cluster:
            raise RedisFault(
                f"Redis store {self.alias!r}: REDIS_REPLICAS is not supported on a Redis "
                "Cluster (a WAIT must follow the write on its node's connection)."
            )
        milliseconds = max(10, int(seconds * 1000 * _WAIT_SHARE))
        if self._waitaof is None:
            self._waitaof = _has_waitaof(self._server_version(seconds))
        if self._waitaof:
            return ("WAITAOF", 0, replicas, milliseconds)
        return ("WAIT", replicas, milliseconds)

    def _exchange(
        self,
        commands: list[tuple[Any, ...]],
        seconds: float,
        name: str,
        node: tuple[str, Any] | None = None,
    ) -> list[Any]:
        """Send ``commands`` in one write on a connection of the store's own and read their
        replies (a server's refusal is its command's reply, an exception in the list), all
        within ``seconds``: the connection's socket timeout is set for this exchange, and a
        connection made for it connects and shakes hands within it too (a cache
        alias's client has no socket timeout by default, and one try of a claim waited for a
        frozen server for good; a URL's client waited its 5 s timeout past the claim's bound).

        The connections are made from the client's pool's own settings (its host, its
        credentials, its TLS) but are the store's, kept on its idle list, one per concurrent
        call (the pool's checkout and release, its check for unread data and its
        observability hooks cost a replay 11 µs, a tenth of our Python around the Redis call),
        so the cache's own connections keep the timeouts their settings give them. A
        connection that met anything but a server's replies is closed, with every idle one (a
        restart or a cut killed them too): the next exchange makes a new one.

        ``node``: a cluster node's name and pool, whose connections are kept apart."""
        import redis

        if self._pid != os.getpid():  # a forked child: its parent's sockets are not its own
            self._idle = []
            self._node_idle = {}
            self._pid = os.getpid()
        if node is None:
            pool, idle = self._pool, self._idle
        else:
            pool, idle = node[1], self._node_idle.setdefault(node[0], [])
        try:
            connection = idle.pop()
        except IndexError:
            connection = None
        try:
            if connection is None:
                connection = pool.connection_class(
                    **{
                        **pool.connection_kwargs,
                        "socket_timeout": seconds,
                        "socket_connect_timeout": seconds,
                    }
                )
                connection.connect()
            else:
                _limit(connection, seconds)
            packed = [part for command in commands for part in _packed(connection, command)]
            connection.send_packed_command(packed)
            replies: list[Any] = []
            for _ in commands:
                try:
                    replies.append(connection.read_response())
                except redis.ResponseError as exc:  # the server's reply, read whole
                    replies.append(exc)
        except BaseException as exc:
            self._drop(connection, idle)
            if isinstance(exc, Exception) and not isinstance(exc, redis.RedisError):
                raise _connection_fault(name, exc) from exc
            raise
        idle.append(connection)
        return replies

    def _by_client(
        self,
        script: Any,
        name: str,
        keys: list[str],
        args: list[Any],
        wait: tuple[Any, ...] | None = None,
    ) -> Any:
        """The script through redis-py's ``Script`` (it loads one the server lacks), and the
        replicas' wait after it in one pipeline: on the same connection, as ``WAIT`` needs."""
        import redis

        try:
            if wait is None:
                reply = script(keys=keys, args=args)
            else:
                pipe = self.client.pipeline(transaction=False)
                script(keys=keys, args=args, client=pipe)
                pipe.execute_command(*wait)
                reply, acknowledged = pipe.execute()
        except redis.RedisError:
            raise
        except Exception as exc:
            raise _connection_fault(name, exc) from exc
        if not _understood(name, reply):
            raise _connection_fault(name, reply)
        if wait is not None and not _found(name, reply):
            _check_wait(name, wait, acknowledged)
        return reply

    def _drop(self, connection: Any, idle: list[Any] | None = None) -> None:
        """A connection that failed, and every idle one (of its server), closed."""
        idle, dropped = self._idle if idle is None else idle, [connection]
        while idle:
            try:
                dropped.append(idle.pop())
            except IndexError:  # another thread took the last
                break
        for each in dropped:
            if each is not None:
                each.disconnect()

    # -- the claim ---------------------------------------------------------------------------

    def claim(
        self,
        identity: Any,
        *,
        ttl: timedelta,
        lock_timeout: timedelta,
        token: str | None = None,
        bound: float | None = None,
    ) -> Any:
        started = time.monotonic()
        token = token or new_token()
        key = record_key(identity.scope, identity.key_hash, self.prefix)
        if bound is None:
            bound = deadlines.bound(lock_timeout)
        try:
            reply = self._run(
                "CLAIM",
                [key],
                [
                    token,
                    identity.fingerprint,
                    identity.method,
                    identity.path,
                    _us(lock_timeout),
                    _us(ttl),
                    identity.scope,
                ],
                bound,
                tries=_CLAIM_TRIES,
            )
        except RedisFault as exc:
            if getattr(exc.__cause__, "short_wait", False):
                self._let_go(key, token, bound)
            raise self.refusal(exc) from exc
        kind = reply[0]
        if kind == b"found":
            return self._record(identity, reply)
        # The record's life (its ``ca``) from the claim's own reply, never read later: an
        # owner whose record was lost and made again by another claim read the new record's
        # life and presented its fencing pair as the new owner's.
        attempt, point, data = 1, "", None
        life: int | None = int(reply[1])
        if kind != b"new":
            attempt, point, data = int(reply[2]), _text(reply[3] or b""), _data(reply[4])
            life = int(reply[5]) if len(reply) > 5 and reply[5] else None
        with self._lock:
            pk = next(self._numbers)
        self._records[pk] = (key, identity.scope, identity.key_hash)
        return identity.claimed(
            pk=pk,
            token_text=token,
            attempt=attempt,
            recovery_point=point,
            recovery_data=data,
            alias=self.alias,
            lock_timeout=lock_timeout,
            held_until=started + lock_timeout.total_seconds(),
            uncommitted=False,
            life=life,
        )

    def _let_go(self, key: str, token: str, bound: float) -> None:
        """A claim the replicas did not acknowledge answers ``503`` and its view never runs:
        its lock is let go at once (``UNLOCK``, fenced: the record and its recovery point
        kept), so the client's retry takes it over instead of waiting out the lock (``409``)."""
        try:
            self._run("UNLOCK", [key], [token], bound, tries=1)
        except RedisFault:
            logger.warning("Could not let go of an unacknowledged claim's lock.", exc_info=True)

    def created_at(self, pk: int) -> datetime | None:
        """When a live claim's record began (:attr:`.Claim.life`, its operation id): it read
        the database's table by the cache alias's name, which is no database."""
        import redis

        entry = self._records.get(pk)
        if entry is None:
            return None
        try:
            return _time(self.client.hget(entry[0], "ca"))
        except redis.RedisError as exc:
            raise self.refusal(exc) from exc

    def _record(self, identity: Any, reply: list[Any]) -> Record:
        """Another call's record, as the claim read it: a :class:`~.rows.Record` that converts
        a field when it is first read (a replay reads five), and makes the model's instance
        (unsaved: it lives in Redis) only for a signal's receivers."""
        now = reply[1]
        row = [None, identity.scope, identity.key_hash, *_FROM_REPLY(reply)]
        for at in _OR_NOW:  # created, updated, expiry: the server's time when absent
            row[at] = row[at] or now
        if row[_RP] is None:
            row[_RP] = b""
        return Record(row, _CONVERTERS)

    def read(self, scope: str, key_hash: str) -> IdempotencyKey | None:
        """The key's record, as a claim that found it would read it (tests, operators)."""

        try:
            values = self.client.hmget(record_key(scope, key_hash, self.prefix), *scripts.FIELDS)
            now = self.client.time()
        except failures() as exc:
            raise self.refusal(exc) from exc
        if values[0] is None:
            return None
        holder = _Holder(scope, key_hash)
        record = self._record(holder, [b"found", now[0] * 1_000_000 + now[1], *values])
        return record.instance()

    def expire(self, scope: str, key_hash: str) -> IdempotencyKey | None:
        """Expire the key's record now, as its TTL would: Redis deletes it
        (:func:`django_idempotency.testing.expire_key`). Returns it, expired now."""
        record = self.read(scope, key_hash)
        if record is not None:
            self.client.delete(record_key(scope, key_hash, self.prefix))
            record.expires_at = timezone.now()  # as the database's expire_key leaves it
        return record

    def read_finished(self, identity: Any, bound: float) -> None:
        return None  # atomic mode only, which the Redis store refuses

    def peek_status(self, scope: str, key_hash: str, bound: float | None = None) -> Lock | None:
        key = record_key(scope, key_hash, self.prefix)
        try:
            client = self.client  # made first: the pool is known then
            if self._pool is not None:
                seconds = deadlines.LEAST if bound is None else bound
                (reply,) = self._exchange([("HMGET", key, "st", "ua")], seconds, "HMGET")
                if isinstance(reply, Exception):
                    raise reply
                status, unlock = reply
            else:
                status, unlock = client.hmget(key, "st", "ua")
        except failures() as exc:
            raise self.refusal(exc) from exc
        if status is None:
            return None
        return Lock(_text(status), _time(unlock))

    # -- the fenced writes -------------------------------------------------------------------

    def _key(self, pk: int) -> str:
        return self._records[pk][0]

    def store_response(
        self,
        pk: int,
        token: Any,
        stored: StoredResponse,
        *,
        stale_at: datetime | None = None,
        connection: Any = None,
        bound: float | None = None,
        release: Any = None,
    ) -> bool:
        assert release is None, "the outbox needs the database store (Claim.enqueue refuses)"
        headers, body = stored.sealed
        status = rules.stored_status(stored.status)
        key, scope, key_hash = self._records[pk]
        index = self._cluster is False
        done = self._run(
            "COMPLETE",
            [key, scope_index(scope, self.prefix)] if index else [key],
            [
                str(token),
                status,
                "" if stored.status is None else stored.status,
                json.dumps(headers, separators=(",", ":")),
                b"" if body is None else body,
                "0" if body is None else "1",
                "" if stored.ttl is None else _us(stored.ttl),
                key_hash,
            ],
            bound,
        )
        if done and not index:
            self._index(scope, key_hash, stored.ttl)
        self._records.pop(pk, None)
        return bool(done)

    def _index(self, scope: str, key_hash: str, ttl: timedelta | None) -> None:
        """On a cluster: add a finished record to its scope's index (erasure), after its
        script; the index forgets records past their expiry, and expires after the last."""
        from django_idempotency._conf.settings import conf

        lasts = ttl or conf.TTL
        now = time.time()
        index = scope_index(scope, self.prefix)
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.zadd(index, {key_hash: now + lasts.total_seconds()})
            pipe.zremrangebyscore(index, "-inf", now)
            pipe.expire(index, int(lasts.total_seconds()) + 1, gt=True)
            pipe.expire(index, int(lasts.total_seconds()) + 1, nx=True)
            pipe.execute()
        except Exception:  # the result is stored: only erasure would miss it
            logger.warning("Could not index an idempotency record for erasure.", exc_info=True)

    def finished(self, pk: int, token: Any, connection: Any) -> bool:
        return False  # a result stored whose reply was lost returns 2: never asked

    def has_recovery_point(self, pk: int, token: Any, name: str, connection: Any) -> bool:
        return False  # a recovery point written again matches again: never asked

    def save_recovery_point(
        self,
        pk: int,
        token: Any,
        name: str,
        data: Any,
        lock_timeout: timedelta,
        *,
        connection: Any = None,
        bound: float | None = None,
        release: Any = None,
    ) -> bool:
        assert release is None, "the outbox needs the database store (Claim.enqueue refuses)"
        encoded = json.dumps(data, separators=(",", ":"))
        saved = bool(
            self._run(
                "RECOVERY_POINT",
                [self._key(pk)],
                [str(token), name, encoded, _us(lock_timeout)],
                deadlines.bound(lock_timeout) if bound is None else bound,
            )
        )
        return saved  # lost (LockLost): the claim's release still comes, and its script refuses

    def unlock(
        self, pk: int, token: Any, *, connection: Any = None, bound: float | None = None
    ) -> bool:
        try:
            return bool(self._run("UNLOCK", [self._key(pk)], [str(token)], bound))
        finally:
            self._records.pop(pk, None)

    def release(
        self,
        pk: int,
        token: Any,
        *,
        stale_at: datetime | None = None,
        connection: Any = None,
        bound: float | None = None,
    ) -> bool:
        try:
            return bool(self._run("RELEASE", [self._key(pk)], [str(token)], bound))
        finally:
            self._records.pop(pk, None)

    def renew(
        self,
        leases: Sequence[tuple[int, Any]],
        lock_timeout: timedelta,
        bound: float | None = None,
    ) -> set[tuple[int, Any]]:
        """Push the locks of many claims forward: one pipeline of fenced scripts (one round
        trip), or on a cluster each node's locks apart (:meth:`_renew_cluster`); within
        ``bound`` seconds (the renewer's; by default a statement's share of the lock)."""

        known = [(pk, token) for pk, token in leases if pk in self._records]
        if not known:
            return set()
        lock = _us(lock_timeout)
        seconds = deadlines.bound(lock_timeout) if bound is None else bound
        try:
            script = self._script("RENEW")
            if self._pool is not None:
                # One write and its replies, on a connection of the store's own, within a
                # statement's share of the lock: a frozen server held the renewal for the
                # client's socket timeout, or for good.
                results = self._renew_bounded(script, known, lock, seconds)
            elif self._cluster:
                return self._renew_cluster(script, known, lock, seconds)
            else:
                pipe = self.client.pipeline(transaction=False)
                for pk, token in known:
                    script(keys=[self._key(pk)], args=[str(token), lock], client=pipe)
                results = pipe.execute()
        except failures() as exc:
            raise RedisFault(f"Redis store {self.display_name!r}: {exc}") from exc
        # A lock found lost keeps its record's entry: the owner's result write or release still
        # comes, and its script refuses it (a KeyError there was a crash instead, CI once).
        return {lease for lease, result in zip(known, results, strict=True) if result}

    def _renew_cluster(
        self, script: Any, known: list[tuple[int, Any]], lock: int, seconds: float
    ) -> set[tuple[int, Any]]:
        """A cluster's renewal: each node's locks on a thread of their own, one call per lock
        (routed to its record's slot), all within ``seconds``. With one call for every lock in
        turn, the first lock on a frozen or dead primary raised (or waited the client's socket
        timeout) and no lock on the healthy primaries was renewed: their owners were taken
        over (6 of 6 keys ran twice). A node that fails or does not answer in time
        costs its own locks' renewal alone: :class:`RenewalShortfall` says which locks were
        settled, and the renewer tries the others again; a thread still waiting on a frozen
        node is left to its socket's timeout (its late answer is not counted).

        Each node's calls go on a connection of the store's own to that node, made from the
        node's pool's settings, its socket timeout the renewal's bound (:meth:`_exchange`), not
        through the cluster's client: after one node's timeout, the client's next command, on
        any node, refreshed the topology from the frozen node first and waited its socket
        timeout there, so the healthy nodes' renewals missed their bound too."""
        by_node: dict[str, list[tuple[int, Any]]] = {}
        for pk, token in known:
            node = self.client.get_node_from_key(self._key(pk))
            by_node.setdefault(node.name, []).append((pk, token))
        answers: dict[int, bool] = {}
        errors: list[str] = []
        guard = threading.Lock()

        def renew_node(name: str, locks: list[tuple[int, Any]]) -> None:
            try:
                server = self.client.get_redis_connection(self.client.get_node(node_name=name))
                place = (name, server.connection_pool)
                replies = self._renew_bounded(script, locks, lock, seconds, place)
                with guard:
                    for (pk, _), reply in zip(locks, replies, strict=True):
                        answers[pk] = bool(reply)
            except Exception as exc:  # this node's fault: the other nodes' locks go on
                with guard:
                    errors.append(f"{name}: {type(exc).__name__}: {exc}")

        deadline = time.monotonic() + seconds
        threads = [
            threading.Thread(
                target=renew_node, args=(name, locks), name=f"{THREAD_PREFIX}{name}", daemon=True
            )
            for name, locks in by_node.items()
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(max(deadline - time.monotonic(), 0))
        with guard:  # what came in time: a late answer is not counted
            answered = dict(answers)
            faults = list(errors)
        held = {(pk, token) for pk, token in known if answered.get(pk)}
        if len(answered) < len(known):
            alive = zip(by_node, threads, strict=True)
            slow = [name for name, thread in alive if thread.is_alive()]
            why = faults + [f"{name}: no answer within {seconds:.2g}s" for name in slow]
            raise RenewalShortfall(
                f"Redis store {self.display_name!r}: {len(known) - len(answered)} of "
                f"{len(known)} lock(s) not renewed ({'; '.join(why)})",
                held,
                set(answered),
            )
        return held

    def _renew_bounded(
        self,
        script: Any,
        known: list[tuple[int, Any]],
        lock: int,
        seconds: float,
        node: tuple[str, Any] | None = None,
    ) -> list[Any]:
        """The renewal's scripts on a connection of the store's own (a cluster ``node``'s),
        within ``seconds``; a script the server lacks is loaded there (not through a cluster's
        client, which loads it on every primary, a frozen one too)."""
        import redis

        deadline = time.monotonic() + seconds
        commands = [
            ("EVALSHA", script.sha, 1, self._key(pk), str(token), lock) for pk, token in known
        ]
        replies = self._exchange(commands, seconds, "RENEW", node)
        if any(isinstance(reply, redis.exceptions.NoScriptError) for reply in replies):
            left = max(deadline - time.monotonic(), _LEAST_TRY)
            self._exchange([("SCRIPT", "LOAD", script.script)], left, "RENEW", node)
            left = max(deadline - time.monotonic(), _LEAST_TRY)
            replies = self._exchange(commands, left, "RENEW", node)
        for index, reply in enumerate(replies):
            if node is not None and str(reply).startswith(("MOVED", "ASK")):
                # A slot moved: through the cluster's client, which follows it.
                pk, token = known[index]
                reply = replies[index] = script(keys=[self._key(pk)], args=[str(token), lock])
            if isinstance(reply, Exception):
                raise reply
            if not _understood("RENEW", reply):
                raise _connection_fault("RENEW", reply)
        return replies

    # -- operations --------------------------------------------------------------------------

    def erase_scope(self, scope: str, *, dry_run: bool = False) -> tuple[int, int]:
        """Delete the scope's finished records now: (deleted, in progress)."""
        index = scope_index(scope, self.prefix)
        deleted = in_progress = 0
        for member in self.client.zrange(index, 0, -1):
            key_hash = _text(member)
            key = record_key(scope, key_hash, self.prefix)
            if dry_run:
                status = self.client.hget(key, "st")
                if status == b"processing":
                    in_progress += 1
                elif status is not None:
                    deleted += 1
                continue
            outcome = self._run("ERASE", [key], [], None)
            if outcome == 1:
                deleted += 1
            elif outcome == -1:
                in_progress += 1
            if outcome != -1:
                self.client.zrem(index, member)
        return deleted, in_progress

    def count(self) -> int:
        """How many records the store holds (a ``SCAN`` of its prefix: an operator's figure)."""
        return sum(1 for _ in self.client.scan_iter(match=f"{_glob(self.prefix)}r:*", count=1000))

    def records_of(self, key_hash: str) -> list[IdempotencyKey]:
        """The key's records in every scope (a ``SCAN`` for its hash; each read as
        :meth:`read` reads it, unsaved instances), oldest first: tests, operators."""
        found = []
        for name in self.client.scan_iter(
            match=f"{_glob(self.prefix)}r:{{*:{key_hash}}}", count=1000
        ):
            scope = self.client.hget(name, "sc")
            record = None if scope is None else self.read(_text(scope), key_hash)
            if record is not None:
                found.append(record)
        return sorted(found, key=lambda record: record.created_at)

    def census(self) -> dict[str, Any]:
        """The store's records by status, and how many are processing with their lock lapsed
        (taken over by their key's next request): one ``SCAN`` and pipelined ``HMGET`` calls,
        the times by the server's clock. Expired records are absent (Redis's TTL)."""
        client = self.client
        seconds, micro = client.time()
        now = int(seconds) * 1_000_000 + int(micro)
        by_status: dict[str, int] = {}
        stale = 0
        batch: list[Any] = []

        def tally() -> None:
            nonlocal stale
            pipe = client.pipeline(transaction=False)
            for name in batch:
                pipe.hmget(name, "st", "ua")
            for status, unlock in pipe.execute():
                if status is None:  # expired since the scan
                    continue
                text = _text(status)
                by_status[text] = by_status.get(text, 0) + 1
                if text == "processing" and unlock and int(unlock) <= now:
                    stale += 1
            batch.clear()

        for name in client.scan_iter(match=f"{_glob(self.prefix)}r:*", count=1000):
            batch.append(name)
            if len(batch) >= 1000:
                tally()
        if batch:
            tally()
        return {"total": sum(by_status.values()), "by_status": by_status, "stale": stale}


def _optional_int(value: bytes) -> int | None:
    return int(value) if value else None


def _token(value: bytes) -> uuid.UUID:
    return uuid.UUID(value.decode())


#: The Redis fields of the model's attributes, in their order (``rows.ATTNAMES``).
_ROW_FIELDS = (
    "id", "scope", "key_hash", "m", "p", "fp", "st", "rs", "rh", "rb", "rp", "rd", "tok", "att",
    "ca", "up", "ua", "ea",
)  # fmt: skip
assert len(_ROW_FIELDS) == len(ATTNAMES), ATTNAMES
_RP = _ROW_FIELDS.index("rp")
#: Where each row field after the key hash is in a ``found`` reply (``reply[2:]`` is the
#: fields in :data:`.scripts.FIELDS`' order; the unlock time ``ua`` may be absent: ``None``),
#: and the row fields the server's time stands in for when absent.
_FROM_REPLY = itemgetter(*(2 + scripts.FIELDS.index(name) for name in _ROW_FIELDS[3:]))
_OR_NOW = tuple(_ROW_FIELDS.index(name) for name in ("ca", "up", "ea"))
#: How each becomes the field's value (``None``: kept as it is), when first read.
_CONVERTERS = _Converters(
    [
        None,
        None,
        None,
        _text,
        _text,
        _text,
        _text,
        _optional_int,
        json.loads,
        bytes,
        _text,
        _data,
        _token,
        int,
        _time,
        _time,
        _time,
        _time,
    ]
)


class _Holder:
    def __init__(self, scope: str, key_hash: str) -> None:
        self.scope, self.key_hash = scope, key_hash


#: The kinds a claim's reply starts with (:data:`.scripts.CLAIM`).
_CLAIM_KINDS = frozenset((b"new", b"own", b"takeover", b"found"))


def _understood(name: str, reply: Any) -> bool:
    """Whether a reply is the script's: a claim's is a list led by its kind, every other
    script's a number. Anything else did not come from our script on a Redis server: a
    client connected to itself (a server down on a port of the ephemeral range: its own
    command read back) must not take it for a claim, or a write for done."""
    if name == "CLAIM":
        return isinstance(reply, list) and len(reply) > 1 and reply[0] in _CLAIM_KINDS
    return type(reply) is int


def _connection_fault(name: str, what: Any) -> Exception:
    """A reply that is not the script's, or a failure redis-py does not name as its own
    (``AttributeError`` from a handshake whose ``HELLO`` was answered with a list,
    ``ValueError`` from a socket closed under a read), as the connection's fault: tried
    again, or answered ``503``, not a ``500``."""
    import redis

    if isinstance(what, Exception):
        fault = redis.ConnectionError(f"{name}: the connection failed: {what!r}")
    else:
        fault = redis.ConnectionError(f"{name}: a reply that is not the script's: {what!r:.80}")
    setattr(fault, _UNEXPECTED, True)  # logged with its traceback
    return fault


#: Marks a fault of :func:`_connection_fault`: not redis-py's own, so not an expected outage.
_UNEXPECTED = "_idempotency_unexpected"


def _passing(exc: Exception) -> bool:
    """Whether a server's refusal passes: loading its data after a restart, a replica that
    became read-only in a failover, a cluster's slot moving."""
    text = str(exc).upper()
    return text.startswith(("LOADING", "READONLY", "TRYAGAIN", "MOVED", "ASK", "MASTERDOWN"))
