"""The lengths the record holds, read from the model's fields, and how a value is kept within
them."""

from __future__ import annotations

import hashlib

from django.db.models import CharField

from django_idempotency.models import IdempotencyKey


def _max_length(name: str) -> int:
    field = IdempotencyKey._meta.get_field(name)
    assert isinstance(field, CharField) and field.max_length is not None, name
    return field.max_length


#: The longest scope the record holds; a longer one is stored as its hash (:func:`bounded_scope`).
MAX_SCOPE = _max_length("scope")
#: The longest fingerprint the record holds (a SHA-256 in hex); a longer one is hashed
#: (:func:`bounded_fingerprint`).
MAX_FINGERPRINT = _max_length("request_hash")
#: The longest recovery point name (``Claim.set_recovery_point``).
MAX_RECOVERY_POINT = _max_length("recovery_point")


def sha256_hex(text: str) -> str:
    """The SHA-256 of a text, as hex digits (a lone surrogate is hashed, not refused)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


#: What begins a scope stored as its hash (:func:`bounded_scope`).
HASHED_SCOPE = "sha256:"


def bounded_scope(scope: str) -> str:
    """The scope as stored: itself, or ``sha256:<hex>`` when it is longer than the column.

    A scope that itself begins with ``sha256:`` is stored as its hash too: kept as it was, the
    scope ``sha256:<hex of a long scope>`` was that long scope's principal, replayed its
    responses and erased with it. The stored forms are now told apart: a scope is stored as it
    is only when it could not be a hash's.
    """
    if len(scope) <= MAX_SCOPE and not scope.startswith(HASHED_SCOPE):
        return scope
    return HASHED_SCOPE + sha256_hex(scope)


#: Why no scope may have whitespace around it: MySQL and MariaDB compare text
#: without its trailing spaces (PAD SPACE collations), so ``"user:7 "`` would be ``"user:7"``
#: there and another principal elsewhere.
PADDED_SCOPE = (
    "with whitespace around it, which no scope may have: MySQL and MariaDB would not tell it "
    "from the scope without it"
)


def padded(scope: str) -> bool:
    """Whether ``scope`` has whitespace around it (:data:`PADDED_SCOPE`)."""
    return scope != scope.strip()


#: Why no scope may hold a NUL: PostgreSQL's text cannot, and libpq cuts a text parameter at
#: its first NUL, so ``tenant:a\0x`` was stored and found as ``tenant:a``.
NUL_SCOPE = (
    "with a NUL character (U+0000), which PostgreSQL's text cannot hold: it would be cut "
    "there, and two principals would share records"
)
#: Why no scope may hold a lone surrogate: it has no UTF-8, so no database can store it.
SURROGATE_SCOPE = (
    "with a lone surrogate (U+D800 to U+DFFF), which has no UTF-8 form and no database can hold"
)


def unkeepable(scope: str) -> str | None:
    """Why a store could not keep ``scope`` exactly (to end "... a scope ..."), or ``None``.

    One test for every store and database, made before the claim, so a scope is refused alike
    on SQLite, PostgreSQL, MySQL and Redis, with ``DEBUG`` on or off: never cut at a NUL (libpq),
    never compared without its padding (MySQL), never a driver's encoding error. Characters
    outside a MySQL table's character set are refused by the system check E034 instead.
    """
    if scope != scope.strip():
        return PADDED_SCOPE
    if "\x00" in scope:
        return NUL_SCOPE
    if not scope.isascii():
        try:
            scope.encode("utf-8")
        except UnicodeEncodeError:
            return SURROGATE_SCOPE
    return None


def bounded_fingerprint(value: object) -> str:
    """What ``FINGERPRINT_FUNCTION`` returned, as stored: itself, or its SHA-256 when longer
    than the column (a SHA-512 in hex: the docs promise only "a string") or when a
    store could not keep it exactly (:func:`unkeepable`)."""
    if not isinstance(value, str):
        raise TypeError(
            f"IDEMPOTENCY['FINGERPRINT_FUNCTION'] must return a str, not {type(value).__name__}."
        )
    if len(value) <= MAX_FINGERPRINT and unkeepable(value) is None:
        return value
    # Longer than the column, or what a database would cut (a NUL), pad or not encode (a lone
    # surrogate): two different requests must never store one fingerprint.
    return sha256_hex(value)
