"""Per-view options, and the policy they make together with the settings."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from functools import cache
from typing import TYPE_CHECKING, Any, TypedDict

from django.core.exceptions import ImproperlyConfigured

from django_idempotency import _durations as durations
from django_idempotency._conf import (
    IN_PROGRESS_POLICIES,
    FingerprintFunction,
    ScopeFunction,
    conf,
    derived,
)
from django_idempotency._durations import Duration
from django_idempotency._keys import ANY, KeyFormat, key_format

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack: Python 3.11


class CallOptions(TypedDict, total=False):
    """The options of every protected entry point, as given (``None``: as the settings say)."""

    ttl: Duration | None
    lock_timeout: Duration | None
    atomic: bool
    in_progress: str | None
    wait_timeout: Duration | None
    heartbeat: bool | None
    key_format: str | re.Pattern[str] | None


class ViewOptions(CallOptions, total=False):
    """... and those of a view: whether a key is required, which methods it protects, and the
    functions of the request that replace ``SCOPE_FUNCTION`` and ``FINGERPRINT_FUNCTION``."""

    required: bool | None
    methods: Iterable[str] | None
    scope: ScopeFunction | None
    fingerprint: FingerprintFunction | None


#: The names each kind of entry point accepts.
CALL_OPTIONS = frozenset(CallOptions.__optional_keys__)
VIEW_OPTIONS = frozenset(ViewOptions.__optional_keys__)


@dataclass(frozen=True)
class Options:
    """What one view asks for; ``None`` means "as the settings say". Validated when built."""

    required: bool | None = None
    ttl: timedelta | None = None
    lock_timeout: timedelta | None = None
    atomic: bool = False
    in_progress: str | None = None
    wait_timeout: timedelta | None = None
    methods: frozenset[str] | None = None
    heartbeat: bool | None = None
    key_format: KeyFormat | None = None
    scope: ScopeFunction | None = None
    fingerprint: FingerprintFunction | None = None

    @classmethod
    def build(
        cls,
        accepted: frozenset[str] = VIEW_OPTIONS,
        caller: str = "Options.build",
        /,
        **options: Unpack[ViewOptions],
    ) -> Options:
        """Validate the options ``caller`` was given (only those of ``accepted``)."""
        for name in options.keys() - accepted:
            raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}")
        try:
            built = cls(
                required=options.get("required"),
                ttl=_positive(options.get("ttl"), "ttl"),
                lock_timeout=_positive(options.get("lock_timeout"), "lock_timeout"),
                atomic=bool(options.get("atomic", False)),
                in_progress=_in_progress(options.get("in_progress")),
                wait_timeout=_positive(options.get("wait_timeout"), "wait_timeout"),
                methods=_methods(options.get("methods")),
                heartbeat=_flag(options.get("heartbeat"), "heartbeat"),
                key_format=_key_format(options.get("key_format")),
                scope=_function(options.get("scope"), "scope", SCOPE_ARGUMENTS),
                fingerprint=_function(
                    options.get("fingerprint"), "fingerprint", FINGERPRINT_ARGUMENTS
                ),
            )
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"Invalid idempotency option: {exc}") from exc
        if built.ttl and built.lock_timeout and (error := _under(built.ttl, built.lock_timeout)):
            raise ImproperlyConfigured(error)
        return built

    def resolve(self) -> Policy:
        """Fill the gaps from the settings; cached until they change (``override_settings``)."""
        return _policy(self)


@dataclass(frozen=True)
class Policy:
    required: bool
    ttl: timedelta
    lock_timeout: timedelta
    atomic: bool
    in_progress: str
    wait_timeout: timedelta
    methods: frozenset[str]
    alias: str
    #: Whose key it is (``SCOPE_FUNCTION``, or the view's ``scope``); resolved here, once, so a
    #: request reads one attribute whichever it is.
    scope: ScopeFunction
    #: What makes a retry the same request (``FINGERPRINT_FUNCTION``, or ``fingerprint``).
    fingerprint: FingerprintFunction
    #: Whether a committed claim's lock is renewed while the attempt runs (:mod:`._heartbeat`).
    heartbeat: bool = True
    #: What a key must look like (``KEY_FORMAT``, or the view's ``key_format``).
    key_format: KeyFormat = ANY

    def protects(self, method: str | None) -> bool:
        return method in self.methods and method not in SAFE_METHODS


def ttl_under_lock(options: Options) -> str | None:
    """The error when a view's TTL, as resolved with the settings, is under its lock timeout."""
    try:
        return _under(options.ttl or conf.TTL, options.lock_timeout or conf.LOCK_TIMEOUT)
    except ImproperlyConfigured:
        return None  # bad settings: the settings checks report them


def _under(ttl: timedelta, lock_timeout: timedelta) -> str | None:
    """A record that expires while its owner still holds the lock is claimed afresh by a
    duplicate, and both run (issue 20)."""
    if ttl >= lock_timeout:
        return None
    return (
        f"Invalid idempotency option: ttl ({ttl}) is shorter than lock_timeout ({lock_timeout}); "
        "the record would expire while its first attempt still runs."
    )


@derived
def _policy(options: Options) -> Policy:
    lock_timeout = options.lock_timeout or conf.LOCK_TIMEOUT
    return Policy(
        required=conf.REQUIRED if options.required is None else options.required,
        # The system check refuses a TTL under the lock timeout; a view it cannot see (not in
        # the URLconf) keeps its record at least as long as it is locked.
        ttl=max(options.ttl or conf.TTL, lock_timeout),
        lock_timeout=lock_timeout,
        atomic=options.atomic,
        in_progress=options.in_progress or conf.IN_PROGRESS,
        wait_timeout=options.wait_timeout or conf.WAIT_TIMEOUT,
        methods=options.methods or conf.METHODS,
        alias=conf.DATABASE_ALIAS,
        heartbeat=conf.HEARTBEAT if options.heartbeat is None else options.heartbeat,
        key_format=options.key_format or conf.KEY_FORMAT,
        scope=options.scope or conf.SCOPE_FUNCTION,
        fingerprint=options.fingerprint or conf.FINGERPRINT_FUNCTION,
    )


def _positive(value: Duration | None, name: str) -> timedelta | None:
    return None if value is None else durations.positive(value, name)


def _flag(value: bool | None, name: str) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {value!r}.")
    return value


def _key_format(value: object) -> KeyFormat | None:
    return None if value is None else key_format(value)


#: The arguments each function of the request is called with.
SCOPE_ARGUMENTS = ("request",)
FINGERPRINT_ARGUMENTS = ("request", "scope")


def _function(value: Any, name: str, arguments: tuple[str, ...]) -> Any:
    if value is None:
        return None
    try:
        hash(value)  # a view's options are cached with it (Options.resolve)
    except TypeError:
        raise TypeError(
            f"{name} must be hashable, and {type(value).__name__} is not: a dataclass needs "
            "frozen=True (or eq=False), a class defining __eq__ needs __hash__."
        ) from None
    if error := signature_error(value, arguments):
        raise TypeError(f"{name} {error}")
    return value


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


def _in_progress(value: str | None) -> str | None:
    if value is not None and value not in IN_PROGRESS_POLICIES:
        raise ValueError(f"in_progress must be one of {IN_PROGRESS_POLICIES}, not {value!r}.")
    return value


def _methods(value: Iterable[str] | None) -> frozenset[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        raise TypeError("methods must be a list of HTTP methods, not a string.")
    methods = frozenset(str(method).upper() for method in value)
    if safe := methods & SAFE_METHODS:
        raise ValueError(f"safe methods cannot be protected: {sorted(safe)}.")
    return methods
