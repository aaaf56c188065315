"""Every setting and view option, declared once, and the typed, cached reads of the settings.

A declaration gives a key of ``settings.IDEMPOTENCY`` its default, how it is read, its system
checks (ids, tests, hints), whether a view may override it (and ``idempotent_function``), and
its line in the docs. ``DEFAULTS``, ``conf``, the checks (:mod:`._checks`), a view's options and
policy (:mod:`._options`), the DRF mixin's ``idempotency_<name>`` attributes and the settings
page (``docs/_ext``) all derive from it; adding a setting is one declaration plus the code that
uses it (``docs/contributing.rst``).

Settings are read from ``settings.IDEMPOTENCY`` so ``override_settings`` just works; nothing is
ever written into ``django.conf.settings``. Every value, and everything :func:`derived` from
them, is computed once and cached until the ``setting_changed`` signal says ``IDEMPOTENCY``
changed (``override_settings`` and pytest-django's ``settings`` fixture send it): a protected
request reads about ten of them, and a cached read costs nothing next to a parse.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import timedelta
from functools import cache
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, overload

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from django_idempotency._base import durations
from django_idempotency._base.keys import KeyFormat
from django_idempotency._conf import values
from django_idempotency._conf.values import FINGERPRINT_ARGUMENTS, SCOPE_ARGUMENTS, Test

if TYPE_CHECKING:
    from cryptography.fernet import MultiFernet
    from django.http import HttpRequest

ScopeFunction = Callable[["HttpRequest"], str]
FingerprintFunction = Callable[["HttpRequest", str], str]
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

DOCS = "See https://django-idempotency.readthedocs.io/en/latest/settings.html"


def check_name(id_: int, level: str = "E") -> str:
    """A check's full id, as ``manage.py check`` prints it: ``django_idempotency.E041``."""
    return f"django_idempotency.{level}{id_:03d}"


@dataclass(frozen=True)
class Check:
    """A system check of one setting: ``django_idempotency.E<id>`` when ``test`` refuses it."""

    id: int
    test: Test
    hint: str = DOCS


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
        *checks: Check,
        doc: str,
        option: Option | None = None,
        shown: str | None = None,
    ) -> None:
        self.default = default
        self.convert = convert
        self.checks = checks
        self.doc = doc
        self.option = option
        #: The default as the docs show it, where ``repr`` would not do.
        self.shown = shown
        if option is not None:
            option.tests = option.tests or tuple(check.test for check in checks)

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
                return check, str(exc)
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


def _import(value: Any, name: str) -> Callable[..., Any]:
    try:
        return values.import_callable(value)
    except (ImportError, TypeError) as exc:
        raise TypeError(f"{name}: {exc}") from exc


def _alias(value: Any, name: str) -> str:
    """A database alias of ``DATABASES`` (E018 says so first): with no database, no record
    can be claimed (issue 38)."""
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


def _function(
    default: str, ids: tuple[int, int], arguments: tuple[str, ...], *, doc: str
) -> Setting[Any]:
    """A function of the request: a dotted path or a callable as a setting (check ``ids``: one
    that cannot be imported, one that cannot be called with ``arguments``), a hashable callable
    as a view's option."""
    called_as = values.called_as(*arguments)

    def convert(value: Any, name: str) -> Callable[..., Any]:
        # One that cannot be called so can never work: refused before any view runs (issue 38).
        return called_as(_import(value, name), name)  # type: ignore[no-any-return]

    return Setting(
        default,
        convert,
        Check(ids[0], values.importable),
        Check(
            ids[1], called_as, hint=f"It is called as f({', '.join(arguments)}) and returns a str."
        ),
        option=Option(tests=(values.hashable, called_as)),
        doc=doc,
    )


def _switch(default: bool, *, doc: str, option: Option | None = None) -> Setting[bool]:
    """On or off: read as its truth; the checks want True or False (E002, one id for all)."""
    return Setting(default, _coerce(bool), Check(2, values.boolean), option=option, doc=doc)


def _duration(default: timedelta, check: int, *, doc: str) -> Setting[timedelta]:
    """A positive ``timedelta`` or number of seconds, which views and functions may override."""
    return Setting(
        default,
        durations.to_timedelta,
        Check(check, values.positive_duration),
        option=Option(function=True),
        doc=doc,
    )


_SAFE_HINT = "Safe methods are never protected; list POST, PATCH, PUT or DELETE."
_HEADERS_HINT = "Cookies belong to one client and hop-by-hop headers to one connection."


