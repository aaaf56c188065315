"""What each setting and view option may be: one test per kind of value.

A test takes the value and the name to call it by (``IDEMPOTENCY['TTL']`` for a setting, ``ttl``
for a view's option) and returns the value as the code uses it, or raises ``TypeError`` or
``ValueError`` with a message that names it. The system checks and a view's options run the
same tests (:mod:`._conf` says which apply where), so a value is refused in the same words
wherever it is given. Above each test, :func:`refusing` says what its system check refuses (the
row of ``docs/checks.rst``, after the setting's name) and the check's hint: a check's words
stand together, its id on its setting's line.
"""

from __future__ import annotations

import base64
import binascii
import importlib.util
import inspect
import re
from collections.abc import Callable, Iterable
from datetime import timedelta
from functools import cache
from typing import Any
from urllib.parse import urlsplit

from django.utils.module_loading import import_string

from django_idempotency._base import durations
from django_idempotency._base.keys import MAX_KEY_LENGTH, KeyFormat
from django_idempotency._base.keys import key_format as _key_format
from django_idempotency._conf import stores

# Re-exported: where the rest of the package has always read them.
from django_idempotency._conf.stores import CACHE_PREFIX as CACHE_PREFIX
from django_idempotency._conf.stores import DATABASE as DATABASE

#: ``(value, name) -> value as used``; raises ``TypeError`` or ``ValueError`` naming it.
Test = Callable[[Any, str], Any]

#: What a check's hint is when its test gives none.
DOCS = "See https://django-idempotency.readthedocs.io/en/latest/settings.html"


class Refused(ValueError):
    """A value refused with a hint of its own, which the check gives instead of its usual one
    (a URL refused is not told about ``CACHES``)."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


def refusing(refuses: str, hint: str = DOCS) -> Callable[[Test], Test]:
    """Mark a test with what its system check refuses and the check's hint."""

    def mark(test: Test) -> Test:
        test.refuses = refuses  # type: ignore[attr-defined]
        test.hint = hint  # type: ignore[attr-defined]
        return test

    return mark


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
IN_PROGRESS_POLICIES = ("conflict", "wait", "accepted")
#: Never stored, whatever ``REPLAYED_HEADERS`` says: cookies belong to one client's session,
#: and hop-by-hop headers to one connection.
NEVER_STORED = frozenset(
    {
        "set-cookie",
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
    }
)
#: Stored and replayed, whatever ``REPLAYED_HEADERS`` says: a private response replayed must
#: stay private to caches (``Cache-Control: no-store, private``), and a response chosen by a
#: request header must say so to them (``Vary``).
ALWAYS_STORED = frozenset({"cache-control", "vary"})
#: The arguments each function of the request is called with.
SCOPE_ARGUMENTS = ("request",)
FINGERPRINT_ARGUMENTS = ("request", "scope")


@refusing("is not a boolean")
def boolean(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {value!r}.")
    return value


@refusing("is not a header name")
def header_name(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value or not value.isascii() or " " in value:
        raise ValueError(f"{name} must be a non-empty header name, not {value!r}.")
    return value


#: Headers that carry a credential: as ``HEADER`` the credential would be the key, and its
#: unsalted SHA-256 (a key is stored as its hash) shown to the admin's staff.
CREDENTIAL_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "cookie", "x-csrftoken", "x-csrf-token", "x-api-key"}
)


@refusing(
    "names a header that carries a credential (``Authorization``, ``Cookie``...)",
    "The key would be the credential, and its unsalted SHA-256 shown in the admin; use a "
    "header of its own, such as Idempotency-Key.",
)
def not_a_credential(value: str, name: str) -> str:
    if value.lower() in CREDENTIAL_HEADERS:
        raise ValueError(
            f"{name} is {value!r}, a header that carries a credential: the credential would "
            "be the idempotency key."
        )
    return value


@refusing("is empty or not a list of methods")
def methods(value: Any, name: str) -> frozenset[str]:
    items = _strings(value, name, "a non-empty list of HTTP methods", empty=False)
    return frozenset(method.upper() for method in items)


@refusing(
    "lists safe methods (GET, HEAD, OPTIONS, TRACE)",
    "Safe methods are never protected; list POST, PATCH, PUT or DELETE.",
)
def unsafe_methods(value: frozenset[str], name: str) -> frozenset[str]:
    return _none_of(value, SAFE_METHODS, name, "safe methods {}, which are never protected")


