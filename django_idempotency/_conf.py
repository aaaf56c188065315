"""Settings, read from ``settings.IDEMPOTENCY`` so ``override_settings`` just works.

Nothing is ever written into ``django.conf.settings``; values are validated by the system checks
in :mod:`django_idempotency._checks`. Every value, and everything :func:`derived` from them, is
computed once and cached until the ``setting_changed`` signal says ``IDEMPOTENCY`` changed
(``override_settings`` and pytest-django's ``settings`` fixture send it): a protected request
reads about ten of them, and a cached read costs nothing next to a parse.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from datetime import timedelta
from functools import cache
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from django_idempotency._durations import to_timedelta
from django_idempotency._keys import KeyFormat, key_format

if TYPE_CHECKING:
    from django.http import HttpRequest

ScopeFunction = Callable[["HttpRequest"], str]
FingerprintFunction = Callable[["HttpRequest", str], str]
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

#: Every key of ``settings.IDEMPOTENCY`` and its default.
DEFAULTS: Mapping[str, Any] = {
    "ENABLED": True,
    "HEADER": "Idempotency-Key",
    "REQUIRED": False,
    "METHODS": ("POST", "PATCH"),
    "TTL": timedelta(hours=24),
    "LOCK_TIMEOUT": timedelta(seconds=30),
    "IN_PROGRESS": "conflict",
    "WAIT_TIMEOUT": timedelta(seconds=10),
    "RETRY_AFTER": 1,
    "RETRYABLE_STATUSES": frozenset({408, 429, *range(500, 600)}),
    "MISMATCH_STATUS": 422,
    "MIN_KEY_LENGTH": 1,
    "REPLAYED_HEADERS": ("Content-Type", "Location", "ETag", "Link", "Content-Language"),
    "SCOPE_FUNCTION": "django_idempotency.scopes.user_scope",
    "FINGERPRINT_FUNCTION": "django_idempotency.fingerprints.request_fingerprint",
    "DATABASE_ALIAS": "default",
    "MAX_BODY_SIZE": 1024 * 1024,
    "PROBLEM_TYPE_BASE": "https://django-idempotency.readthedocs.io/en/latest/problems.html#",
    "HEARTBEAT": True,
    "KEY_FORMAT": "any",
    # Named for what it governs, as KEY_FORMAT and MIN_KEY_LENGTH are; True accepts them, as
    # True switches ENABLED and HEARTBEAT on. Off: only the draft's quoted spelling (issue 18).
    "BARE_KEYS": True,
}

IN_PROGRESS_POLICIES = ("conflict", "wait")


def user_settings() -> Mapping[str, Any]:
    value = getattr(settings, "IDEMPOTENCY", {})
    return value if isinstance(value, Mapping) else {}


def _get(name: str) -> Any:
    return user_settings().get(name, DEFAULTS[name])


#: The ``cache_clear`` of every function cached with :func:`derived`.
_DERIVED: list[Callable[[], None]] = []


def derived(func: F) -> F:
    """Cache ``func`` (hashable arguments) until ``settings.IDEMPOTENCY`` changes."""
    cached = cache(func)
    _DERIVED.append(cached.cache_clear)
    return cast(F, cached)


@derived
def import_callable(path_or_callable: object) -> Callable[..., Any]:
    if isinstance(path_or_callable, str):
        resolved = import_string(path_or_callable)
    else:
        resolved = path_or_callable
    if not callable(resolved):
        raise TypeError(f"{path_or_callable!r} is not callable.")
    return resolved  # type: ignore[no-any-return]


@derived
def _value(name: str, convert: Callable[[Any], Any]) -> Any:
    return convert(_get(name))


class _Setting(Generic[T]):
    """One key of ``settings.IDEMPOTENCY``, converted to its type on first read."""

    def __init__(self, convert: Callable[[Any], T]) -> None:
        self.convert = convert
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: object, owner: type | None = None) -> T:
        return cast(T, _value(self.name, self.convert))


def _duration(name: str) -> Callable[[Any], timedelta]:
    def convert(value: Any) -> timedelta:
        try:
            return to_timedelta(value, f"IDEMPOTENCY[{name!r}]")
        except (TypeError, ValueError) as exc:  # the system checks say so first
            raise ImproperlyConfigured(str(exc)) from exc

    return convert


def _key_format(value: Any) -> KeyFormat:
    try:
        return key_format(value)
    except (TypeError, ValueError) as exc:  # the system checks say so first
        raise ImproperlyConfigured(f"IDEMPOTENCY['KEY_FORMAT']: {exc}") from exc


def _upper_set(values: Any) -> frozenset[str]:
    return frozenset(str(value).upper() for value in values)


def _lower_set(values: Any) -> frozenset[str]:
    return frozenset(str(value).lower() for value in values)


class Settings:
    """Typed access to ``settings.IDEMPOTENCY``; see ``docs/settings.rst``."""

    ENABLED = _Setting(bool)
    HEADER = _Setting(str)
    REQUIRED = _Setting(bool)
    METHODS = _Setting(_upper_set)
    TTL = _Setting(_duration("TTL"))
    LOCK_TIMEOUT = _Setting(_duration("LOCK_TIMEOUT"))
    IN_PROGRESS = _Setting(str)
    WAIT_TIMEOUT = _Setting(_duration("WAIT_TIMEOUT"))
    RETRY_AFTER = _Setting(int)
    RETRYABLE_STATUSES: _Setting[Collection[int]] = _Setting(frozenset)
    MISMATCH_STATUS = _Setting(int)
    MIN_KEY_LENGTH = _Setting(int)
    REPLAYED_HEADERS = _Setting(_lower_set)
    SCOPE_FUNCTION: _Setting[ScopeFunction] = _Setting(import_callable)
    FINGERPRINT_FUNCTION: _Setting[FingerprintFunction] = _Setting(import_callable)
    DATABASE_ALIAS = _Setting(str)
    MAX_BODY_SIZE = _Setting(int)
    PROBLEM_TYPE_BASE = _Setting(str)
    HEARTBEAT = _Setting(bool)
    KEY_FORMAT = _Setting(_key_format)
    BARE_KEYS = _Setting(bool)


conf = Settings()


def _clear_caches(*, setting: str, **kwargs: object) -> None:
    if setting == "IDEMPOTENCY":
        for clear in _DERIVED:
            clear()


def connect_signals() -> None:
    setting_changed.connect(_clear_caches, dispatch_uid="django_idempotency.conf")
