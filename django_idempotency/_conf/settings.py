"""Every setting and view option, declared once, and the typed, cached reads of the settings.

A setting is one line of :class:`Settings` (DRF's ``DEFAULTS`` is the model): its default, how
``conf`` reads it, its system checks (``{id: test}``; the test, in :mod:`.values`, carries the
check's words) and whether a view, or a view and ``idempotent_function``, may override it.
``DEFAULTS``, ``conf``, the checks (:mod:`.._ops.checks`), a view's options and policy
(:mod:`.options`), the DRF mixin's ``idempotency_<name>`` attributes, the settings page and
the checks page (``docs/_ext``) all derive from it; adding a setting is that line, its entry in
``docs/settings.rst`` and the code that uses it (``docs/contributing.rst``).

Settings are read from ``settings.IDEMPOTENCY`` so ``override_settings`` just works; nothing is
ever written into ``django.conf.settings``. Every value, and everything :func:`derived` from
them, is computed once and cached until the ``setting_changed`` signal says ``IDEMPOTENCY``
changed (``override_settings`` and pytest-django's ``settings`` fixture send it): a protected
request reads about ten of them, and a cached read costs nothing next to a parse.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from functools import cache
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, overload

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from django_idempotency._base import durations
from django_idempotency._base.keys import KeyFormat
from django_idempotency._conf import values
from django_idempotency._conf.values import (
    DOCS,
    FINGERPRINT_ARGUMENTS,
    SCOPE_ARGUMENTS,
    Test,
    absolute_uri,
    boolean,
    encryption_available,
    fernet_keys,
    header_name,
    header_names,
    in_progress,
    key_length,
    lock_duration,
    methods,
    mismatch_status,
    not_a_credential,
    optional_positive_int,
    optional_scope_function,
    positive_duration,
    positive_int,
    statuses,
    stored_headers,
    unsafe_methods,
)

if TYPE_CHECKING:
    from cryptography.fernet import MultiFernet
    from django.core.checks import CheckMessage
    from django.http import HttpRequest

ScopeFunction = Callable[["HttpRequest"], str]
FingerprintFunction = Callable[["HttpRequest", str], str]
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

#: A setting's ``option``: a view may override it; and ``idempotent_function`` too.
VIEWS = "views"
CALLS = "calls"


def check_name(id_: int, level: str = "E") -> str:
    """A check's full id, as ``manage.py check`` prints it: ``django_idempotency.E041``."""
    return f"django_idempotency.{level}{id_:03d}"


@dataclass(frozen=True)
class Check:
    """A system check of one setting: ``django_idempotency.E<id>`` when ``test`` refuses it.
    Its words are its test's (:func:`.values.refusing`)."""

    id: int
    test: Test
    #: The hint of one refusal, when its test gave one of its own (:class:`.values.Refused`).
    said: str = ""

    @property
    def hint(self) -> str:
        return self.said or str(getattr(self.test, "hint", DOCS))

    @property
    def refuses(self) -> str:
        """Its row in ``docs/checks.rst``, after the setting's name."""
        return str(self.test.refuses)  # type: ignore[attr-defined]


@dataclass
class Option:
    """A setting a view may override (``idempotency_<name>`` on the DRF mixin), or an option
    of a view's own with no setting (``atomic``)."""

    #: A setting's option is named after it: ``TTL``'s is ``ttl``, ``SCOPE_FUNCTION``'s
    #: ``scope``.
    name: str = ""
    #: ``idempotent_function`` takes it too (not ``required``, ``methods``, ``scope`` or
    #: ``fingerprint``, which are about a request).
    function: bool = False
    #: What a view's value must pass; by default its setting's checks. ``None`` is never
    #: tested: it means "as the settings say".
    tests: tuple[Test, ...] = ()
    #: Of an option with no setting: its value when not given, and its line in the docs.
    default: Any = None
    doc: str = ""
    #: The name of the setting it overrides.
    setting: str | None = None

    @property
    def attribute(self) -> str:
        """Its name on the DRF mixin."""
        return f"idempotency_{self.name}"

    def clean(self, value: Any) -> Any:
        """The value as the policy uses it; ``TypeError``/``ValueError`` naming the option."""
        for test in self.tests:
            value = test(value, self.name)
        return value

    def fallback(self) -> Any:
        """The value when a view does not give one: its setting's, or the default."""
        return self.default if self.setting is None else getattr(conf, self.setting)