@refusing("is not a positive duration")
def positive_duration(value: Any, name: str) -> timedelta:
    return durations.positive(value, name)


@refusing(
    f"is shorter than {durations.MIN_LOCK_TIMEOUT.total_seconds():g} second, the least "
    "deadline of the statement that claims the lock",
    "A claim may take a second and still succeed; with a shorter lock it has lapsed when the "
    "claim returns, and every duplicate takes the record over while the view runs "
    "(docs: 'LOCK_TIMEOUT').",
)
def lock_duration(value: timedelta, name: str) -> timedelta:
    """A lock no shorter than :data:`~.._base.durations.MIN_LOCK_TIMEOUT` (after
    :func:`positive_duration`)."""
    if value < durations.MIN_LOCK_TIMEOUT:
        raise ValueError(
            f"{name} must be at least {durations.MIN_LOCK_TIMEOUT.total_seconds():g} second "
            f"(the least deadline of the statement that claims the lock), not {value}."
        )
    return value


@refusing('is not ``"conflict"``, ``"wait"`` or ``"accepted"``')
def in_progress(value: Any, name: str) -> str:
    if value not in IN_PROGRESS_POLICIES:
        raise ValueError(f"{name} must be one of {IN_PROGRESS_POLICIES}, not {value!r}.")
    return str(value)


