"""Whether a MySQL or MariaDB database keeps every scope exactly.

The scope travels from the session (``character_set_client`` and ``_connection``) through the
claim procedure's ``p_scope`` into the table's ``scope`` column, and each converts it to its own
character set. One that is not ``utf8mb4`` has no place for a character outside it (an emoji in
``utf8mb3``, anything beyond Latin-1 in ``latin1``): under a non-strict ``sql_mode`` the server
writes ``?`` for it, so ``tenant:😀`` and ``tenant:😁`` were both ``tenant:?``, one principal,
and each tenant was replayed the other's responses; under a strict one it refuses the statement
(error 1366 or 1267), and every request with such a scope fails. Measured on MariaDB 10.11, for
each of ``utf8mb3`` and ``latin1`` in the column or the session, both modes. With ``utf8mb4``
all the way, the ``sql_mode`` changes nothing of the scope (it is never longer than the column:
:func:`.limits.bounded_scope`). The ``sql_mode`` is a session's, which ``SET GLOBAL`` or an
``init_command`` changes without the app: the character sets are what the check E034 asks for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.checks import CheckMessage, Error
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_idempotency._conf.settings import check_name
from django_idempotency.models import IdempotencyKey

#: The one MySQL character set that holds every character.
FULL = "utf8mb4"

_SESSION = "SELECT @@character_set_client, @@character_set_connection, @@sql_mode"
_COLUMN = (
    "SELECT CHARACTER_SET_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
    "AND TABLE_NAME = %s AND COLUMN_NAME = 'scope'"
)
_PARAMETER = (
    "SELECT CHARACTER_SET_NAME FROM information_schema.PARAMETERS WHERE SPECIFIC_SCHEMA = "
    "DATABASE() AND SPECIFIC_NAME = 'django_idempotency_claim' AND PARAMETER_NAME = 'p_scope'"
)


@dataclass(frozen=True)
class Narrow:
    """The places a scope passes that are not ``utf8mb4`` (``[(place, charset), ...]``), and
    whether the session's ``sql_mode`` is strict (the server then refuses, else folds)."""

    places: list[tuple[str, str]]
    strict: bool


def narrow(alias: str) -> Narrow | None:
    """Where ``alias``'s MySQL or MariaDB database would not keep every scope; ``None`` when
    it would. Reads the live session, so a connection's ``OPTIONS`` count."""
    return narrow_on(connections[alias])


#: :func:`known_narrow`'s findings, by the settings they were asked with (their values: a
#: connection made again after a fault is a copy, with a settings dict of its own, and one
#: entry per copy grew without end).
_KNOWN: dict[tuple[Any, ...], Narrow | None] = {}
#: A connection object's key in :data:`_KNOWN`, kept on it.
_KEY = "_django_idempotency_settings_key"


def _settings_key(settings_dict: dict[str, Any]) -> tuple[Any, ...]:
    """What sets a session's character sets and ``sql_mode``: the server, the database, the
    user and every option, the connect timeout a copy adds aside."""
    options = {
        k: v for k, v in (settings_dict.get("OPTIONS") or {}).items() if k != "connect_timeout"
    }
    return (
        settings_dict.get("HOST"),
        settings_dict.get("PORT"),
        settings_dict.get("NAME"),
        settings_dict.get("USER"),
        repr(sorted(options.items(), key=lambda item: str(item[0]))),
    )


def known_narrow(connection: BaseDatabaseWrapper) -> Narrow | None:
    """:func:`narrow_on`, asked once per database settings (``DATABASES[alias]``, whose
    ``OPTIONS`` set the session's character set and ``sql_mode`` of every connection made
    from them), before the first claim: gunicorn runs no checks, and E034 was asked only by
    ``check --database`` and ``migrate``. Not once per connection object: under ASGI each
    request's database work runs on a thread of its own, with a connection object of its own,
    and its three statements (two of them reading ``information_schema``) cost a replay more
    than its claim did. A database error is raised, not kept: asked again next time."""
    key = connection.__dict__.get(_KEY)
    if key is None:  # once per connection object: every keyed request asks
        key = connection.__dict__[_KEY] = _settings_key(connection.settings_dict)
    if key in _KNOWN:
        return _KNOWN[key]
    found = _KNOWN[key] = narrow_on(connection)
    return found


def narrow_on(connection: BaseDatabaseWrapper) -> Narrow | None:
    """:func:`narrow` on ``connection``, a MySQL or MariaDB one (a store that does not
    :attr:`~.contract.StoreFeatures.keeps_every_scope`)."""
    places: list[tuple[str, str]] = []
    with connection.cursor() as cursor:
        cursor.execute(_SESSION)
        client, session, mode = cursor.fetchone()
        places += [("character_set_client", client), ("character_set_connection", session)]
        cursor.execute(_COLUMN, [IdempotencyKey._meta.db_table])
        places += [(f"{IdempotencyKey._meta.db_table}.scope", row[0]) for row in cursor.fetchall()]
        cursor.execute(_PARAMETER)
        places += [("the claim procedure's p_scope", row[0]) for row in cursor.fetchall()]
    places = [(place, str(charset)) for place, charset in places if str(charset) != FULL]
    if not places:
        return None
    modes = set(str(mode).upper().split(","))
    return Narrow(places, strict=bool(modes & {"STRICT_TRANS_TABLES", "STRICT_ALL_TABLES"}))


def error(alias: str, found: Narrow) -> CheckMessage:
    """E034's error for what :func:`narrow` found: the system check's, and the words of the
    refusal before a claim (:func:`django_idempotency._call.lifecycle.narrow_store`)."""
    places = ", ".join(f"{place} is {charset}" for place, charset in found.places)
    then = (
        "the sql_mode is strict, so the server refuses a scope with a character outside it, "
        "and each such request fails"
        if found.strict
        else "the sql_mode is not strict, so the server writes '?' for a character outside "
        "it: two scopes that differ there are one principal, each replayed the other's "
        "responses"
    )
    return Error(
        f"DATABASES[{alias!r}] cannot keep every scope exactly: {places}, not utf8mb4; {then}.",
        hint="Keep Django's OPTIONS charset (utf8mb4), and convert the table's scope and "
        "request_hash columns to utf8mb4 with their binary collation, then drop the claim "
        "procedure (docs: 'Installation', MySQL and MariaDB).",
        id=check_name(34),
    )
