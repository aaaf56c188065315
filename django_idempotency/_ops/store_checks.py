"""System checks of the stores other than the database (a Redis store, or another of the
registry's): atomic views on one (E061), and at ``check --deploy`` whether each answers (E062),
keeps what it acknowledged (W060) and never evicts a record (E063), each asked of the store
contract. ``STORE``'s own value is checked on its setting's line (E060). Every message names a
store as its class describes it (:func:`described`), never as Redis by default."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.core.checks import CheckMessage, Error, Warning
from django.core.exceptions import ImproperlyConfigured
from django.utils.text import capfirst

from django_idempotency._conf import stores as registry
from django_idempotency._conf.options import ATOMIC_ON_SETTING, atomic_error
from django_idempotency._conf.settings import check_name, conf
from django_idempotency._conf.values import DATABASE, display_name, short_error, store_alias
from django_idempotency._ops.checks import _protected_views, refusing


def check_stores(**kwargs: Any) -> list[CheckMessage]:
    return e061_atomic_on_redis()


def described(store: str) -> str:
    """How messages name the store ``store`` (``STORE``'s value, a view's ``store``): as its
    class describes itself (``Redis store 'redis://host:6379/0'``, ``database 'default'``),
    without a password; a name no store serves, as it is shown."""
    return described_alias(store_alias(store, conf.DATABASE_ALIAS if store == DATABASE else ""))


def described_alias(alias: str) -> str:
    """:func:`described` of the name the store layer knows a store by (a database alias,
    ``cache:<alias>``, a URL)."""
    kind = registry.kind_of(alias)
    return f"store {display_name(alias)!r}" if kind is None else kind.describe(alias)


def expiry(store: str) -> str:
    """How the store ``store``'s records leave it of their own (``its records expire by Redis's
    own TTL``); ``""``: by the cleanup, or as the store says."""
    kind = registry.kind_of(store_alias(store, ""))
    return kind.expiry if kind is not None else ""


def check_stores_deploy(**kwargs: Any) -> list[CheckMessage]:
    """At ``check --deploy``: each store the settings and views name besides the database
    answers, and persists every write."""
    messages: list[CheckMessage] = []
    for store in sorted(other_stores()):
        messages += w061_unbounded(store)
        if error := e062_unreachable(store):
            messages.append(error)
        else:
            messages += w060_appendonly(store)
            messages += e063_eviction(store)
    return messages


@refusing(
    "a Redis store's ``maxmemory-policy`` can evict records (anything but ``noeviction``: "
    "every record has a TTL, so the ``volatile-*`` policies evict them as readily as "
    "``allkeys-*``), or ``CONFIG GET`` is not allowed (W062); asked with ``--deploy`` only"
)
def e063_eviction(store: str) -> list[CheckMessage]:
    """Refuse an eviction policy that can remove records: an evicted record is a key whose
    view runs again, or a live owner's lock lost to a duplicate (``allkeys-lru``
    and ``volatile-lru`` each ran 20 of 20 keys twice beside cache writes)."""
    from django_idempotency._store import using

    try:
        policies = using(store_alias(store, "")).eviction_policies()
    except Exception as exc:
        return [
            Warning(
                f"Could not read the maxmemory-policy of the {described(store)} "
                f"({short_error(exc, store)}): CONFIG may be renamed or forbidden to this user. "
                "Under any policy but noeviction, Redis evicts records when memory runs out, and "
                "their keys run their views again.",
                hint="Make sure the server runs with maxmemory-policy noeviction "
                "(docs: 'Choosing the store').",
                id=check_name(62, "W"),
            )
        ]
    evicting = {node: policy for node, policy in policies.items() if policy != "noeviction"}
    if not evicting:
        return []
    where = ", ".join(
        f"{policy}{f' on {node}' if node else ''}" for node, policy in sorted(evicting.items())
    )
    return [
        Error(
            f"The {described(store)} runs with maxmemory-policy {where}: when memory runs "
            "out, Redis evicts idempotency records (each has a TTL, so volatile-* policies "
            "evict them too), and their keys run their views again; an evicted record in "
            "flight lets a duplicate run beside its owner.",
            hint="Set maxmemory-policy noeviction on the store's server (a full server then "
            "refuses claims: 503), and keep caches that need eviction on another server "
            "(docs: 'Choosing the store').",
            id=check_name(63),
        )
    ]


@refusing(
    "a Redis store's client has no socket timeout and a pool the store cannot bound call by "
    "call (Sentinel's, a blocking or a caching pool): a frozen server holds a request for "
    "good; asked with ``--deploy`` only"
)
def w061_unbounded(store: str) -> list[CheckMessage]:
    from django_idempotency._store import using

    pool = using(store_alias(store, "")).unbounded_pool()
    if pool is None:
        return []
    return [
        Warning(
            f"The {described(store)} has no socket timeout, and its pool "
            f"({pool}) is one whose connections the store takes call by "
            "call: a frozen or blackholed server holds each call there for good.",
            hint='Give the cache OPTIONS {"socket_timeout": 5, "socket_connect_timeout": 5}, '
            "or a plain ConnectionPool (docs: 'Choosing the store').",
            id=check_name(61, "W"),
        )
    ]


def _views() -> Iterator[tuple[str, Any]]:
    for name, found in _protected_views():
        yield name, found() if callable(found) else found


def _setting_store() -> str | None:
    try:
        return str(conf.STORE)
    except ImproperlyConfigured:
        return None  # E060 says so


def other_stores() -> set[str]:
    """Every store other than the database (``STORE``'s values: a Redis store's, another's
    of the registry) the settings and the URLconf's views name."""
    stores = {_setting_store()}
    stores |= {options.get("store") for _, options in _views()}
    return {store for store in stores if store is not None and store != DATABASE}


