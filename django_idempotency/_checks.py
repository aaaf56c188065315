"""System checks for ``settings.IDEMPOTENCY`` and the protected views the URLconf reaches: one
id per mistake, each with a hint."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning
from django.core.exceptions import ImproperlyConfigured
from django.db.utils import load_backend
from django.urls import URLPattern, URLResolver, get_resolver

from django_idempotency import _durations as durations
from django_idempotency._conf import DEFAULTS, IN_PROGRESS_POLICIES, import_callable, user_settings
from django_idempotency._keys import MAX_KEY_LENGTH, key_format
from django_idempotency._options import (
    FINGERPRINT_ARGUMENTS,
    SAFE_METHODS,
    SCOPE_ARGUMENTS,
    Options,
    signature_error,
    ttl_under_lock,
)
from django_idempotency._responses import NEVER_STORED
from django_idempotency._store import VENDORS

DOCS = "See https://django-idempotency.readthedocs.io/en/latest/settings.html"


def _error(id_: int, msg: str, hint: str = DOCS) -> Error:
    return Error(msg, hint=hint, id=f"django_idempotency.E{id_:03d}")


def check_settings(**kwargs: Any) -> list[CheckMessage]:
    raw = getattr(settings, "IDEMPOTENCY", {})
    if not isinstance(raw, Mapping):
        return [_error(1, f"IDEMPOTENCY must be a dict, not {type(raw).__name__}.")]
    errors: list[CheckMessage] = [
        Warning(
            f"IDEMPOTENCY has an unknown key {name!r}.",
            hint=f"Known keys: {', '.join(sorted(DEFAULTS))}.",
            id="django_idempotency.W001",
        )
        for name in raw
        if name not in DEFAULTS
    ]
    value = {**DEFAULTS, **raw}
    for name in ("ENABLED", "REQUIRED", "HEARTBEAT", "BARE_KEYS"):
        if not isinstance(value[name], bool):
            errors.append(_error(2, f"IDEMPOTENCY[{name!r}] must be True or False."))
    header = value["HEADER"]
    if not isinstance(header, str) or not header or not header.isascii() or " " in header:
        errors.append(_error(3, "IDEMPOTENCY['HEADER'] must be a non-empty header name."))
    errors += _check_methods(value["METHODS"])
    durations = {name: _duration(value[name]) for name in ("TTL", "LOCK_TIMEOUT", "WAIT_TIMEOUT")}
    for id_, name in ((5, "TTL"), (6, "LOCK_TIMEOUT"), (7, "WAIT_TIMEOUT")):
        if durations[name] is None:
            errors.append(
                _error(id_, f"IDEMPOTENCY[{name!r}] must be a positive timedelta or seconds.")
            )
    ttl, lock = durations["TTL"], durations["LOCK_TIMEOUT"]
    if ttl is not None and lock is not None and lock > ttl:
        errors.append(
            _error(
                8,
                "IDEMPOTENCY['LOCK_TIMEOUT'] is longer than its 'TTL'.",
                hint="A record would expire while still locked; make the TTL longer.",
            )
        )
    if value["IN_PROGRESS"] not in IN_PROGRESS_POLICIES:
        errors.append(
            _error(9, f"IDEMPOTENCY['IN_PROGRESS'] must be one of {IN_PROGRESS_POLICIES}.")
        )
    if not _positive_int(value["RETRY_AFTER"]):
        errors.append(_error(10, "IDEMPOTENCY['RETRY_AFTER'] must be a positive integer."))
    statuses = value["RETRYABLE_STATUSES"]
    if isinstance(statuses, str) or not all(
        isinstance(code, int) and 100 <= code <= 599 for code in _iterable(statuses)
    ):
        errors.append(
            _error(11, "IDEMPOTENCY['RETRYABLE_STATUSES'] must be a collection of HTTP statuses.")
        )
    if value["MISMATCH_STATUS"] not in (400, 422):
        errors.append(_error(12, "IDEMPOTENCY['MISMATCH_STATUS'] must be 422 or 400."))
    min_length = value["MIN_KEY_LENGTH"]
    if not _positive_int(min_length) or min_length > MAX_KEY_LENGTH:
        errors.append(
            _error(
                13, f"IDEMPOTENCY['MIN_KEY_LENGTH'] must be an integer from 1 to {MAX_KEY_LENGTH}."
            )
        )
    errors += _check_headers(value["REPLAYED_HEADERS"])
    for id_, signature_id, name, arguments in (
        (15, 24, "SCOPE_FUNCTION", SCOPE_ARGUMENTS),
        (16, 25, "FINGERPRINT_FUNCTION", FINGERPRINT_ARGUMENTS),
    ):
        try:
            function = import_callable(value[name])
        except (ImportError, TypeError, ValueError) as exc:
            errors.append(_error(id_, f"IDEMPOTENCY[{name!r}] cannot be used: {exc}"))
            continue
        if signature := signature_error(function, arguments):
            # What it returns is checked on each request (a TypeError naming it).
            errors.append(
                _error(
                    signature_id,
                    f"IDEMPOTENCY[{name!r}] {signature}",
                    hint=f"It is called as f({', '.join(arguments)}) and returns a str.",
                )
            )
    try:
        key_format(value["KEY_FORMAT"])
    except (TypeError, ValueError) as exc:
        errors.append(
            _error(
                23,
                f"IDEMPOTENCY['KEY_FORMAT']: {exc}",
                hint="A string is a name ('any' or 'uuid'), never a pattern: give a pattern "
                "as re.compile(r'...').",
            )
        )
    if not _positive_int(value["MAX_BODY_SIZE"]):
        errors.append(_error(17, "IDEMPOTENCY['MAX_BODY_SIZE'] must be a positive integer."))
    if not _absolute_uri(value["PROBLEM_TYPE_BASE"]):
        errors.append(
            _error(
                22,
                "IDEMPOTENCY['PROBLEM_TYPE_BASE'] must be an absolute URI, not "
                f"{value['PROBLEM_TYPE_BASE']!r}.",
                hint="Problem slugs are appended to it to make each problem's 'type', e.g. "
                "'https://api.example.com/docs/errors#'.",
            )
        )
    return errors


def check_database(**kwargs: Any) -> list[CheckMessage]:
    alias = user_settings().get("DATABASE_ALIAS", DEFAULTS["DATABASE_ALIAS"])
    if alias not in settings.DATABASES:
        return [_error(18, f"IDEMPOTENCY['DATABASE_ALIAS'] {alias!r} is not in DATABASES.")]
    database = settings.DATABASES[alias]
    store = VENDORS.get(_vendor(database.get("ENGINE", "")))
    if store is None:
        return [
            _error(
                30,
                f"DATABASES[{alias!r}] uses {database.get('ENGINE')!r}, a database backend "
                "django-idempotency does not support.",
                hint=f"Supported: {', '.join(store.name for store in VENDORS.values())} (docs: "
                "'Installation'). Point IDEMPOTENCY['DATABASE_ALIAS'] at one of them.",
            )
        ]
    isolation = (database.get("OPTIONS") or {}).get("isolation_level")
    if store.isolation_level and isolation not in (None, store.isolation_level):
        return [
            _error(
                31,
                f"DATABASES[{alias!r}] sets isolation_level {isolation!r}: on {store.name} "
                "a claim in atomic mode must read the rows other attempts committed "
                "after its transaction's snapshot.",
                hint=f"Use Django's default, {store.isolation_level!r}, or point "
                "IDEMPOTENCY['DATABASE_ALIAS'] at a second alias that does (docs: "
                "'Installation').",
            )
        ]
    if shared := _sqlite_shared_with_atomic_requests(alias):
        return [
            _error(
                32,
                f"IDEMPOTENCY['DATABASE_ALIAS'] {alias!r} is the SQLite file of "
                f"DATABASES[{shared!r}], which has ATOMIC_REQUESTS: the request's transaction "
                "holds the file's only write lock, so no claim or result could be written.",
                hint="On SQLite, drop ATOMIC_REQUESTS (or use atomic=True views); a second "
                "alias works on PostgreSQL and MySQL (docs: 'ATOMIC_REQUESTS').",
            )
        ]
    if database.get("ATOMIC_REQUESTS"):
        return [
            _error(
                19,
                f"DATABASES[{alias!r}] has ATOMIC_REQUESTS, so two-phase claims would commit only "
                "with the view, and duplicates would not see them while it runs.",
                hint="Point IDEMPOTENCY['DATABASE_ALIAS'] at a second alias for the same "
                "database without ATOMIC_REQUESTS (docs: 'ATOMIC_REQUESTS').",
            )
        ]
    return []


def check_views(**kwargs: Any) -> list[CheckMessage]:
    """A view's TTL under its lock timeout lets a duplicate take over a record whose owner still
    runs, and both execute (issue 20). Options given together are refused when the decorator or
    the class is made; this covers one given and the other from the settings."""
    errors: list[CheckMessage] = []
    seen: set[str] = set()
    for name, found in _protected_views():
        if name in seen:
            continue
        seen.add(name)
        options = found() if callable(found) else found
        if error := ttl_under_lock(options):
            errors.append(
                _error(
                    33,
                    f"{name}: {error}",
                    hint="Give the view a ttl at least as long as its lock_timeout "
                    "(docs: 'Settings').",
                )
            )
    return errors


def _protected_views() -> Iterator[tuple[str, Any]]:
    """(name, Options or a callable building them) for every protected view in the URLconf."""
    try:
        patterns = get_resolver().url_patterns
    except Exception:  # a broken URLconf is reported by Django's own checks
        return
    for callback in _callbacks(patterns):
        options = getattr(callback, "idempotency_options", None)
        view_class = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
        if options is None and view_class is not None:
            options = getattr(view_class, "get_idempotency_options", None)
            options = options or getattr(view_class.dispatch, "idempotency_options", None)
        if isinstance(options, Options) or callable(options):
            name = getattr(view_class or callback, "__qualname__", repr(callback))
            yield f"{getattr(view_class or callback, '__module__', '')}.{name}", options


def _callbacks(patterns: Any) -> Iterator[Any]:
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _callbacks(pattern.url_patterns)
        elif isinstance(pattern, URLPattern):
            yield pattern.callback


def _sqlite_shared_with_atomic_requests(alias: str) -> str | None:
    """Another alias of the claim's SQLite file that runs requests in a transaction."""
    ours = settings.DATABASES[alias]
    name = str(ours.get("NAME") or ":memory:")
    # In-memory databases (every connection to ":memory:" is one of its own) have no file lock.
    if (
        not str(ours.get("ENGINE", "")).endswith("sqlite3")
        or name == ":memory:"
        or "mode=memory" in name
    ):
        return None
    for other, config in settings.DATABASES.items():
        if (
            other != alias
            and config.get("ATOMIC_REQUESTS")
            and str(config.get("ENGINE", "")).endswith("sqlite3")
            and str(config.get("NAME")) == name
        ):
            return other
    return None