class Settings:
    """Typed access to ``settings.IDEMPOTENCY``, and the declaration of each key, in the
    order of their first check ids; see ``docs/settings.rst``."""

    ENABLED = _switch(True, doc="Off, every protected view is a plain view: no key is read.")
    REQUIRED = _switch(
        False,
        option=Option(),
        doc="A protected request without a key is refused (``400 missing-idempotency-key``).",
    )
    HEARTBEAT = _switch(
        True,
        option=Option(function=True),
        doc="Renew the lock of every attempt in flight, so a slow live one is never taken over.",
    )
    BARE_KEYS = _switch(True, doc="A key may be sent bare as well as quoted, as the draft has it.")
    COMPRESSION = _switch(
        True,
        doc="Store a response body over 1 KiB compressed (zlib) when that makes it smaller; "
        "replays are byte-identical either way (:doc:`storage`).",
    )
    HEADER = Setting(
        "Idempotency-Key",
        _coerce(str),
        Check(3, values.header_name),
        doc="The request header carrying the key.",
    )
    METHODS = Setting(
        ("POST", "PATCH"),
        _upper,
        Check(4, values.methods),
        Check(20, values.unsafe_methods, hint=_SAFE_HINT),
        option=Option(),
        doc="The methods a protected view protects; others pass through.",
    )
    TTL = _duration(
        timedelta(hours=24), 5, doc="How long a record is kept and replayed, from its claim."
    )
    LOCK_TIMEOUT = _duration(
        timedelta(seconds=30),
        6,
        doc="How long an attempt that shows no sign of life keeps its key before a retry may "
        "take it over.",
    )
    WAIT_TIMEOUT = _duration(
        timedelta(seconds=10), 7, doc="The longest a duplicate waits for the first."
    )
    IN_PROGRESS = Setting(
        "conflict",
        _coerce(str),
        Check(9, values.in_progress),
        option=Option(function=True),
        doc='What a duplicate of an attempt in flight gets: ``"conflict"`` (``409``) or '
        '``"wait"`` (the result).',
    )
    RETRY_AFTER = Setting(
        1,
        _coerce(int),
        Check(10, values.positive_int),
        doc="The ``Retry-After`` of a ``409`` and of a ``503``, in seconds.",
    )
    RETRYABLE_STATUSES: Setting[Collection[int]] = Setting(
        frozenset({408, 429, *range(500, 600)}),
        _coerce(frozenset),
        Check(11, values.statuses),
        shown="408, 429 and 500 to 599",
        doc="Statuses that are not stored: the key is released and a retry runs again.",
    )
    MISMATCH_STATUS = Setting(
        422,
        _coerce(int),
        Check(12, values.mismatch_status),
        doc="The status of ``idempotency-key-reuse``: ``422``, or ``400`` as Stripe does.",
    )
    MIN_KEY_LENGTH = Setting(
        1,
        _coerce(int),
        Check(13, values.key_length),
        doc="Shorter keys are ``400 invalid-idempotency-key``.",
    )
    REPLAYED_HEADERS = Setting(
        ("Content-Type", "Location", "ETag", "Link", "Content-Language"),
        _lower,
        Check(14, values.header_names),
        Check(21, values.stored_headers, hint=_HEADERS_HINT),
        doc="The response headers stored and replayed.",
    )
    SCOPE_FUNCTION: Setting[ScopeFunction] = _function(
        "django_idempotency.user_scope",
        (15, 24),
        SCOPE_ARGUMENTS,
        doc="Whose key it is: a function of the request (or its dotted path) returning a string.",
    )
    FINGERPRINT_FUNCTION: Setting[FingerprintFunction] = _function(
        "django_idempotency.request_fingerprint",
        (16, 25),
        FINGERPRINT_ARGUMENTS,
        doc="What makes a retry the same request: a function of the request and the scope "
        "(or its dotted path) returning a string.",
    )
    MAX_BODY_SIZE = Setting(
        1024 * 1024,
        _coerce(int),
        Check(17, values.positive_int),
        shown="1 MiB (1,048,576 bytes)",
        doc="A larger response body, as the client receives it, is returned but not stored; "
        "its retries get ``500``.",
    )
    # E018, E019 and E030 to E032: the database DATABASE_ALIAS names (_checks.check_database).
    DATABASE_ALIAS = Setting(
        "default",
        _alias,
        doc="The database alias holding the records.",
    )
    PROBLEM_TYPE_BASE = Setting(
        "https://django-idempotency.readthedocs.io/en/latest/problems.html#",
        _coerce(str),
        Check(
            22,
            values.absolute_uri,
            hint="Problem slugs are appended to it to make each problem's 'type', e.g. "
            "'https://api.example.com/docs/errors#'.",
        ),
        doc="The absolute URI each problem's slug is appended to, making its ``type``.",
    )
    KEY_FORMAT: Setting[KeyFormat] = Setting(
        "any",
        values.key_format,
        Check(
            23,
            values.key_format,
            hint="A string is a name ('any' or 'uuid'), never a pattern: give a pattern "
            "as re.compile(r'...').",
        ),
        option=Option(function=True),
        doc='What a key must look like: ``"any"``, ``"uuid"`` or a compiled regular expression.',
    )
    MAX_STORED_BODY_SIZE = Setting(
        None,
        values.optional_positive_int,
        Check(40, values.optional_positive_int),
        doc="The most bytes a response may take in the table once compressed (and encrypted); "
        "``None``: no limit of its own. Set it and raise ``MAX_BODY_SIZE`` to store larger "
        "bodies that compress well (:doc:`storage`).",
    )
    ENCRYPTION_KEYS: Setting[MultiFernet | None] = Setting(
        (),
        _fernet,
        Check(41, values.fernet_keys, hint="Make a key with Fernet.generate_key()."),
        Check(42, values.encryption_available),
        shown="none",
        doc="Fernet keys: the first encrypts the stored headers and body, every one decrypts, "
        "so keys rotate (:doc:`storage`). Needs the ``encryption`` extra.",
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


@derived
def usable() -> None:
    """Read every setting: one that can never work (a value its converter cannot read, such as
    an ``ENCRYPTION_KEYS`` that is not a Fernet key) is ``ImproperlyConfigured`` here, in the
    words of its system check.

    Called when the app loads (:meth:`.IdempotencyConfig.ready`: a server where no checks run,
    gunicorn, refuses to start) and by every policy, before anything is claimed (settings
    changed at run time, ``override_settings``): otherwise such a setting is first read after
    the view ran, to store its result, and the view runs again on the retry (issue 38).
    Cached until the settings change, as each value is.
    """
    for setting in SETTINGS:
        setting.__get__(conf)


def _clear_caches(*, setting: str, **kwargs: object) -> None:
    if setting == "IDEMPOTENCY":
        for clear in _DERIVED:
            clear()


def connect_signals() -> None:
    setting_changed.connect(_clear_caches, dispatch_uid="django_idempotency.conf")
