"""A Redis store's URL, read as redis-py reads it: its places (``host:port``, many for
Sentinel and Cluster), its connection options, and the refusal of one that redis-py would read
as another server than the app shows. :meth:`.store.RedisStore.validate` refuses a bad URL at
startup with these (E060), and :mod:`.clients` connects by them."""

from __future__ import annotations

from functools import lru_cache
from typing import Any
from urllib.parse import unquote, urlsplit

from django_idempotency._conf.values import display_name, url_authority

#: The query options of a Sentinel URL that are the sentinels' own credentials (the URL's
#: user and password are the master's).
SENTINEL_CREDENTIALS = ("sentinel_username", "sentinel_password")


def unambiguous(url: str) -> None:
    """``ValueError`` when the standard parse of a Redis URL (``urllib.parse.urlsplit``'s,
    which redis-py's ``from_url`` reads) does not find the server where the app's own parse
    (:func:`.._conf.values.url_authority`, which the app shows and connects Sentinel and
    Cluster places by) does, or when it has a fragment. A password's ``/``, ``?`` or ``#``
    not percent-encoded ends the authority early for the one and not for the other:
    ``redis://:S3cr@t/pw%#zz@host/0`` was shown as ``redis://host/0`` while redis-py sent
    ``S3cr`` as AUTH to the host ``t``. The message never shows the URL's user or password."""
    scheme, _, rest = url.partition("://")
    parts = urlsplit(url)
    authority = url_authority(rest)[0]
    agreed = parts.netloc == authority and not parts.fragment and "#" not in url
    if agreed and not scheme.endswith(("+sentinel", "+cluster")) and scheme != "unix":
        from redis.connection import parse_url

        try:
            parsed = parse_url(url)  # type: ignore[no-untyped-call, unused-ignore]
        except ValueError:
            agreed = False
        else:
            host, _, port = authority.rpartition("@")[2].rpartition(":")
            if not _ or not port.isdigit():
                host, port = authority.rpartition("@")[2], ""
            shown = unquote(host).strip("[]").lower()
            agreed = (parsed.get("host") or "").lower() == shown and (
                not port or parsed.get("port") == int(port)
            )
    if not agreed:
        raise ValueError(
            f"{display_name(url)!r} is read as another server by the standard URL parse "
            "(redis-py's) than the app's: percent-encode the password's @ / ? # and % "
            "(urllib.parse.quote(password, safe='')); a Redis URL has no fragment (#)."
        )


def redis_places(url: str, port: int) -> list[tuple[str, int]]:
    """The ``host:port`` places of a Redis URL's netloc (comma-separated for Sentinel and
    Cluster), ``port`` where one has none; ``ValueError`` for a port that is not a number."""
    from urllib.parse import urlsplit

    places = []
    for place in urlsplit(url).netloc.rpartition("@")[2].split(","):
        host, colon, number = place.rpartition(":")
        if not colon:
            host, number = number, ""
        if number and not number.isdigit():
            # The port is not echoed: it may be a piece of a password whose "/" or "@" was
            # not percent-encoded.
            raise ValueError(
                f"{display_name(url)!r}: a port is not a number (percent-encode a password's "
                '"/", "?", "#" and "@").'
            )
        places.append((host or "127.0.0.1", int(number or port)))
    return places


def redis_options(url: str) -> dict[str, Any]:
    """The connection options of a Redis URL besides its places, as redis-py reads a single
    server's URL: its user and password (percent-decoded), TLS (``ssl``) for a ``rediss``
    scheme, and its query's options (``?ssl_ca_certs=...&ssl_cert_reqs=required``). A
    Sentinel's or a Cluster's URL names many places, which redis-py cannot read: its
    credentials and TLS were dropped, and every call was refused. ``ValueError``
    for an option redis-py cannot read, in words without the URL's secrets."""
    from redis.connection import parse_url

    scheme, _, rest = url.partition("://")
    if scheme == "unix":
        return {}
    authority, _, tail = url_authority(rest)
    user, at, _ = authority.rpartition("@")
    query = tail.partition("?")[2].partition("#")[0]
    single = f"{'rediss' if scheme.startswith('rediss') else 'redis'}://{user}{at}place/"
    try:
        options: dict[str, Any] = parse_url(  # type: ignore[no-untyped-call, unused-ignore]
            single + (f"?{query}" if query else "")
        )
    except ValueError as exc:
        raise ValueError(f"{display_name(url)!r}: {exc}") from None
    for place in ("host", "port", "path", "connection_class"):
        options.pop(place, None)
    if scheme.startswith("rediss"):
        options["ssl"] = True
    if not scheme.endswith("+sentinel"):
        for name in SENTINEL_CREDENTIALS:
            if name in options:
                raise ValueError(f"{display_name(url)!r}: {name} is for a Sentinel URL.")
    return options


def redis_path(url: str) -> None:
    """``ValueError`` for a path redis-py would not read as the URL says: one server's path is
    its database's number (redis-py read ``/1O`` as database 0, and ``/-1`` failed every
    call), a Sentinel's is its master's name and then that number (without it, every call
    failed); a cluster has database 0 alone (``/3`` was dropped unsaid, ``?db=3`` failed every
    call), a Unix socket's path is its file."""
    from urllib.parse import parse_qs, urlsplit

    scheme = url.partition("://")[0]
    if scheme == "unix":
        return
    parts = [unquote(part) for part in urlsplit(url).path.split("/") if part]
    if scheme.endswith("+cluster"):
        if parts not in ([], ["0"]) or parse_qs(urlsplit(url).query).get("db", ["0"]) != ["0"]:
            raise ValueError(f"{display_name(url)!r}: a Redis Cluster has database 0 only.")
        return
    if scheme.endswith("+sentinel"):
        if not parts:
            raise ValueError(
                f"{display_name(url)!r} names no master: redis+sentinel://host:port/master."
            )
        parts = parts[1:]
    if len(parts) > 1 or (parts and not parts[0].isdigit()):
        raise ValueError(
            f"{display_name(url)!r}: the path after the server is a database number (/0), "
            "or use ?db=N."
        )


def unknown_options(url: str, options: dict[str, Any]) -> None:
    """``ValueError`` for a query option no redis-py class the store makes takes: one server's
    connection refused it on every call (``socket_timout=5``: every keyed request answered
    ``503``), and a cluster's client dropped it unsaid."""
    unknown = sorted(set(options) - _known_options())
    if unknown:
        raise ValueError(
            f"{display_name(url)!r}: redis-py takes no option {', '.join(unknown)} (a typo?)."
        )


@lru_cache(maxsize=1)
def _known_options() -> frozenset[str]:
    """The keywords of redis-py's connections, pools, Sentinel and cluster clients."""
    import inspect

    from redis import Redis, connection, sentinel
    from redis.cluster import REDIS_ALLOWED_KEYS, RedisCluster

    classes = [
        *connection.SSLConnection.__mro__,
        *connection.UnixDomainSocketConnection.__mro__,
        *(connection.ConnectionPool, sentinel.Sentinel, Redis, RedisCluster),
    ]
    names = {*REDIS_ALLOWED_KEYS, *SENTINEL_CREDENTIALS}
    for each in classes:
        init = each.__dict__.get("__init__")
        if init is not None:
            names |= set(inspect.signature(init).parameters) - {"self", "kwargs", "args"}
    return frozenset(names)
