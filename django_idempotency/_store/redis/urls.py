"""A Redis store's URL, read as redis-py reads it: its places (``host:port``, many for
Sentinel and Cluster), its connection options, and the refusal of one that redis-py would read
as another server than the app shows. :meth:`.store.RedisStore.validate` refuses a bad URL at
startup with these (E060), and a cache alias's ``OPTIONS`` by the same tests of each option
(:func:`option_error`); :mod:`.clients` connects by them."""

from __future__ import annotations

from functools import lru_cache
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from django_idempotency._conf.values import Refused, display_name, short_error, url_authority

#: The query options of a Sentinel URL that are the sentinels' own credentials (the URL's
#: user and password are the master's).
SENTINEL_CREDENTIALS = ("sentinel_username", "sentinel_password")
#: What a port out of range is told.
PORT_RANGE = "a port is out of range (1-65535)."


def unambiguous(url: str) -> None:
    """``ValueError`` when the standard parse of a Redis URL (``urllib.parse.urlsplit``'s,
    which redis-py's ``from_url`` reads) does not find the server where the app's own parse
    (:func:`.._conf.values.url_authority`, which the app shows and connects Sentinel and
    Cluster places by) does, or when it has a fragment. A password's ``/``, ``?`` or ``#``
    not percent-encoded ends the authority early for the one and not for the other:
    ``redis://:S3cr@t/pw%#zz@host/0`` was shown as ``redis://host/0`` while redis-py sent
    ``S3cr`` as AUTH to the host ``t``. The message never shows the URL's user or password.
    The query's options are not read here: a bad value is :func:`redis_options`' to name
    (it was said to be "read as another server")."""
    scheme, _, rest = url.partition("://")
    parts = urlsplit(url)
    authority = url_authority(rest)[0]
    if parts.fragment or "#" in url:
        raise ValueError(
            f"{display_name(url)!r} has a fragment (#...), which a Redis URL has not: "
            "percent-encode a password's # (urllib.parse.quote(password, safe=''))."
        )
    agreed = parts.netloc == authority
    if agreed and not scheme.endswith(("+sentinel", "+cluster")) and scheme != "unix":
        agreed = _same_place(parts._replace(query="").geturl(), authority)
    if not agreed:
        raise ValueError(
            f"{display_name(url)!r} is read as another server by the standard URL parse "
            "(redis-py's) than the app's: percent-encode the password's @ / ? # and % "
            "(urllib.parse.quote(password, safe=''))."
        )