class Setting(Generic[T]):
    """One key of ``settings.IDEMPOTENCY``, declared once; an attribute of :class:`Settings`,
    read (with ``convert``, once per value of the settings) as ``conf.NAME``.

    ``convert`` is lenient where the checks are strict (``METHODS`` upper-cases what it is
    given): a value that got past silenced checks keeps working as it always did; only a
    duration or a key format it cannot read at all is ``ImproperlyConfigured``.
    """

    name: str

    def __init__(
        self,
        default: object,
        convert: Callable[[Any, str], T],
        checks: Mapping[int, Test],
        option: str = "",
        *,
        shown: str | None = None,
        option_tests: tuple[Test, ...] = (),
    ) -> None:
        self.default = default
        self.convert = convert
        self.checks = tuple(Check(id_, test) for id_, test in checks.items())
        #: Its view option (``VIEWS``, ``CALLS``): named after it, with its checks' tests, or
        #: ``option_tests``.
        self.option = (
            Option(function=option == CALLS, tests=option_tests or tuple(checks.values()))
            if option
            else None
        )
        #: The default as the docs show it, where ``repr`` would not do.
        self.shown = shown

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        if self.option is not None:
            self.option.name = name.lower().removesuffix("_function")
            self.option.setting = name

    @overload
    def __get__(self, instance: None, owner: type) -> Setting[T]: ...

    @overload
    def __get__(self, instance: Settings, owner: type | None = None) -> T: ...

    def __get__(self, instance: object, owner: type | None = None) -> T | Setting[T]:
        if instance is None:
            return self
        try:  # read on every protected call, several times: a plain dictionary's lookup
            return _VALUES[self.name]  # type: ignore[no-any-return]
        except KeyError:
            value = _VALUES[self.name] = _value(self)
            return value  # type: ignore[no-any-return]

    @property
    def label(self) -> str:
        """How messages name it."""
        return f"IDEMPOTENCY[{self.name!r}]"

    def refusal(self, value: object) -> tuple[Check, str] | None:
        """The first of its checks that ``value`` fails, and the check's message."""
        for check in self.checks:
            try:
                value = check.test(value, self.label)
            except (TypeError, ValueError) as exc:
                return replace(check, said=str(getattr(exc, "hint", ""))), str(exc)
        return None


def _coerce(kind: Callable[[Any], T]) -> Callable[[Any, str], T]:
    def convert(value: Any, name: str) -> T:
        try:
            return kind(value)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{name}: {exc}") from exc

    return convert


def _upper(value: Any, name: str) -> frozenset[str]:
    return frozenset(str(item).upper() for item in value)


def _lower(value: Any, name: str) -> frozenset[str]:
    return frozenset(str(item).lower() for item in value)


def _replayed(value: Any, name: str) -> frozenset[str]:
    return _lower(value, name) | values.ALWAYS_STORED


def _import(value: Any, name: str) -> Callable[..., Any]:
    try:
        return values.import_callable(value)
    except (ImportError, TypeError) as exc:
        raise TypeError(f"{name}: {exc}") from exc


def _alias(value: Any, name: str) -> str:
    """A database alias of ``DATABASES`` (E018 says so first): with no database, no record
    can be claimed."""
    alias = str(value)
    if alias not in settings.DATABASES:
        raise ValueError(f"{name} {alias!r} is not in DATABASES.")
    return alias


def _fernet(value: Any, name: str) -> MultiFernet | None:
    """The keys as one ``MultiFernet`` (the first encrypts, every one decrypts); ``None``
    without keys. Imported here, on first use: ``cryptography`` is an optional extra."""
    keys = values.fernet_keys(value, name)
    if not keys:
        return None
    values.encryption_available(keys, name)
    from cryptography.fernet import Fernet, MultiFernet

    return MultiFernet([Fernet(key) for key in keys])


def _function(default: str, ids: tuple[int, int], arguments: tuple[str, ...]) -> Setting[Any]:
    """A function of the request: a dotted path or a callable as a setting (check ``ids``: one
    that cannot be imported, one that cannot be called with ``arguments``), a hashable callable
    as a view's option."""
    called_as = values.called_as(*arguments)

    def convert(value: Any, name: str) -> Callable[..., Any]:
        # One that cannot be called so can never work: refused before any view runs.
        return called_as(_import(value, name), name)  # type: ignore[no-any-return]

    checks = {ids[0]: values.importable, ids[1]: called_as}
    return Setting(default, convert, checks, VIEWS, option_tests=(values.hashable, called_as))


_bool = _coerce(bool)
_int = _coerce(int)
_str = _coerce(str)
_to_timedelta = durations.to_timedelta
_HOUR = timedelta(hours=1)
_HEADERS = ("Content-Type", "Location", "ETag", "Link", "Content-Language")
_PROBLEMS = "https://django-idempotency.readthedocs.io/en/latest/problems.html#"
_RETRYABLE = frozenset({408, 429, *range(500, 600)})


