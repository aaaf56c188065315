"""Per-view options, and the policy they make together with the settings.

Which options there are, and what each may be, is declared with the settings (:mod:`._conf`);
the two ``TypedDict`` below type them for the decorators' callers, and
``tests/test_declarations.py`` holds them to the declarations.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypedDict

from django.core.exceptions import ImproperlyConfigured

from django_idempotency._base.durations import Duration
from django_idempotency._base.keys import ANY, KeyFormat
from django_idempotency._conf.settings import (
    OPTIONS,
    FingerprintFunction,
    ScopeFunction,
    conf,
    derived,
    usable,
)
from django_idempotency._conf.values import (
    DATABASE,
    SAFE_METHODS,
    Refused,
    display_name,
    store_alias,
)

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
    store: str | None


class ViewOptions(CallOptions, total=False):
    """... and those of a view: whether a key is required, which methods it protects, and the
    functions of the request that replace ``SCOPE_FUNCTION`` and ``FINGERPRINT_FUNCTION``."""

    required: bool | None
    methods: Iterable[str] | None
    scope: ScopeFunction | None
    fingerprint: FingerprintFunction | None


#: The names each kind of entry point accepts (:data:`._conf.OPTIONS`).
VIEW_OPTIONS = frozenset(option.name for option in OPTIONS)
CALL_OPTIONS = frozenset(option.name for option in OPTIONS if option.function)
_OPTIONS = {option.name: option for option in OPTIONS}


@dataclass(frozen=True)
class Options:
    """What one view asks for, validated when built: the options it was given (not ``None``);
    the others are as the settings say."""

    #: (name, value) in name order, so equal options are equal.
    given: tuple[tuple[str, Any], ...] = ()

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
            given = {
                name: _OPTIONS[name].clean(value)
                for name, value in options.items()
                if value is not None
            }
        except (TypeError, ValueError) as exc:
            # A hint of its own (:class:`.values.Refused`) is the setting's check's, said here.
            hint = f" {exc.hint}" if isinstance(exc, Refused) else ""
            raise ImproperlyConfigured(f"Invalid idempotency option: {exc}{hint}") from exc
        if error := ttl_error(given.get("ttl"), given.get("lock_timeout")):
            raise ImproperlyConfigured(f"Invalid idempotency option: {error}")
        if error := atomic_error(
            given.get("atomic", False), given.get("store", DATABASE), given.get("in_progress")
        ):
            raise ImproperlyConfigured(f"Invalid idempotency option: {error}")
        return cls(tuple(sorted(given.items())))  # names differ: values are never compared

    def get(self, name: str) -> Any:
        """The value given for option ``name``; ``None``: as the settings say."""
        for given, value in self.given:
            if given == name:
                return value
        return None

    @property
    def atomic(self) -> bool:
        """Known when the view is decorated: an atomic view needs a sync wrapper."""
        return bool(self.get("atomic"))

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
    #: Not in its ``repr``, nor :attr:`store`: a Redis URL's password.
    alias: str = field(repr=False)
    #: Whose key it is (``SCOPE_FUNCTION``, or the view's ``scope``); resolved here, once, so a
    #: request reads one attribute whichever it is.
    scope: ScopeFunction
    #: What makes a retry the same request (``FINGERPRINT_FUNCTION``, or ``fingerprint``).
    fingerprint: FingerprintFunction
    #: Whether a committed claim's lock is renewed while the attempt runs (:mod:`._heartbeat`).
    heartbeat: bool = True
    #: What a key must look like (``KEY_FORMAT``, or the view's ``key_format``).
    key_format: KeyFormat = ANY
    #: Where records live (``STORE``, or the view's ``store``): ``"database"`` (at
    #: :attr:`alias`), or a Redis store's cache alias or URL (:attr:`alias` its name).
    store: str = field(default=DATABASE, repr=False)

    def protects(self, method: str | None) -> bool:
        return method in self.methods and method not in SAFE_METHODS


def ttl_error(
    ttl: timedelta | None,
    lock_timeout: timedelta | None,
    names: tuple[str, str] = ("ttl", "lock_timeout"),
) -> str | None:
    """The rule that a record outlives its lock, checked where each pair is known: a view's
    options given together (when it is built), the settings (E008), a view's option against
    the other's setting (E033), and every policy (:func:`_policy`).

    A record that expires while its owner still holds the lock is claimed afresh by a
    duplicate, and both run.
    """
    if ttl is None or lock_timeout is None or ttl >= lock_timeout:
        return None
    return (
        f"{names[0]} ({ttl}) is shorter than {names[1]} ({lock_timeout}); the record would "
        "expire while its first attempt still runs."
    )


def atomic_error(atomic: bool, store: str, in_progress: str | None = None) -> str | None:
    """The one rule of what needs the database store: atomic mode (the claim, the view's
    writes and the result commit in one transaction of the view's database, which no other
    store can join: named by its class, Redis or another). ``in_progress`` is taken for the
    callers' sake: every policy of it works on every store (operations included)."""
    if store == DATABASE or not atomic:
        return None
    from django_idempotency._conf import stores as registry

    kind = registry.kind_of(store_alias(store, ""))
    which = f"the {kind.name} store" if kind is not None else "that store"
    return (
        f"atomic=True needs the database store, not {display_name(store)!r}: {which} shares "
        "no transaction with the view's database, so the claim, the view's writes and its "
        "result could not commit or roll back together. Use the database store, or "
        "two-phase mode."
    )