@refusing("is not a positive integer")
def positive_int(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, not {value!r}.")
    return value


@refusing("is not a whole number of replicas (0 or more)")
def replica_count(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be a whole number of replicas (0 or more), not {value!r}.")
    return value


@refusing("is not a collection of HTTP statuses")
def statuses(value: Any, name: str) -> frozenset[int]:
    items = _items(value)
    if not all(isinstance(code, int) and 100 <= code <= 599 for code in items or [None]):
        raise TypeError(f"{name} must be a collection of HTTP statuses, not {value!r}.")
    return frozenset(items or ())


@refusing("is not 422 or 400")
def mismatch_status(value: Any, name: str) -> int:
    if value not in (400, 422) or isinstance(value, bool):
        raise ValueError(f"{name} must be 422 or 400, not {value!r}.")
    return int(value)


@refusing(f"is not an integer from 1 to {MAX_KEY_LENGTH}")
def key_length(value: Any, name: str) -> int:
    if positive_int(value, name) > MAX_KEY_LENGTH:
        raise ValueError(f"{name} must be an integer from 1 to {MAX_KEY_LENGTH}, not {value!r}.")
    return int(value)


@refusing("is not a list of header names")
def header_names(value: Any, name: str) -> frozenset[str]:
    return frozenset(header.lower() for header in _strings(value, name, "a list of header names"))


@refusing(
    "lists ``Set-Cookie`` or a hop-by-hop header",
    "Cookies belong to one client and hop-by-hop headers to one connection.",
)
def stored_headers(value: frozenset[str], name: str) -> frozenset[str]:
    return _none_of(value, NEVER_STORED, name, "{}, which are never stored")


def _none_of(
    value: frozenset[str], refused: frozenset[str], name: str, what: str
) -> frozenset[str]:
    """``value``, unless it holds any of ``refused``: ``what`` says why, ``{}`` the ones found."""
    if found := value & refused:
        raise ValueError(f"{name} lists {what.format(sorted(found))}.")
    return value


@refusing("cannot be imported or is not callable")
def importable(value: Any, name: str) -> Callable[..., Any]:
    """A dotted path to a callable, or the callable itself."""
    try:
        return import_callable(value)
    except (ImportError, TypeError, ValueError) as exc:
        raise TypeError(f"{name} cannot be used: {exc}") from exc


@refusing("is not ``None`` or a function called as ``f(request)``")
def optional_scope_function(value: Any, name: str) -> Callable[..., Any] | None:
    """The status endpoint's scope function; ``None``: the scope setting's."""
    if value is None:
        return None
    function: Callable[..., Any] = importable(value, name)
    if error := signature_error(function, SCOPE_ARGUMENTS):
        raise TypeError(f"{name} {error}")
    return function


def import_callable(path_or_callable: object) -> Callable[..., Any]:
    resolved = (
        import_string(path_or_callable) if isinstance(path_or_callable, str) else path_or_callable
    )
    if not callable(resolved):
        raise TypeError(f"{path_or_callable!r} is not callable.")
    return resolved  # type: ignore[no-any-return]


def hashable(value: Any, name: str) -> Any:
    """A view's options are cached with it (``Options.resolve``)."""
    try:
        hash(value)
    except TypeError:
        raise TypeError(
            f"{name} must be hashable, and {type(value).__name__} is not: a dataclass needs "
            "frozen=True (or eq=False), a class defining __eq__ needs __hash__."
        ) from None
    return value


def called_as(*arguments: str) -> Test:
    """The test of a function called with ``arguments`` (a scope or a fingerprint function)."""

    wanted = f"f({', '.join(arguments)})"

    @refusing(f"cannot be called as ``{wanted}``", f"It is called as {wanted} and returns a str.")
    def test(value: Any, name: str) -> Callable[..., Any]:
        if error := signature_error(value, arguments):
            raise TypeError(f"{name} {error}")
        return value  # type: ignore[no-any-return]

    return test


@cache
def signature_error(function: Callable[..., Any], arguments: tuple[str, ...]) -> str | None:
    """Why ``function`` cannot be called with ``arguments`` positionally, or ``None``.

    Checked when the view is decorated (and by the system checks for the settings), so a
    ``def scope(self, request)`` fails at import rather than on the first request. Cached: the
    DRF mixin builds its options on every request.
    """
    if not callable(function):
        return f"must be a callable taking ({', '.join(arguments)}), not {function!r}."
    wanted = f"f({', '.join(arguments)})"
    try:
        signature = inspect.signature(function)
    except ValueError:  # no signature to read (some builtins): trust it
        return None
    if next(iter(signature.parameters), None) in ("self", "cls"):
        # A method written in a view class: it is read from the class, and called unbound.
        return f"{function!r} is called as {wanted}, without self: use a staticmethod."
    try:
        signature.bind(*arguments)
    except TypeError:
        return f"{function!r} cannot be called as {wanted}."
    return None


@refusing(
    'is not ``"any"``, ``"uuid"`` or a compiled regular expression (a string is never a pattern)',
    "A string is a name ('any' or 'uuid'), never a pattern: give a pattern as re.compile(r'...').",
)
def key_format(value: Any, name: str) -> KeyFormat:
    return _key_format(value, name)


# RFC 3986: a scheme, then no space or control character; http(s) URIs need a host.
_ABSOLUTE_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:[!-~]+")


@refusing(
    "is not an absolute URI",
    "Problem slugs are appended to it to make each problem's 'type', e.g. 'https://api.example.com/docs/errors#'.",
)
def absolute_uri(value: Any, name: str) -> str:
    if isinstance(value, str) and _ABSOLUTE_URI.fullmatch(value):
        parts = urlsplit(value)
        if parts.scheme.lower() not in ("http", "https") or parts.hostname:
            return value
    raise ValueError(f"{name} must be an absolute URI, not {value!r}.")


@refusing("is not ``None`` or a positive integer")
def optional_positive_int(value: Any, name: str) -> int | None:
    return None if value is None else positive_int(value, name)


@refusing(
    "is not a list of Fernet keys (URL-safe base64 of 32 bytes)",
    "Make a key with Fernet.generate_key().",
)
def fernet_keys(value: Any, name: str) -> tuple[bytes, ...]:
    """Fernet keys (URL-safe base64 of 32 bytes, as ``Fernet.generate_key()`` makes them), as
    bytes; the message names a bad key by its position, never by its value (a secret)."""
    items = _items(value)
    if items is None:
        raise TypeError(f"{name} must be a list of Fernet keys, not {type(value).__name__}.")
    keys = []
    for index, key in enumerate(items):
        raw = key.encode("ascii", "replace") if isinstance(key, str) else key
        if not isinstance(raw, bytes) or len(_urlsafe_b64decode(raw)) != 32:
            raise ValueError(
                f"{name}[{index}] is not a Fernet key (URL-safe base64 of 32 bytes, as "
                "cryptography's Fernet.generate_key() returns)."
            )
        keys.append(raw)
    return tuple(keys)


@refusing("is set but ``cryptography`` is not installed (the ``encryption`` extra)")
def encryption_available(value: tuple[bytes, ...], name: str) -> tuple[bytes, ...]:
    if value and importlib.util.find_spec("cryptography") is None:
        raise ValueError(
            f"{name} is set, but the cryptography package is not installed: "
            "pip install 'django-idempotency[encryption]'."
        )
    return value


def _urlsafe_b64decode(raw: bytes) -> bytes:
    try:
        return base64.urlsafe_b64decode(raw)
    except (ValueError, binascii.Error):
        return b""


def _items(value: object) -> list[Any] | None:
    """The items of a collection; ``None`` for a string or a value that is none."""
    if isinstance(value, str) or not isinstance(value, Iterable):
        return None
    return list(value)


def _strings(value: object, name: str, what: str, *, empty: bool = True) -> list[str]:
    """The strings of a list; ``TypeError`` saying it must be ``what`` if it is not one."""
    items = _items(value)
    if items is None or not all(isinstance(item, str) for item in items) or not (items or empty):
        raise TypeError(f"{name} must be {what}, not {value!r}.")
    return items


@refusing(
    '``STORE`` is not ``"database"``, an alias of ``CACHES`` whose backend is Redis, or a '
    "``redis://`` (or ``rediss://``, ``redis+sentinel://``, ``redis+cluster://``) URL; or its "
    "URL's scheme is no registered store's, or a connection option of the URL (its query) or "
    "of the cache (``OPTIONS``) can never work",
    "Name a CACHES alias with django.core.cache.backends.redis.RedisCache (or django-redis), "
    "or give a redis:// URL (docs: 'Choosing the store').",
)
def store(value: Any, name: str) -> str:
    """Where records live: the database, or a store of the registry (:mod:`.stores`) named by
    a cache alias or a URL, whose class judges the value (``validate``). One that can never
    work (a cache no store serves) is refused before any view runs."""
    if not isinstance(value, str) or not value:
        raise TypeError(f"{name} must be 'database', a CACHES alias or a redis:// URL.")
    if value == DATABASE:
        return value
    url = "://" in value
    form = stores.form(value if url else CACHE_PREFIX + value)
    kind = stores.kind(form)
    if kind is None and url:
        raise Refused(
            f"{name} {display_name(value)!r}: no registered store serves the scheme {form!r}.",
            UNREGISTERED_HINT,
        )
    if kind is None and form is None:
        raise ValueError(
            f"{name} {display_name(value)!r} is not 'database', an alias of CACHES or a URL."
        )
    if kind is None:
        raise ValueError(
            f"{name}: CACHES[{value!r}] uses {form!r}, which is not Redis (no store serves it)."
        )
    try:
        kind.validate(value, name)
    except ValueError as exc:
        if isinstance(exc, Refused) or not url:
            raise  # its own hint, or a CACHES alias's (the check's usual one)
        raise Refused(str(exc), URL_HINT) from None
    if url:
        _NAMED.add(value)
    return value


#: The hint of a ``STORE`` URL refused: the URL was given, so it is the URL to fix.
URL_HINT = "Correct the URL as the message says (docs: 'Choosing the store')."
#: The hint of a URL whose scheme the store registry does not have.
UNREGISTERED_HINT = (
    "Use redis://, rediss://, unix://, redis[s]+sentinel:// or redis[s]+cluster://; a store "
    "of your own is registered in django_idempotency._conf.stores.STORES from an app listed "
    "before django_idempotency in INSTALLED_APPS (docs: 'Adding a store')."
)


#: The URLs ``STORE`` or an option named in this process (:func:`store`): a status endpoint
#: finds an operation's store among them (a cache alias is found in ``CACHES``).
_NAMED: set[str] = set()


def named_stores() -> frozenset[str]:
    """The stores given as URLs so far (:data:`_NAMED`)."""
    return frozenset(_NAMED)


def url_authority(rest: str) -> tuple[str, str, str]:
    """A URL's authority (after ``scheme://``), and the rest (path, query): the authority runs
    to the last ``@`` of the URL, then to its first ``/`` or ``?`` (a password's ``/`` not
    percent-encoded stays in the authority, never in a shown path)."""
    user, at, after = rest.rpartition("@")
    cut = min((at for at in (after.find("/"), after.find("?")) if at >= 0), default=len(after))
    return user + at + after[:cut], "", after[cut:]


#: Which of a URL's query options are secrets: their values are never shown.
_SECRET_OPTION = re.compile(r"pass|secret|token|auth|key(?!file)", re.IGNORECASE)


def display_name(store: str) -> str:
    """How the app names a store wherever it writes (messages, logs, checks, the admin,
    commands and their JSON keys): a database alias or ``cache:<alias>`` as it is, a URL
    without its user and password (and the values of its query's secrets, ``***``). A
    ``STORE`` of ``redis://:PASSWORD@host/0`` showed its password to view-only staff, in
    check messages, commands' output and logs."""
    scheme, sep, rest = store.partition("://")
    if not sep:  # an alias; or a URL mistyped ("redis:/:secret@host"): cut through its "@"
        return store.rpartition("@")[2]
    if _secret_holds_at(store):
        # Neither parse can be trusted to tell the host from the secrets: none is shown.
        return f"{scheme}://***"
    authority, _, tail = url_authority(rest)
    place = authority.rpartition("@")[2]
    path, question, query = tail.partition("#")[0].partition("?")
    return f"{scheme}://{place}{path}{question}{_redacted(query) if question else ''}"


def _redacted(query: str) -> str:
    """A URL's query with its secret options' values ``***``."""
    return "&".join(
        f"{option.partition('=')[0]}=***" if _SECRET_OPTION.search(option.partition("=")[0])
        else option
        for option in query.split("&")
    )  # fmt: skip


def _secret_holds_at(store: str) -> bool:
    """Whether a secret query option's value (as the standard parse reads the query) holds an
    ``@`` not percent-encoded: the app's authority runs to the URL's last ``@``, so the
    shown host was a piece of that secret (``?ssl_password=Pw@48/s3cret`` showed
    ``48/s3cret``), and a password's ``/`` or ``?`` not percent-encoded beside it leaves the
    standard parse no better."""
    try:
        query = urlsplit(store).query
    except ValueError:
        return False
    options = [option.partition("=") for option in query.split("&")]
    return any("@" in value for name, _, value in options if _SECRET_OPTION.search(name))


def short_error(exc: BaseException, store: str = "") -> str:
    """A failing store's error as commands, checks and the admin print it: its class and its
    message's first line, without the objects' reprs redis-py puts in it (a Sentinel's
    ``MasterNotFoundError`` names its client's whole connection pool: about 1,500 characters)
    and without ``store``'s secrets (its URL's password, its secret options' values), should a
    client's message hold them: ``idempotency_stats --json`` printed the whole text."""
    text = (str(exc).strip().splitlines() or [""])[0]
    shown, depth = [], 0
    for index, char in enumerate(text):
        if char == "<" and (depth or text.startswith("<redis.", index)):
            depth += 1
            if depth == 1:
                shown.append("<...>")
            continue
        if depth:
            depth -= char == ">"
            continue
        shown.append(char)
    text = "".join(shown)
    for secret in sorted(_secrets(store), key=len, reverse=True):
        text = text.replace(secret, "***")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _secrets(store: str) -> set[str]:
    """The secrets of a store's URL, as written and percent-decoded: its user's password and
    its secret query options' values."""
    from urllib.parse import parse_qsl, unquote

    sep, rest = store.partition("://")[1:]
    if not sep:
        return set()
    authority, _, tail = url_authority(rest)
    password = authority.rpartition("@")[0].partition(":")[2]
    query = tail.partition("#")[0].partition("?")[2]
    found = {password} | {value for name, value in parse_qsl(query) if _SECRET_OPTION.search(name)}
    return {each for secret in found for each in (secret, unquote(secret)) if each}


def shown_store(value: str) -> str:
    """A store as the user wrote it (``STORE``, a view's ``store``), for a message: a cache
    alias without the store layer's ``cache:`` prefix, a URL as :func:`display_name` shows it."""
    return display_name(value.removeprefix(CACHE_PREFIX))


def store_alias(value: str, database_alias: str) -> str:
    """The name the store layer knows a store by: the database alias, ``cache:<alias>`` or
    the URL (its form is the registry's key: :func:`.stores.form`)."""
    if value == DATABASE:
        return database_alias
    return value if "://" in value else CACHE_PREFIX + value