def kind_name(store: str) -> str:
    """The kind of the store ``store`` for people, as its class names it (``Redis``)."""
    kind = registry.kind_of(store_alias(store, ""))
    return kind.name if kind is not None else display_name(store)


@refusing(
    "a protected view (in the URLconf or not) or function is ``atomic=True`` on a Redis store "
    "(``STORE`` or its ``store``): Redis shares no transaction with the view's database"
)
def e061_atomic_on_redis() -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    setting = _setting_store()
    seen: set[object] = set()  # each view by its name and its options (method_decorator's)
    for name, options in [*_views(), *ATOMIC_ON_SETTING.values()]:
        store = options.get("store") or setting
        if name in seen or id(options) in seen or store is None:
            continue
        seen |= {name, id(options)}
        if error := atomic_error(options.atomic, store, options.get("in_progress")):
            errors.append(
                Error(
                    f"{name}: {error}",
                    hint="Drop atomic=True, or give the view store='database' "
                    "(docs: 'Choosing the store').",
                    id=check_name(61),
                )
            )
    return errors


@refusing(
    "a store the settings or views name besides the database (a Redis store) does not "
    "answer (the store contract's ``ping()``), or answers but has not what it is set to use "
    "(a Redis database number the server's ``databases`` does not reach); asked with "
    "``--deploy`` only"
)
def e062_unreachable(store: str) -> Error | None:
    from django_idempotency._store import using

    alias = store_alias(store, conf.DATABASE_ALIAS if store == DATABASE else "")
    try:
        using(alias).ping()
    except ImproperlyConfigured as exc:
        return Error(
            f"The {described(store)} answers, but {exc}.",
            hint="Correct the store's settings (or its server's) as the message says "
            "(docs: 'Choosing the store').",
            id=check_name(62),
        )
    except Exception as exc:
        return Error(
            f"The {described(store)} does not answer: {short_error(exc, store)}",
            hint="Start it, or point STORE (or the view's store) at one that runs.",
            id=check_name(62),
        )
    return None


@refusing(
    "a Redis store runs without ``appendonly``: a restart loses the records written since "
    "its last snapshot, and their views run again; asked with ``--deploy`` only"
)
def w060_appendonly(store: str) -> list[CheckMessage]:
    from django_idempotency._store import using

    try:
        without = using(store_alias(store, "")).unpersisted()
    except Exception:
        return []  # not ours to read (a managed server): nothing to say
    if not without:
        return []
    where = f" (on {', '.join(without)})" if without != [""] else ""
    return [
        Warning(
            f"The {described(store)} runs with appendonly no{where}: a restart "
            "or a crash loses every record written since its last snapshot, and retries of "
            "those keys run their views again.",
            hint="Set appendonly yes: appendfsync always loses no acknowledged write; "
            "everysec about a second's on a machine crash, and up to two seconds' (a process "
            "crash too) when a slow disk makes Redis postpone its AOF writes. Or keep such "
            "views on the database store (docs: 'Choosing the store').",
            id=check_name(60, "W"),
        )
    ]