class Settings:
    """Typed access to ``settings.IDEMPOTENCY``, and each key's declaration on one line, in
    the order of their first check ids: ``Setting(default, read as, {check id: test},
    option)``. What each does: ``docs/settings.rst``."""

    ENABLED = Setting(True, _bool, {2: boolean})
    REQUIRED = Setting(False, _bool, {2: boolean}, VIEWS)
    HEARTBEAT = Setting(True, _bool, {2: boolean}, CALLS)
    BARE_KEYS = Setting(True, _bool, {2: boolean})
    COMPRESSION = Setting(True, _bool, {2: boolean})
    HEADER = Setting("Idempotency-Key", _str, {3: header_name, 27: not_a_credential})
    METHODS = Setting(("POST", "PATCH"), _upper, {4: methods, 20: unsafe_methods}, VIEWS)
    TTL = Setting(24 * _HOUR, _to_timedelta, {5: positive_duration}, CALLS)
    LOCK_TIMEOUT = Setting(
        timedelta(seconds=30), _to_timedelta, {6: positive_duration, 26: lock_duration}, CALLS
    )
    WAIT_TIMEOUT = Setting(timedelta(seconds=10), _to_timedelta, {7: positive_duration}, CALLS)
    IN_PROGRESS = Setting("conflict", _str, {9: in_progress}, CALLS)
    RETRY_AFTER = Setting(1, _int, {10: positive_int})
    RETRYABLE_STATUSES: Setting[Collection[int]] = Setting(
        _RETRYABLE, _coerce(frozenset), {11: statuses}, shown="408, 429 and 500 to 599"
    )
    MISMATCH_STATUS = Setting(422, _int, {12: mismatch_status})
    MIN_KEY_LENGTH = Setting(1, _int, {13: key_length})
    REPLAYED_HEADERS = Setting(_HEADERS, _replayed, {14: header_names, 21: stored_headers})
    SCOPE_FUNCTION: Setting[ScopeFunction] = _function(
        "django_idempotency.user_scope", (15, 24), SCOPE_ARGUMENTS
    )
    FINGERPRINT_FUNCTION: Setting[FingerprintFunction] = _function(
        "django_idempotency.request_fingerprint", (16, 25), FINGERPRINT_ARGUMENTS
    )
    MAX_BODY_SIZE = Setting(1024 * 1024, _int, {17: positive_int}, shown="1 MiB (1,048,576 bytes)")
    # E018, E019 and E030 to E032: the database DATABASE_ALIAS names (_ops.checks.check_database).
    DATABASE_ALIAS = Setting("default", _alias, {})
    PROBLEM_TYPE_BASE = Setting(_PROBLEMS, _str, {22: absolute_uri})
    KEY_FORMAT: Setting[KeyFormat] = Setting(
        "any", values.key_format, {23: values.key_format}, CALLS
    )
    MAX_STORED_BODY_SIZE = Setting(None, optional_positive_int, {40: optional_positive_int})
    ENCRYPTION_KEYS: Setting[MultiFernet | None] = Setting(
        (), _fernet, {41: fernet_keys, 42: encryption_available}, shown="none"
    )
    OUTBOX_FAST_PATH = Setting(True, _bool, {50: boolean})
    OUTBOX_LEASE = Setting(timedelta(seconds=60), _to_timedelta, {51: positive_duration})
    OUTBOX_RETRY_DELAY = Setting(timedelta(seconds=5), _to_timedelta, {52: positive_duration})
    OUTBOX_MAX_ATTEMPTS = Setting(10, _int, {53: positive_int})
    OUTBOX_BATCH_SIZE = Setting(100, _int, {54: positive_int})
    OUTBOX_POLL_INTERVAL = Setting(timedelta(seconds=5), _to_timedelta, {55: positive_duration})
    STORE = Setting(values.DATABASE, values.store, {60: values.store}, CALLS)
    REDIS_REPLICAS = Setting(0, _int, {64: values.replica_count})
    OPERATION_SCOPE_FUNCTION: Setting[ScopeFunction | None] = Setting(
        None, optional_scope_function, {70: optional_scope_function}, shown="none"
    )


#: A view's option with no setting: its claim and its view in one transaction.
ATOMIC = Option(
    "atomic",
    function=True,
    tests=(values.boolean,),
    default=False,
    doc="Claim the key in the view's own transaction (:doc:`modes`); a sync view only.",
)

