"""System checks of ``settings.IDEMPOTENCY``, of its database and of the protected views the
URLconf reaches: one id per kind of mistake, each with a hint.

The checks of one value (E002 to E017, E020 to E025, E040 to E042, E070) are declared on their
setting's line in :mod:`.._conf.settings`, their words with their tests, and run here in its
order, which is that of their ids; those that look at more than one value, the database or the
views follow, one function each, in the order of their ids, with their row of
``docs/checks.rst`` above them (:func:`refusing`): a check's id, row, message and hint stand
together. ``docs/checks.rst``'s table is made from both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from typing import Any, TypeVar

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError
from django.db.utils import load_backend
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from django_idempotency._base import durations
from django_idempotency._call import operations
from django_idempotency._conf.options import Options, ttl_error, ttl_under_lock
from django_idempotency._conf.settings import (
    DEFAULTS,
    SETTINGS,
    Setting,
    Settings,
    check_name,
    conf,
    user_settings,
)
from django_idempotency._conf.values import DOCS
from django_idempotency._http import adapter as protocol
from django_idempotency._http import placement
from django_idempotency._store import VENDORS, charsets, galera, served, time_zones

F = TypeVar("F", bound=Callable[..., Any])

#: What each check below refuses, by id (``E001``): its row in ``docs/checks.rst``.
REFUSES: dict[str, str] = {}


def refusing(row: str) -> Callable[[F], F]:
    """Declare the check a function makes (its id is its name's: ``e018_...`` is E018) and
    what it refuses, as ``docs/checks.rst`` says it."""

    def declare(function: F) -> F:
        REFUSES[function.__name__[:4].upper()] = row
        return function

    return declare


def _error(id_: int, msg: str, hint: str = DOCS) -> Error:
    return Error(msg, hint=hint, id=check_name(id_))


def check_settings(**kwargs: Any) -> list[CheckMessage]:
    raw = getattr(settings, "IDEMPOTENCY", {})
    if not isinstance(raw, Mapping):
        return [e001_not_a_dict(raw)]
    errors: list[CheckMessage] = list(w001_unknown_keys(raw))
    for setting in SETTINGS:
        errors += _declared(setting, raw.get(setting.name, setting.default))
    errors += e008_lock_outlives_ttl(raw)
    errors += e056_outbox_undeliverable(raw)
    return errors


def check_database(**kwargs: Any) -> list[CheckMessage]:
    """The first mistake about the database ``DATABASE_ALIAS`` names, the most basic first:
    read from ``DATABASES`` alone, so asked by every ``check`` (and at startup)."""
    alias = user_settings().get("DATABASE_ALIAS", DEFAULTS["DATABASE_ALIAS"])
    for check in (
        e018_unknown_alias,
        e030_backend,
        e031_isolation,
        e032_sqlite_shared,
        e019_atomic_requests,
    ):
        if error := check(alias):
            return [error]
    return []


def check_database_server(**kwargs: Any) -> list[CheckMessage]:
    """What only the database server can say (it queries): asked where Django asks about
    databases (``check --database``, ``migrate``), of a ``DATABASE_ALIAS`` whose settings
    :func:`check_database` finds usable. Tagged ``database``, which Django 6.1 runs only then
    (its ``check`` without ``--database`` left the settings' own checks unasked when they were
    one function)."""
    alias = user_settings().get("DATABASE_ALIAS", DEFAULTS["DATABASE_ALIAS"])
    if alias not in (kwargs.get("databases") or ()) or check_database():
        return []
    return (
        w002_time_zone_tables(alias)
        + w003_galera_eviction(alias)
        + e034_narrow_character_set(alias)
    )


def _declared(setting: Setting[Any], value: object) -> list[CheckMessage]:
    """The first of a setting's declared checks that its value fails."""
    if refusal := setting.refusal(value):
        check, message = refusal
        return [_error(check.id, message, check.hint)]
    return []


@refusing("``IDEMPOTENCY`` is not a dict")
def e001_not_a_dict(raw: object) -> Error:
    return _error(1, f"IDEMPOTENCY must be a dict, not {type(raw).__name__}.")


@refusing("``IDEMPOTENCY`` has an unknown key (a typo?)")
def w001_unknown_keys(raw: Mapping[str, Any]) -> Iterator[CheckMessage]:
    for name in raw:
        if name not in DEFAULTS:
            yield Warning(
                f"IDEMPOTENCY has an unknown key {name!r}.",
                hint=f"Known keys: {', '.join(sorted(DEFAULTS))}.",
                id="django_idempotency.W001",
            )


@refusing("``LOCK_TIMEOUT`` is longer than ``TTL``")
def e008_lock_outlives_ttl(raw: Mapping[str, Any]) -> list[CheckMessage]:
    try:
        ttl, lock = (
            durations.positive(raw.get(setting.name, setting.default), setting.label)
            for setting in (Settings.TTL, Settings.LOCK_TIMEOUT)
        )
    except (TypeError, ValueError):
        return []  # E005, E006
    if error := ttl_error(ttl, lock, (Settings.TTL.label, Settings.LOCK_TIMEOUT.label)):
        return [
            _error(8, error, hint="A record would expire while still locked; make the TTL longer.")
        ]
    return []


@refusing("``DATABASE_ALIAS`` is not in ``DATABASES``")
def e018_unknown_alias(alias: str) -> Error | None:
    if alias in settings.DATABASES:
        return None
    return _error(18, f"IDEMPOTENCY['DATABASE_ALIAS'] {alias!r} is not in DATABASES.")


@refusing(
    "``ATOMIC_REQUESTS`` on the ``DATABASE_ALIAS`` database: a two-phase claim would "
    "commit only with the view"
)
def e019_atomic_requests(alias: str) -> Error | None:
    if not settings.DATABASES[alias].get("ATOMIC_REQUESTS"):
        return None
    return _error(
        19,
        f"DATABASES[{alias!r}] has ATOMIC_REQUESTS, so two-phase claims would commit only "
        "with the view, and duplicates would not see them while it runs.",
        hint="Point IDEMPOTENCY['DATABASE_ALIAS'] at a second alias for the same "
        "database without ATOMIC_REQUESTS (docs: 'ATOMIC_REQUESTS').",
    )


@refusing(
    "the database cannot convert dates to ``TIME_ZONE`` (MySQL or MariaDB without its "
    "time-zone tables): the admin's list has no date hierarchy; asked with ``--database`` only"
)
def w002_time_zone_tables(alias: str) -> list[CheckMessage]:
    zone = timezone.get_default_timezone_name()
    store = served(alias)
    try:
        if store is None or store.converts_dates_to(zone):
            return []
    except DatabaseError:
        return []  # unreachable now: nothing to say about its tables
    return [
        Warning(
            f"DATABASES[{alias!r}] cannot convert dates to TIME_ZONE {zone!r} (MySQL or "
            "MariaDB without its time-zone tables): the admin lists idempotency records "
            "without its date hierarchy (by year, month and day). Everything else works.",
            hint=time_zones.LOAD_TABLES,
            id="django_idempotency.W002",
        )
    ]


@refusing(
    "on a MariaDB Galera node, ``LOCK_TIMEOUT`` or a two-phase view's ``lock_timeout`` is "
    "not above 1.5 times ``evs.suspect_timeout``: a node's death stalls writes longer than a "
    "renewed lock is sure to last, and a view could run twice (:doc:`scale`); asked with "
    "``--database`` only"
)
def w003_galera_eviction(alias: str) -> list[CheckMessage]:
    """On a Galera node, :func:`eviction_warnings` for its ``evs.suspect_timeout``."""
    store = served(alias)
    try:
        stall = None if store is None else store.eviction_stall()
    except (DatabaseError, ValueError):
        return []  # unreachable now: nothing to say about its settings
    return [] if stall is None else eviction_warnings(stall)


def eviction_warnings(stall: timedelta) -> list[CheckMessage]:
    """Each lock timeout (``LOCK_TIMEOUT``, and each two-phase view's own) whose renewed two
    thirds do not outlast ``stall``, the time writes stall while the survivors evict a dead
    node: a view could run twice."""
    try:
        locks = [(Settings.LOCK_TIMEOUT.label, conf.LOCK_TIMEOUT), *_view_lock_timeouts()]
    except ImproperlyConfigured:
        return []  # bad settings: the settings checks report them
    least = galera.least_lock_timeout(stall)
    return [
        Warning(
            f"{name} is {lock}, and on this Galera cluster a node's death stalls every write "
            f"for {galera.SUSPECT_TIMEOUT} ({stall}) until the others evict it. An attempt "
            f"renewing its lock every third of it holds two thirds ({lock * 2 / 3}) at the "
            "least when the fault comes: its lock can lapse in the stall, and a retry through "
            "another node run the view again.",
            hint=f"Make the lock timeout longer than {least} (1.5 x {galera.SUSPECT_TIMEOUT}), "
            f"or shorten {galera.SUSPECT_TIMEOUT} (docs: 'Scale', Galera).",
            id=check_name(3, "W"),
        )
        for name, lock in locks
        if not galera.outlasts(lock, stall)
    ]


def _view_lock_timeouts() -> Iterator[tuple[str, timedelta]]:
    """(name, lock timeout) of each two-phase protected view with a ``lock_timeout`` of its
    own; an atomic view's claim commits with its result, and is never left to lapse."""
    seen: set[str] = set()
    for name, found in _protected_views():
        options = found() if callable(found) else found
        lock = options.get("lock_timeout")
        if name not in seen and lock is not None and not options.atomic:
            seen.add(name)
            yield f"{name}: lock_timeout", lock


@refusing("the ``DATABASE_ALIAS`` database is not PostgreSQL, MySQL/MariaDB or SQLite")
def e030_backend(alias: str) -> Error | None:
    database = settings.DATABASES[alias]
    if _vendor(database.get("ENGINE", "")) in VENDORS:
        return None
    return _error(
        30,
        f"DATABASES[{alias!r}] uses {database.get('ENGINE')!r}, a database backend "
        "django-idempotency does not support.",
        hint=f"Supported: {', '.join(store.name for store in VENDORS.values())} (docs: "
        "'Installation'). Point IDEMPOTENCY['DATABASE_ALIAS'] at one of them.",
    )


@refusing(
    "MySQL/MariaDB with an isolation level other than read committed on the "
    "``DATABASE_ALIAS`` database"
)
def e031_isolation(alias: str) -> Error | None:
    database = settings.DATABASES[alias]
    store = VENDORS.get(_vendor(database.get("ENGINE", "")))
    isolation = (database.get("OPTIONS") or {}).get("isolation_level")
    if store is None or not store.isolation_level or isolation in (None, store.isolation_level):
        return None
    return _error(
        31,
        f"DATABASES[{alias!r}] sets isolation_level {isolation!r}: on {store.name} "
        "a claim in atomic mode must read the rows other attempts committed "
        "after its transaction's snapshot.",
        hint=f"Use Django's default, {store.isolation_level!r}, or point "
        "IDEMPOTENCY['DATABASE_ALIAS'] at a second alias that does (docs: "
        "'Installation').",
    )


@refusing(
    "SQLite: an alias of the ``DATABASE_ALIAS`` file has ``ATOMIC_REQUESTS``, whose "
    "transaction holds the file's only write lock"
)
def e032_sqlite_shared(alias: str) -> Error | None:
    if not (shared := _sqlite_shared_with_atomic_requests(alias)):
        return None
    return _error(
        32,
        f"IDEMPOTENCY['DATABASE_ALIAS'] {alias!r} is the SQLite file of "
        f"DATABASES[{shared!r}], which has ATOMIC_REQUESTS: the request's transaction "
        "holds the file's only write lock, so no claim or result could be written.",
        hint="On SQLite, drop ATOMIC_REQUESTS (or use atomic=True views); a second "
        "alias works on PostgreSQL and MySQL (docs: 'ATOMIC_REQUESTS').",
    )


def check_views(**kwargs: Any) -> list[CheckMessage]:
    return [
        *e033_view_ttl_under_lock(),
        *e035_idempotent_before_authentication(),
        *e071_accepted_without_status_urls(),
    ]


@refusing(
    "a protected view in the URLconf has a ``ttl`` shorter than its ``lock_timeout`` (one "
    "of them from the settings)"
)
def e033_view_ttl_under_lock() -> list[CheckMessage]:
    """A view's TTL under its lock timeout lets a duplicate take over a record whose owner still
    runs, and both execute. Options given together are refused when the decorator or
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


@refusing(
    "MySQL/MariaDB: the idempotency table's ``scope`` column, the claim procedure or the "
    "session of the ``DATABASE_ALIAS`` database is not ``utf8mb4``: a scope with a character "
    "outside it is folded to ``?`` (two principals share records) or refused by the server; "
    "asked with ``--database``, and once per connection before its first claim (then "
    "``500 idempotency-misconfigured``, the view not run)"
)
def e034_narrow_character_set(alias: str) -> list[CheckMessage]:
    store = served(alias)
    if store is None or store.features.keeps_every_scope:
        return []
    try:
        found = charsets.narrow(alias)
    except DatabaseError:
        return []  # unreachable now: nothing to say about its character sets
    if found is None:
        return []
    return [charsets.error(alias, found)]


@refusing(
    "``@idempotent`` (through ``method_decorator``) on the ``dispatch`` of a view in the "
    "URLconf that authenticates or refuses callers inside it: a DRF view, an ``AccessMixin``"
)
def e035_idempotent_before_authentication() -> list[CheckMessage]:
    """A DRF view authenticates inside its ``dispatch``, an ``AccessMixin`` refuses there: a
    claim made around it would read the user before a token or Basic credentials were (every
    caller's key the anonymous scope's), or claim and store a refused caller's redirect.
    ``method_decorator`` decorates the method anew at each call, so the decorator itself
    refuses these only at the first request; this refuses them at startup."""
    errors: list[CheckMessage] = []
    seen: set[type] = set()
    try:
        patterns = get_resolver().url_patterns
    except Exception:  # a broken URLconf is reported by Django's own checks
        return errors
    for callback in _callbacks(patterns):
        view_class = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
        if not isinstance(view_class, type) or view_class in seen:
            continue
        seen.add(view_class)
        if (refusal := placement.misplaced_dispatch(view_class)) is not None:
            errors.append(
                _error(
                    35,
                    f"{view_class.__module__}.{view_class.__qualname__}: {refusal}",
                    hint="See the orders that work (docs: 'Decorator order').",
                )
            )
    return errors


@refusing(
    "the outbox is configured (an ``OUTBOX_*`` key) but nothing can deliver its messages: "
    "neither Celery installed nor ``django.tasks`` with a ``TASKS`` backend (Django 6.0+)"
)
def e056_outbox_undeliverable(raw: Mapping[str, Any]) -> list[CheckMessage]:
    if not any(name.startswith("OUTBOX_") for name in raw) or _outbox_deliverable():
        return []
    return [
        _error(
            56,
            "IDEMPOTENCY configures the outbox, but neither Celery nor django.tasks (with "
            "TASKS) is available to deliver its messages.",
            hint="Install Celery, or configure TASKS on Django 6.0+ (docs: outbox).",
        )
    ]


def _outbox_deliverable() -> bool:
    import importlib.util

    if importlib.util.find_spec("celery") is not None:
        return True
    return importlib.util.find_spec("django.tasks") is not None and bool(
        getattr(settings, "TASKS", None)
    )


@refusing(
    '``in_progress="accepted"`` (the setting or a protected view\'s option) without '
    "``django_idempotency.urls`` in the URLconf"
)
def e071_accepted_without_status_urls() -> list[CheckMessage]:
    """A ``202`` points at its operation's status URL, reversed from the app's URLconf: without
    it every duplicate of a running request would fail."""
    users = ["IDEMPOTENCY['IN_PROGRESS']"] if conf.IN_PROGRESS == "accepted" else []
    for name, found in _protected_views():
        options = found() if callable(found) else found
        if isinstance(options, Options) and options.get("in_progress") == "accepted":
            users.append(name)
    if not users:
        return []
    try:
        operations.status_url("0.x")
    except ImproperlyConfigured:
        return [
            _error(
                71,
                f"{', '.join(sorted(set(users)))} answer{'s' if len(users) == 1 else ''} "
                "duplicates 202 Accepted with their operation's status URL, but "
                "django_idempotency.urls is not in the URLconf.",
                hint='Add path("idempotency/", include("django_idempotency.urls")) to your '
                "URLconf (docs: 'Long-running operations').",
            )
        ]
    return []


def _protected_views() -> Iterator[tuple[str, Any]]:
    """(name, Options or a callable building them) for every protected view in the URLconf."""
    for name, options, _ in protected_targets():
        yield name, options


def protected_targets() -> Iterator[tuple[str, Any, Any]]:
    """(name, Options or a callable building them, its function or class: the code that runs)
    for every protected view in the URLconf."""
    try:
        patterns = get_resolver().url_patterns
    except Exception:  # a broken URLconf is reported by Django's own checks
        return
    ninja = protocol.ninja()
    for callback in _callbacks(patterns):
        if ninja is not None and (operations := ninja._operations(callback)) is not None:
            # A django-ninja path: its protected operations, each a view of its own.
            for operation in operations:
                if (options := ninja._options_of(operation)) is not None:
                    function = operation.view_func
                    yield f"{function.__module__}.{function.__qualname__}", options, function
            continue
        options = getattr(callback, "idempotency_options", None)
        view_class = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
        if options is None and view_class is not None:
            options = getattr(view_class, "get_idempotency_options", None)
            options = options or getattr(view_class.dispatch, "idempotency_options", None)
        if isinstance(options, Options) or callable(options):
            name = getattr(view_class or callback, "__qualname__", repr(callback))
            target = view_class or callback
            yield f"{getattr(target, '__module__', '')}.{name}", options, target


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