def _same_place(url: str, authority: str) -> bool:
    """Whether redis-py's parse of one server's ``url`` (its query dropped) finds the host
    and port of the app's ``authority``; ``ValueError`` for a port out of range."""
    from redis.connection import parse_url

    try:
        parsed = parse_url(url)  # type: ignore[no-untyped-call, unused-ignore]
    except ValueError as exc:
        if "out of range" in str(exc):
            raise ValueError(f"{display_name(url)!r}: {PORT_RANGE}") from None
        return False
    host, _, port = authority.rpartition("@")[2].rpartition(":")
    if not _ or not port.isdigit():
        host, port = authority.rpartition("@")[2], ""
    shown = unquote(host).strip("[]").lower()
    return (parsed.get("host") or "").lower() == shown and (
        not port or parsed.get("port") == int(port)
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
        # The port is not echoed: it may be a piece of a password whose "/" or "@" was
        # not percent-encoded.
        if number and not number.isdigit():
            raise ValueError(
                f"{display_name(url)!r}: a port is not a number (percent-encode a "
                'password\'s "/", "?", "#" and "@").'
            )
        if number and not 0 < int(number) <= 65535:
            raise ValueError(f"{display_name(url)!r}: {PORT_RANGE}")
        places.append((host or "127.0.0.1", int(number or port)))
    return places


def redis_options(url: str) -> dict[str, Any]:
    """The connection options of a Redis URL besides its places, as redis-py reads a single
    server's URL: its user and password (percent-decoded), TLS (``ssl``) for a ``rediss``
    scheme, and its query's options (``?ssl_ca_certs=...&ssl_cert_reqs=required``). A
    Sentinel's or a Cluster's URL names many places, which redis-py cannot read: its
    credentials and TLS were dropped, and every call was refused. ``ValueError``
    for an option redis-py cannot read, naming it and its value, without the URL's secrets.
    A Unix socket's URL is redis-py's own to connect by (its options are read for the check)."""
    from redis.connection import parse_url

    scheme, _, rest = url.partition("://")
    authority, _, tail = url_authority(rest)
    user, at, _ = authority.rpartition("@")
    query = tail.partition("?")[2].partition("#")[0]
    single = f"{'rediss' if scheme.startswith('rediss') else 'redis'}://{user}{at}place/"
    if scheme == "unix":
        single = "unix:///socket"
    try:
        options: dict[str, Any] = parse_url(  # type: ignore[no-untyped-call, unused-ignore]
            single + (f"?{query}" if query else "")
        )
    except ValueError:
        raise ValueError(f"{display_name(url)!r}: {_unreadable(query)}") from None
    for place in ("host", "port", "path", "connection_class"):
        options.pop(place, None)
    if scheme.startswith("rediss"):
        options["ssl"] = True
    if not scheme.endswith("+sentinel"):
        for name in SENTINEL_CREDENTIALS:
            if name in options:
                raise ValueError(f"{display_name(url)!r}: {name} is for a Sentinel URL.")
    return options


def _unreadable(query: str) -> str:
    """What redis-py cannot read in a URL's query: the first option whose value its own
    parser (``URL_QUERY_ARGUMENT_PARSERS``) refuses, named with its value."""
    from redis.connection import URL_QUERY_ARGUMENT_PARSERS

    for name, values in parse_qs(query).items():
        parser: Any = URL_QUERY_ARGUMENT_PARSERS.get(name)
        try:
            if parser is not None:
                parser(values[0])
        except (TypeError, ValueError):
            return f"redis-py cannot read {_shown(name, values[0])} ({_kind(parser)})."
    return "redis-py cannot read its query."


def _kind(parser: Any) -> str:
    """What redis-py's parser of an option reads, in words."""
    kinds = {int: "a whole number", float: "a number", "to_bool": "a boolean (1, 0, true, no)"}
    return kinds.get(parser, kinds.get(getattr(parser, "__name__", ""), "see redis-py's docs"))


def _shown(name: str, value: Any) -> str:
    """``?name=value`` as a message shows it: never a password's value."""
    return f"?{name}=***" if "password" in name else f"?{name}={value}"


def option_values(url: str, options: dict[str, Any]) -> None:
    """``ValueError`` for an option's value redis-py reads, but refuses (or the server does)
    when it connects, so that every keyed request answered ``503``: ``?protocol=9``,
    ``?ssl_cert_reqs=bogus``, an ``ssl_*`` option of a URL without TLS, a negative ``db``, a
    timeout that is not a positive number of seconds, a text redis-py passes on unread where
    it takes a boolean or a number (``?decode_responses=false`` read as true). The message
    names the option and its value (never a password)."""
    shown = display_name(url)
    made = _connection_class(url, options)
    query = url_authority(url.partition("://")[2])[2].partition("?")[2].partition("#")[0]
    written = {name: values[0] for name, values in parse_qs(query).items()}
    for name, value in options.items():
        if name in SENTINEL_CREDENTIALS or (name == "ssl" and value is True):
            continue
        if why := option_error(name, value, made, "the URL", url):
            raise ValueError(f"{shown!r}: {_shown(name, written.get(name))} {why}")


def option_error(name: str, value: Any, made: Any, where: str, url: str = "") -> str:
    """Why one connection option can never work (``""``: it can), as ``... {why}`` ends a
    message: each is given alone to the connection (or pool) class redis-py makes with it
    (``made``), which refuses what it refuses when made (its own reading, so the two never
    disagree); what it reads only at connect time is checked here. ``where`` names what
    has no TLS for an ``ssl_*`` option (``the URL``); redis-py's words never show ``url``'s
    secrets."""
    from redis.connection import ConnectionPool

    takes = _parameters(made)
    if name.startswith("ssl_") and "ssl_keyfile" not in takes:
        return (
            f"is a TLS option, and {where} has no TLS (rediss://, rediss+sentinel://, "
            "rediss+cluster://)."
        )
    if why := _mistyped(name, value) or _out_of_range(name, value):
        return f"{why}."
    maker = made if name in takes else ConnectionPool if name == "max_connections" else None
    try:
        if maker is not None:
            maker(**{name: value})
    except Exception as exc:
        return f"is refused by redis-py ({short_error(exc, url)})."
    return ""


#: The options redis-py takes as text (its URL's query passes them on as text).
TEXT_OPTIONS = frozenset(
    {
        *("username", "password", "client_name", "lib_name", "lib_version", "encoding"),
        *("encoding_errors", "ssl_keyfile", "ssl_certfile", "ssl_cert_reqs", "ssl_ca_certs"),
        *("ssl_ca_path", "ssl_ca_data", "ssl_password", "ssl_ciphers", "ssl_ocsp_expected_cert"),
        *("ssl_min_version", "force_master_ip", *SENTINEL_CREDENTIALS),
    }
)
#: Options taken as text and read by the class redis-py makes with them (redis-py 5.3 reads
#: no ``protocol`` from a URL; its connection does).
READ_WHEN_MADE = frozenset({"protocol"})


def _mistyped(name: str, value: Any) -> str:
    """Why a value is not of the kind redis-py uses (``""``: it is): a boolean that is not
    one (any non-empty text is true to redis-py: ``?decode_responses=false`` read as true),
    text where redis-py takes a number or an object and passes the URL's text on unread, and
    ``decode_responses`` true, which the store cannot read its replies with (bytes)."""
    if name == "ssl":
        return "is not read as TLS: TLS is the rediss:// scheme"
    if name == "decode_responses" and value is True:
        return "cannot work: the store reads its replies as bytes (leave it false)"
    boolean = _default(name) is bool
    if isinstance(value, str) and name not in TEXT_OPTIONS | READ_WHEN_MADE:
        kind = "any text is true to it" if boolean else "it takes a number or an object there"
        return f"is text, which this redis-py passes on unread: {kind}"
    if boolean and value is not None and not isinstance(value, bool):
        return "is not a boolean (True or False)"
    return ""


def _default(name: str) -> type | None:
    """The type of an option's default in redis-py's classes (``None``: none has one)."""
    return _defaults().get(name)


@lru_cache(maxsize=1)
def _defaults() -> dict[str, type]:
    """The type of each option's default that is a boolean, in redis-py's classes."""
    import inspect

    found: dict[str, type] = {}
    for each in _option_classes():
        if (init := each.__dict__.get("__init__")) is not None:
            for name, parameter in inspect.signature(init).parameters.items():
                if isinstance(parameter.default, bool):
                    found[name] = bool
    return found


#: The ``OPTIONS`` of Django's ``RedisCache`` that its client reads itself (the rest are its
#: pool's and connections' keywords).
DJANGO_CACHE_OPTIONS = frozenset({"serializer", "pool_class", "parser_class"})
#: django-redis's ``OPTIONS`` that it gives the connections, by the keyword it gives them as.
DJANGO_REDIS_OPTIONS = {name: name.lower() for name in ("SOCKET_TIMEOUT", "SOCKET_CONNECT_TIMEOUT")}


def cache_options(alias: str) -> None:
    """:class:`.._conf.values.Refused` for a connection option of the ``CACHES`` alias that
    can never work, checked as a URL's query is (:func:`option_error`), without a connection:
    ``OPTIONS={"protocol": 9}`` passed startup and every keyed request answered ``503``.
    Django's ``RedisCache`` gives its ``OPTIONS`` to its pool (an unknown one too, refused at
    the first connection); django-redis its ``CONNECTION_POOL_KWARGS`` and socket timeouts."""
    from django.conf import settings

    cache: dict[str, Any] = settings.CACHES[alias]
    raw: dict[str, Any] = cache.get("OPTIONS") or {}
    location = cache.get("LOCATION") or ""
    first = str(location if isinstance(location, str) else next(iter(location), ""))
    if str(cache.get("BACKEND", "")).startswith("django_redis."):
        options = dict(raw.get("CONNECTION_POOL_KWARGS") or {})
        options |= {kw: raw[name] for name, kw in DJANGO_REDIS_OPTIONS.items() if name in raw}
        written = "CONNECTION_POOL_KWARGS"
    else:
        options = {name: value for name, value in raw.items() if name not in DJANGO_CACHE_OPTIONS}
        written = "OPTIONS"
        if "pool_class" not in raw and (unknown := sorted(set(options) - _known_options())):
            raise Refused(
                f"CACHES[{alias!r}]['OPTIONS']: redis-py takes no option "
                f"{', '.join(unknown)} (a typo?).",
                CACHE_HINT,
            )
    made = options.get("connection_class") or _connection_class(
        first.split(",")[0].split(";")[0], {"ssl": first.startswith("rediss")}
    )
    for name, value in options.items():
        if name != "connection_class" and (why := option_error(name, value, made, "LOCATION")):
            shown = "***" if "password" in name else repr(value)
            raise Refused(f"CACHES[{alias!r}]: {written} {name}={shown} {why}", CACHE_HINT)


#: The hint of a cache alias's option refused.
CACHE_HINT = "Correct the cache's OPTIONS as the message says (docs: 'Choosing the store')."


def _connection_class(url: str, options: dict[str, Any]) -> Any:
    """The connection class redis-py makes for ``url``: TLS's, a Unix socket's, or plain."""
    from redis import connection

    if url.startswith("unix://"):
        return connection.UnixDomainSocketConnection
    return connection.SSLConnection if options.get("ssl") else connection.Connection


def _parameters(cls: Any) -> frozenset[str]:
    """The keywords a connection class and its bases take."""
    import inspect

    names: set[str] = set()
    for each in cls.__mro__:
        if (init := each.__dict__.get("__init__")) is not None:
            names |= set(inspect.signature(init).parameters) - {"self", "kwargs", "args"}
    return frozenset(names)


def _out_of_range(name: str, value: Any) -> str:
    """Why a value redis-py takes when made is refused when it connects (``""``: it is not):
    the socket's timeouts, the database's number, the read size, the lowest TLS version."""
    import math
    import ssl

    timeout = name in ("socket_timeout", "socket_connect_timeout") and value is not None
    if timeout and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        return "is not a positive number of seconds"
    if name == "db" and isinstance(value, int) and value < 0:
        return "is no database's number (0 and up)"
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if name == "health_check_interval" and not (number and math.isfinite(value) and value >= 0):
        return "is not a number of seconds (0 and up)"
    if name == "socket_read_size" and isinstance(value, int) and value < 1:
        return "is not a positive number of bytes"
    if name == "ssl_min_version" and isinstance(value, str):
        return "is text to this redis-py, which reads no TLS version from a URL"
    if name == "ssl_min_version" and value is not None:
        try:
            ssl.TLSVersion(value)
        except ValueError:
            return f"is no TLS version ({', '.join(str(v.value) for v in ssl.TLSVersion)})"
    return ""


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

    from redis.cluster import REDIS_ALLOWED_KEYS

    names = {*REDIS_ALLOWED_KEYS, *SENTINEL_CREDENTIALS}
    for each in _option_classes():
        init = each.__dict__.get("__init__")
        if init is not None:
            names |= set(inspect.signature(init).parameters) - {"self", "kwargs", "args"}
    return frozenset(names)


def _option_classes() -> list[Any]:
    """redis-py's classes the store's clients are made of: their keywords are its options."""
    from redis import Redis, connection, sentinel
    from redis.cluster import RedisCluster

    return [
        *connection.SSLConnection.__mro__,
        *connection.UnixDomainSocketConnection.__mro__,
        *(connection.ConnectionPool, sentinel.Sentinel, Redis, RedisCluster),
    ]