conf = Settings()

#: Every setting, in declaration order.
SETTINGS: tuple[Setting[Any], ...] = tuple(
    value for value in vars(Settings).values() if isinstance(value, Setting)
)
#: Every key of ``settings.IDEMPOTENCY`` and its default.
DEFAULTS: Mapping[str, Any] = {setting.name: setting.default for setting in SETTINGS}
#: Every view option: those of the settings, then those of views alone.
OPTIONS: tuple[Option, ...] = (
    *(setting.option for setting in SETTINGS if setting.option is not None),
    ATOMIC,
)


def user_settings() -> Mapping[str, Any]:
    value = getattr(settings, "IDEMPOTENCY", {})
    return value if isinstance(value, Mapping) else {}


#: The ``cache_clear`` of every function cached with :func:`derived`.
_DERIVED: list[Callable[[], None]] = []


def derived(func: F) -> F:
    """Cache ``func`` (hashable arguments) until ``settings.IDEMPOTENCY`` changes."""
    cached = cache(func)
    _DERIVED.append(cached.cache_clear)
    return cast(F, cached)


#: Each setting's value, as :class:`Setting` reads it: forgotten when the settings change.
_VALUES: dict[str, Any] = {}
_DERIVED.append(_VALUES.clear)


def _value(setting: Setting[Any]) -> Any:
    value = user_settings().get(setting.name, setting.default)
    try:
        return setting.convert(value, setting.label)
    except (TypeError, ValueError) as exc:  # the system checks say so first
        refusal = setting.refusal(value)
        if refusal is None:
            raise ImproperlyConfigured(str(exc)) from exc
        check, message = refusal
        raise ImproperlyConfigured(
            f"({check_name(check.id)}) {message} HINT: {check.hint}"
        ) from exc


#: The tag of the system checks that look at the settings alone (``settings.IDEMPOTENCY`` and
#: the ``DATABASES`` entry ``DATABASE_ALIAS`` names; no query, no URLconf): those
#: :func:`usable` runs. :meth:`.IdempotencyConfig.ready` registers them with it.
SETTINGS_CHECKS = "django_idempotency.settings"


@derived
def usable() -> None:
    """Refuse settings the system checks refuse: ``ImproperlyConfigured`` in their words (id,
    message, hint), every ``ERROR`` of the checks tagged :data:`SETTINGS_CHECKS` that
    ``SILENCED_SYSTEM_CHECKS`` does not silence; then read every setting, so a value its
    converter cannot read at all (an ``ENCRYPTION_KEYS`` that is not a Fernet key) is refused
    too, silenced or not.

    The one validator of the settings, run by ``manage.py check`` (the same checks, through
    Django's registry), when the app loads (:meth:`.IdempotencyConfig.ready`: gunicorn and
    uvicorn run no system checks, and do not start), by every command that reads them (the
    relay), and by every policy before anything is claimed (settings changed at run time,
    ``override_settings``). Otherwise ``METHODS: "POST"`` protected nothing and
    ``LOCK_TIMEOUT: 0`` ran one key's view once per duplicate under gunicorn while ``check``
    and the relay refused them; and a value read only after the view ran, to store
    its result, let the retry run the view again. The checks that need the URLconf
    (E033, E061, E071) are kept by each view's policy before its claim, and those that query
    the database warn only. Cached until the settings change, as each value is.
    """
    from django.core.checks.registry import registry

    refused = [
        message
        for check in registry.get_checks()
        if SETTINGS_CHECKS in getattr(check, "tags", ())
        # No databases: the checks that query (W002, W003) stay with ``check --database``.
        for message in check(app_configs=None, databases=None)
        if message.is_serious() and not message.is_silenced()
    ]
    if refused:
        raise ImproperlyConfigured("\n".join(words(message) for message in refused))
    for setting in SETTINGS:
        setting.__get__(conf)


def words(message: CheckMessage) -> str:
    """A check's message as :func:`usable` and a setting's read refuse it."""
    return f"({message.id}) {message.msg} HINT: {message.hint or DOCS}"


#: The other settings the checks of :data:`SETTINGS_CHECKS` read.
_READ_BY_CHECKS = frozenset({"DATABASES", "CACHES", "TASKS", "SILENCED_SYSTEM_CHECKS"})


def _clear_caches(*, setting: str, **kwargs: object) -> None:
    if setting == "IDEMPOTENCY" or setting in _READ_BY_CHECKS:
        for clear in _DERIVED:
            clear()


def connect_signals() -> None:
    setting_changed.connect(_clear_caches, dispatch_uid="django_idempotency.conf")
