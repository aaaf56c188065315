"""A record's operation (SPEC 4c): its id and its status URL.

Every record is an operation. Its id is ``<pk>.<mac>``: the record's primary key, then an HMAC
(``SECRET_KEY``, salted for this purpose) of the primary key, the scope, the key's hash and the
record's ``created_at``. It is stable across every attempt on the record (a takeover keeps the
row and its ``created_at``), unguessable without the secret, never the key and nothing a client
could reverse into it; and it needs no column: the status endpoint reads the record by its
primary key and checks the MAC in constant time, so the claim costs nothing more. A record
released and claimed again is a new row, and an expired one claimed again keeps its row but
starts a new life (a new ``created_at``): either is a new operation, and the old id names
nothing. ``SECRET_KEY_FALLBACKS`` are accepted, so a rotated secret keeps ids valid.
"""

from __future__ import annotations

import base64
from datetime import datetime

from django.conf import settings
from django.utils.crypto import constant_time_compare, salted_hmac

from django_idempotency._base.durations import microseconds

__all__ = [
    "BIGINT",
    "URL_NAME",
    "make_id",
    "parse_id",
    "status_url",
    "verify",
]

_SALT = "django_idempotency.operation"
#: The status endpoint's name in ``django_idempotency.urls`` (namespace ``django_idempotency``).
URL_NAME = "django_idempotency:operation"


def _mac(
    pk: int | str,
    scope: str,
    key_hash: str,
    created_at: datetime | int,
    secret: str | bytes | None = None,
) -> str:
    life = created_at if isinstance(created_at, int) else microseconds(created_at)
    digest = salted_hmac(
        _SALT, f"{pk}\0{scope}\0{key_hash}\0{life}", secret=secret, algorithm="sha256"
    ).digest()
    # 128 bits, URL-safe: unguessable, and short enough for a path segment.
    return base64.urlsafe_b64encode(digest[:16]).rstrip(b"=").decode("ascii")


def make_id(pk: int | str, scope: str, key_hash: str, created_at: datetime | int) -> str:
    """The operation id of record ``pk`` of ``scope`` and ``key_hash``, in the life that
    began at ``created_at`` (a time, or :attr:`.Claim.life`'s microseconds). On a Redis store
    ``pk`` is the operation's name (``r<store>-<random>``: :mod:`.._store.redis.operations`),
    which its record keeps for its life."""
    return f"{pk}.{_mac(pk, scope, key_hash, created_at)}"


def parse_id(operation_id: str) -> int | None:
    """The primary key an operation id names, ``None`` when it is no operation id's shape
    (its MAC is checked against the record: :func:`verify`)."""
    pk, dot, mac = operation_id.partition(".")
    if not dot or not pk.isascii() or not pk.isdigit() or len(pk) > 19 or not mac:
        return None
    number = int(pk)
    # A primary key is a signed 64-bit integer: a larger one names nothing, and a database
    # would refuse it (SQLite raises OverflowError).
    return number if number < BIGINT else None


BIGINT = 2**63


def verify(
    operation_id: str, pk: int | str, scope: str, key_hash: str, created_at: datetime
) -> bool:
    """Whether ``operation_id`` is record ``pk``'s (with ``scope``, ``key_hash`` and
    ``created_at``), under ``SECRET_KEY`` or one of ``SECRET_KEY_FALLBACKS``; in constant
    time."""
    mac = operation_id.partition(".")[2]
    secrets = [None, *getattr(settings, "SECRET_KEY_FALLBACKS", ())]
    return any(
        constant_time_compare(mac, _mac(pk, scope, key_hash, created_at, secret))
        for secret in secrets
    )


def status_url(operation_id: str) -> str:
    """The operation's status URL (a path), from ``django_idempotency.urls`` as the project
    includes it. Raises ``ImproperlyConfigured`` when the project does not (check E071)."""
    from django.core.exceptions import ImproperlyConfigured
    from django.urls import NoReverseMatch, reverse

    try:
        return reverse(URL_NAME, args=[operation_id])
    except NoReverseMatch as exc:
        raise ImproperlyConfigured(
            "An operation's status URL needs django_idempotency.urls in the URLconf: "
            'path("idempotency/", include("django_idempotency.urls")).'
        ) from exc