def store_notes(verb: str) -> list[str]:
    """What an operator's command says of each store besides the database: it holds records
    this command does not see, and how many (a Redis store's ``SCAN``)."""
    from django_idempotency._store import using

    notes = []
    for store in sorted(other_stores()):
        bound = using(store_alias(store, ""))
        try:
            count = f"{bound.count():,} record(s)"
        except Exception as exc:  # unreachable: say so, and go on
            count = f"not reachable ({short_error(exc, store)})"
        note = f"{capfirst(described(store))}: {count}"
        notes.append(f"{note}; {bound.expiry}, so {verb}." if bound.expiry else f"{note}.")
    return notes


def store_census() -> dict[str, Any]:
    """``idempotency_stats --json``'s ``stores`` (``redis_stores``: the Redis ones of them):
    each store's besides the database (a Redis store's, another's) records by status,
    its stale ones, its operations running and stuck
    (:meth:`~.._store.redis.store.RedisStore.census`) and its outbox's backlog, or ``error``
    when it does not answer. The table's figures beside them do not count these records."""
    from django_idempotency._ops.maintenance import OPERATION_STUCK_AFTER
    from django_idempotency._store import using

    census: dict[str, Any] = {}
    for store in sorted(other_stores()):
        bound = using(store_alias(store, ""))
        shown = display_name(store)  # a key of the JSON: never the password
        try:
            census[shown] = {**bound.census(OPERATION_STUCK_AFTER), **_outbox(store), "error": None}
        except Exception as exc:  # unreachable: say so, and go on
            census[shown] = {
                **dict.fromkeys(("total", "by_status", "stale")),
                **dict.fromkeys(
                    (
                        "operations_running",
                        "operations_stuck",
                        "longest_operation_silence_seconds",
                    )
                ),
                **dict.fromkeys(
                    (
                        "outbox_pending",
                        "outbox_failed",
                        "outbox_oldest_undelivered_age_seconds",
                    )
                ),
                "error": short_error(exc, store),
            }
    return census


def stats_groups(census: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """:func:`store_census`'s entries again under each store class's ``stats_group`` (the
    Redis store's ``redis_stores``: kept for the monitors that read it; ``stores`` has every
    store's). Every group its classes name is there, empty when none of its stores is named."""
    named = {display_name(store): store for store in other_stores()}
    groups: dict[str, dict[str, Any]] = {
        str(getattr(kind, "stats_group", "")): {} for kind in map(registry.kind, registry.STORES)
    }
    for shown, figures in census.items():
        kind = registry.kind_of(store_alias(named[shown], ""))
        groups[str(getattr(kind, "stats_group", ""))][shown] = figures
    groups.pop("", None)
    return groups


def _outbox(store: str) -> dict[str, Any]:
    """A Redis store's outbox figures, named as the database's are (:func:`.relay.backlog`)."""
    from django_idempotency._ops.relay import backlog

    return backlog(store_alias(store, ""))


def admin_notes() -> list[str]:
    """What the admin's list says above the table: which views keep their records in which
    store besides the database, and that the table's list cannot show them (their own is linked)."""
    setting = _setting_store()
    where: dict[str, list[str]] = {}
    for name, options in _views():
        store = options.get("store") or setting
        if store is not None and store != DATABASE and name not in where.setdefault(store, []):
            where[store].append(name)
    if setting is not None and setting != DATABASE:
        where.setdefault(setting, [])
    notes = []
    for store, views in sorted(where.items()):
        which = "STORE, the default" if store == setting else "their store option"
        listed = ", ".join(views[:5]) + (f" and {len(views) - 5} more" if len(views) > 5 else "")
        notes.append(
            f"Records of {'the views ' + listed if views else 'every protected view'} "
            f"({which}) live in the {described(store)}, which this list cannot "
            "show (it lists the database's table): their own list is linked below. "
            f"{capfirst(expiry(store)) + '; i' if expiry(store) else 'I'}dempotency_stats "
            f"counts them, and {_erasure(store)}."
        )
    return notes


def _erasure(store: str) -> str:
    """What erasure by scope does with the store's records: reach them, or be refused for
    every store while it is named (its class has no ``erase_scope``: never half an erasure)."""
    from django_idempotency._store.contract import provides

    kind = registry.kind_of(store_alias(store, ""))
    if kind is None or provides(kind, "erasure"):
        return "erasure by scope reaches them"
    return "erasure by scope is refused while it is named (its class has no erase_scope())"