def _vendor(engine: str) -> str:
    """The backend's vendor (a third-party PostGIS backend is ``postgresql``), or the engine's
    last name when the backend cannot be loaded (Oracle without its driver)."""
    try:
        return str(load_backend(engine).DatabaseWrapper.vendor)
    except (ImportError, ImproperlyConfigured):
        return engine.rsplit(".", 1)[-1]


def _duration(value: object) -> timedelta | None:
    try:
        return durations.positive(value, "")
    except (TypeError, ValueError):
        return None


# RFC 3986: a scheme, then no space or control character; http(s) URIs need a host.
_ABSOLUTE_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:[!-~]+")


def _absolute_uri(value: object) -> bool:
    if not isinstance(value, str) or not _ABSOLUTE_URI.fullmatch(value):
        return False
    parts = urlsplit(value)
    return parts.scheme.lower() not in ("http", "https") or bool(parts.hostname)


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _iterable(value: object) -> list[Any]:
    try:
        return list(value)  # type: ignore[call-overload,no-any-return]
    except TypeError:
        return [None]


def _check_methods(methods: object) -> list[CheckMessage]:
    items = _iterable(methods)
    if isinstance(methods, str) or not items or not all(isinstance(m, str) for m in items):
        return [_error(4, "IDEMPOTENCY['METHODS'] must be a non-empty list of HTTP methods.")]
    if safe := {m.upper() for m in items} & SAFE_METHODS:
        return [
            _error(
                20,
                f"IDEMPOTENCY['METHODS'] lists safe methods {sorted(safe)}.",
                hint="Safe methods are never protected; list POST, PATCH, PUT or DELETE.",
            )
        ]
    return []


def _check_headers(headers: object) -> list[CheckMessage]:
    items = _iterable(headers)
    if isinstance(headers, str) or not all(isinstance(h, str) for h in items):
        return [_error(14, "IDEMPOTENCY['REPLAYED_HEADERS'] must be a list of header names.")]
    if forbidden := {h.lower() for h in items} & NEVER_STORED:
        return [
            _error(
                21,
                f"IDEMPOTENCY['REPLAYED_HEADERS'] lists {sorted(forbidden)}, which are never "
                "stored.",
                hint="Cookies belong to one client and hop-by-hop headers to one connection.",
            )
        ]
    return []