#: Atomic entry points that name no store, by their options' identity: (label, options), so
#: E061 names those the URLconf does not route too (``STORE`` changed since their decoration).
ATOMIC_ON_SETTING: dict[int, tuple[str, Options]] = {}


def refuse_unstorable(options: Options, label: str) -> None:
    """Refuse at decoration an atomic entry point that ``STORE`` puts on Redis: its result
    could never be stored with its writes. The settings are loaded by then (the decorators
    import the models, which need the apps loaded); a ``STORE`` changed later at run time is
    refused by the policy, before the claim."""
    if not options.atomic or options.get("store") is not None:
        return
    ATOMIC_ON_SETTING.setdefault(id(options), (label, options))
    store = setting_store()
    if store is not None and (error := atomic_error(True, store)):
        raise ImproperlyConfigured(f"{label}: {error}")


def setting_store() -> str | None:
    """``STORE``, or ``None`` when the settings are not loaded yet or ``STORE`` is refused
    (E060 says why)."""
    from django.conf import settings

    if not settings.configured:
        return None
    try:
        return str(conf.STORE)
    except ImproperlyConfigured:
        return None


def ttl_under_lock(options: Options) -> str | None:
    """The error when a view's TTL, as resolved with the settings, is under its lock timeout."""
    try:
        return ttl_error(
            options.get("ttl") or conf.TTL, options.get("lock_timeout") or conf.LOCK_TIMEOUT
        )
    except ImproperlyConfigured:
        return None  # bad settings: the settings checks report them


@derived
def _policy(options: Options) -> Policy:
    usable()  # every setting, those read after the view too: refused before a claim
    values = {
        name: option.fallback() if (value := options.get(name)) is None else value
        for name, option in _OPTIONS.items()
    }
    if ttl_error(values["ttl"], values["lock_timeout"]):
        # Kept, though checks refuse it where they can see it: a view outside the URLconf, an
        # idempotent_function (whose options meet the settings only when it is called) and
        # settings changed at run time meet no check, and their record must still outlive
        # its lock. Keeping it that long, not refusing the request, keeps them working.
        values["ttl"] = values["lock_timeout"]
    if error := atomic_error(values["atomic"], values["store"], values["in_progress"]):
        raise ImproperlyConfigured(error)
    return Policy(alias=store_alias(values["store"], conf.DATABASE_ALIAS), **values)
