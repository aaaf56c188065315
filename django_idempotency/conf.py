"""Settings, read lazily from ``settings.IDEMPOTENCY`` so ``override_settings`` just works.

Nothing is ever written into ``django.conf.settings``; values are validated by the system checks
in :mod:`django_idempotency.checks`, and resolved callables are cached until the setting changes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from datetime import timedelta
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from django_idempotency.durations import to_timedelta

if TYPE_CHECKING:
    from django.http import HttpRequest

ScopeFunction = Callable[["HttpRequest"], str]
FingerprintFunction = Callable[["HttpRequest", str], str]

#: Every key of ``settings.IDEMPOTENCY`` and its default.
DEFAULTS: Mapping[str, Any] = {
    "ENABLED": True,
    "HEADER": "Idempotency-Key",
    "REQUIRED": False,
    "METHODS": ("POST", "PATCH"),
    "TTL": timedelta(hours=24),
    "LOCK_TIMEOUT": timedelta(seconds=60),
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
}

IN_PROGRESS_POLICIES = ("conflict", "wait")


def user_settings() -> Mapping[str, Any]:
    value = getattr(settings, "IDEMPOTENCY", {})
    return value if isinstance(value, Mapping) else {}


def _get(name: str) -> Any:
    return user_settings().get(name, DEFAULTS[name])


@cache
def _resolve(path_or_callable: object) -> Callable[..., Any]:
    if isinstance(path_or_callable, str):
        resolved = import_string(path_or_callable)
    else:
        resolved = path_or_callable
    if not callable(resolved):
        raise TypeError(f"{path_or_callable!r} is not callable.")
    return resolved  # type: ignore[no-any-return]


class Settings:
    """Typed, lazy access to ``settings.IDEMPOTENCY``; see ``docs/settings.rst``."""

    @property
    def ENABLED(self) -> bool:
        return bool(_get("ENABLED"))

    @property
    def HEADER(self) -> str:
        return str(_get("HEADER"))

    @property
    def REQUIRED(self) -> bool:
        return bool(_get("REQUIRED"))

    @property
    def METHODS(self) -> frozenset[str]:
        return frozenset(method.upper() for method in _get("METHODS"))

    @property
    def TTL(self) -> timedelta:
        return to_timedelta(_get("TTL"), "TTL")

    @property
    def LOCK_TIMEOUT(self) -> timedelta:
        return to_timedelta(_get("LOCK_TIMEOUT"), "LOCK_TIMEOUT")

    @property
    def IN_PROGRESS(self) -> str:
        return str(_get("IN_PROGRESS"))

    @property
    def WAIT_TIMEOUT(self) -> timedelta:
        return to_timedelta(_get("WAIT_TIMEOUT"), "WAIT_TIMEOUT")

    @property
    def RETRY_AFTER(self) -> int:
        return int(_get("RETRY_AFTER"))

    @property
    def RETRYABLE_STATUSES(self) -> Collection[int]:
        return _get("RETRYABLE_STATUSES")  # type: ignore[no-any-return]

    @property
    def MISMATCH_STATUS(self) -> int:
        return int(_get("MISMATCH_STATUS"))

    @property
    def MIN_KEY_LENGTH(self) -> int:
        return int(_get("MIN_KEY_LENGTH"))

    @property
    def REPLAYED_HEADERS(self) -> frozenset[str]:
        return _lower_set(tuple(_get("REPLAYED_HEADERS")))

    @property
    def SCOPE_FUNCTION(self) -> ScopeFunction:
        return _resolve(_get("SCOPE_FUNCTION"))

    @property
    def FINGERPRINT_FUNCTION(self) -> FingerprintFunction:
        return _resolve(_get("FINGERPRINT_FUNCTION"))

    @property
    def DATABASE_ALIAS(self) -> str:
        return str(_get("DATABASE_ALIAS"))

    @property
    def MAX_BODY_SIZE(self) -> int:
        return int(_get("MAX_BODY_SIZE"))


@lru_cache(maxsize=16)
def _lower_set(names: tuple[str, ...]) -> frozenset[str]:
    return frozenset(name.lower() for name in names)


conf = Settings()


def _clear_caches(*, setting: str, **kwargs: object) -> None:
    if setting == "IDEMPOTENCY":
        _resolve.cache_clear()


def connect_signals() -> None:
    setting_changed.connect(_clear_caches, dispatch_uid="django_idempotency.conf")
