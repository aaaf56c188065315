"""Parsing the ``Idempotency-Key`` header.

The IETF draft (draft-ietf-httpapi-idempotency-key-header) makes the value a Structured Field
string (RFC 8941 section 3.3.3): ``"8e03978e-..."``. Many clients send the bare value, so a bare
printable-ASCII value is accepted too; ``abc`` and ``"abc"`` spell the same key. A bare value
cannot contain ``,``: that is how a list of values, or two header lines joined, arrives.
"""

from __future__ import annotations

import hashlib

MAX_KEY_LENGTH = 255
#: The longest header value: a quoted key of ``MAX_KEY_LENGTH`` characters, every one escaped.
#: It bounds the (ignored) parameters too, so the published schema can state a length.
MAX_HEADER_LENGTH = 2 * MAX_KEY_LENGTH + 2


class InvalidKey(ValueError):
    """The header value is not a usable key; the message is safe to show to the client."""


def parse_key(value: str, *, min_length: int = 1) -> str:
    """Return the key spelled by a header value, or raise :class:`InvalidKey`."""
    value = value.strip(" \t")
    if not value:
        raise InvalidKey("The Idempotency-Key header is empty.")
    if len(value) > MAX_HEADER_LENGTH:
        raise InvalidKey(
            f"The Idempotency-Key header is longer than {MAX_HEADER_LENGTH} characters."
        )
    if not value.isascii() or not value.isprintable():
        raise InvalidKey("The Idempotency-Key must be printable ASCII.")
    if value.startswith('"'):
        key = _parse_sf_string(value)
    elif "," in value:
        # Two header lines reach the view joined by "," (WSGI servers, Django's ASGI handler),
        # as does a list sent on one line: never one merged key (issue 20).
        raise InvalidKey("The Idempotency-Key header has more than one value.")
    else:
        key = value
    if not key:
        raise InvalidKey("The Idempotency-Key header is empty.")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKey(f"The Idempotency-Key is longer than {MAX_KEY_LENGTH} characters.")
    if len(key) < min_length:
        raise InvalidKey(f"The Idempotency-Key is shorter than {min_length} characters.")
    return key


def _parse_sf_string(value: str) -> str:
    chars: list[str] = []
    index = 1
    while index < len(value):
        char = value[index]
        if char == "\\":
            index += 1
            if index == len(value) or value[index] not in '"\\':
                raise InvalidKey("The Idempotency-Key has an invalid escape sequence.")
            chars.append(value[index])
        elif char == '"':
            rest = value[index + 1 :].lstrip(" \t")
            # Parameters (";name=value") are allowed on any Structured Field item; none are
            # defined for this header, so they are ignored.
            if rest.startswith(","):
                raise InvalidKey("The Idempotency-Key header has more than one value.")
            if rest and not rest.startswith(";"):
                raise InvalidKey("Unexpected characters after the quoted Idempotency-Key.")
            return "".join(chars)
        else:
            chars.append(char)
        index += 1
    raise InvalidKey("The quoted Idempotency-Key has no closing quote.")


def hash_key(key: str) -> str:
    """SHA-256 of the key: the raw key is never stored.

    UTF-8, so any ``str`` key of :func:`~django_idempotency.functions.idempotent_function` hashes
    too; a header's key is ASCII, whose bytes are the same.
    """
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
