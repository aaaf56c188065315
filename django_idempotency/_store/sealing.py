"""How a stored response is kept at rest, and read back byte for byte.

The record's two columns hold one of three shapes, told apart by the headers column alone, so
no body can be mistaken for another shape whatever its bytes:

- a JSON **list** of headers and the body as it was sent: records written before compression,
  with ``COMPRESSION`` off, bodies of 1 KiB or less, or bodies compression did not shrink;
- ``{"codec": "zlib", "headers": [...]}`` and the body compressed by ``zlib``;
- ``{"codec": "framed"}`` and the body column holding the headers (JSON) and, after a newline,
  the body (compressed when that shrinks it): headers holding a NUL (U+0000), which
  PostgreSQL's ``jsonb`` cannot keep (``\u0000`` is refused) but a ``bytea`` can, so such a
  response is stored and replayed exactly on every database;
- ``{"codec": "fernet"}`` and a Fernet token (its bytes, not its base64 text: a quarter
  smaller) of the headers and the body, the body compressed first when that shrinks it: nothing
  of either is readable in the table or a backup.

A Fernet token is bound to its record: the sealed envelope names the record's scope and key
hash (:func:`binding`, a SHA-256 of both), and a token opened for another record is
:class:`Unreadable`. Fernet has no associated data, but the envelope is inside the token, which
no one changes without the key: someone who can write the table but holds no key cannot copy
another principal's token into a record of their own and have it replayed, or shown by the
status endpoint. Tokens sealed before the binding (version 1.1) have none and still open, for
any record: that copy stays possible for them until the keys that sealed them are dropped from
``ENCRYPTION_KEYS`` (docs/storage.rst says how).

zlib (level 6, the library's default) was measured against gzip, lzma and bz2 on JSON bodies
(``benchmarks/storage.py``, ``docs/storage.rst``): within 20% of the best ratio at a tenth of
lzma's and bz2's cost to compress, and the fastest to decompress, which every replay does.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import zlib
from typing import Any

from django_idempotency._conf.settings import conf

#: Bodies up to this size are stored as they are: compressing them saves little and costs a
#: first execution and every replay.
COMPRESS_OVER = 1024
ZLIB = "zlib"
FERNET = "fernet"
#: The headers in the body column, before the body (headers holding a NUL).
FRAMED = "framed"
#: What the headers column's object names the codec by.
CODEC = "codec"
#: What the sealed envelope names its record's :func:`binding` by.
BOUND = "for"

Headers = list[list[str]]


class Unreadable(Exception):
    """A stored response none of ``ENCRYPTION_KEYS`` decrypts (or that is damaged)."""


#: A record's scope and key hash: what a sealed response is bound to.
Owner = tuple[str, str]


def binding(owner: Owner | None) -> str:
    """What binds a sealed response to its record: the SHA-256 of its scope and key hash (a
    scope has no NUL: the store refuses one), its first 128 bits (32 bytes a record, not 64:
    finding another record's binding is a second preimage); ``""`` for none, which no record
    opens."""
    if owner is None:
        return ""
    scope, key_hash = owner
    text = f"{scope}\0{key_hash}".encode("utf-8", "surrogatepass")
    return hashlib.sha256(text).hexdigest()[:32]


def seal(headers: Headers, body: bytes | None, owner: Owner | None) -> tuple[Any, bytes | None]:
    """What the headers and body columns keep of a response (``body`` ``None``: not stored),
    encrypted for the record ``owner`` names (``None``: for none, which no record opens)."""
    keys = conf.ENCRYPTION_KEYS
    if keys is None:
        nul = _holds_nul(headers)
        if body is None:  # never replayed: headers jsonb cannot keep are not kept either
            return ([] if nul else headers), None
        if not nul:
            if len(body) <= COMPRESS_OVER or not conf.COMPRESSION:
                return headers, body
            packed = zlib.compress(body)
            if len(packed) >= len(body):
                return headers, body
            return {CODEC: ZLIB, "headers": headers}, packed
    if body is None:
        return [], None  # never replayed: its headers are not kept either
    codec, packed = None, body
    if len(body) > COMPRESS_OVER and conf.COMPRESSION:
        compressed = zlib.compress(body)
        if len(compressed) < len(body):
            codec, packed = ZLIB, compressed
    envelope: dict[str, Any] = {CODEC: codec, "headers": headers}
    if keys is None:  # headers holding a NUL: framed with the body, in the bytea column
        inner = json.dumps(envelope, separators=(",", ":")).encode()
        return {CODEC: FRAMED}, inner + b"\n" + packed
    envelope[BOUND] = binding(owner)
    inner = json.dumps(envelope, separators=(",", ":")).encode()
    # JSON escapes every newline, so the first one ends the headers.
    token = keys.encrypt(inner + b"\n" + packed)
    return {CODEC: FERNET}, base64.urlsafe_b64decode(token)


def _holds_nul(headers: Headers) -> bool:
    """Whether a header's name or value holds a NUL (the pairs are few: a loop is cheap)."""
    for pair in headers:
        for text in pair:
            if "\x00" in text:
                return True
    return False


def encrypted(stored_headers: Any) -> bool:
    """Whether a record's response is encrypted at rest (told by its headers column alone)."""
    return isinstance(stored_headers, dict) and stored_headers.get(CODEC) == FERNET


def unseal(
    stored_headers: Any, body: bytes | memoryview | None, owner: Owner
) -> tuple[Headers, bytes | None]:
    """The headers and body as the view returned them, read for the record ``owner`` names;
    raises :class:`Unreadable`, also for a token sealed for another record."""
    if not isinstance(stored_headers, dict):  # a list: kept as sent
        return stored_headers or [], None if body is None else bytes(body)
    if body is None:
        return [], None
    codec = stored_headers.get(CODEC)
    headers = stored_headers.get("headers", [])
    data = bytes(body)
    if encrypted(stored_headers):
        headers, codec, data = _decrypt(data, owner)
    elif codec == FRAMED:
        inner, _, data = data.partition(b"\n")
        try:
            envelope = json.loads(inner)
            headers, codec = envelope["headers"], envelope[CODEC]
        except (ValueError, KeyError, TypeError) as exc:
            raise Unreadable(f"The stored headers are damaged: {exc}.") from exc
    if codec == ZLIB:
        try:
            data = zlib.decompress(data)
        except zlib.error as exc:
            raise Unreadable(f"The stored body is damaged: {exc}.") from exc
    elif codec is not None:
        raise Unreadable(f"The stored body's codec {codec!r} is unknown to this version.")
    return headers, data


def _decrypt(data: bytes, owner: Owner) -> tuple[Headers, str | None, bytes]:
    keys = conf.ENCRYPTION_KEYS
    if keys is None:
        raise Unreadable("The stored response is encrypted, and ENCRYPTION_KEYS is empty.")
    from cryptography.fernet import InvalidToken

    try:
        plain = keys.decrypt(base64.urlsafe_b64encode(data))
    except InvalidToken:
        raise Unreadable(
            "The stored response is encrypted with a key that is not in ENCRYPTION_KEYS."
        ) from None
    inner, _, packed = plain.partition(b"\n")
    envelope = json.loads(inner)
    # A token of 1.1 has no binding, and opens for any record (the module's docstring).
    if BOUND in envelope and not hmac.compare_digest(str(envelope[BOUND]), binding(owner)):
        raise Unreadable("The stored response was encrypted for another record.")
    return envelope["headers"], envelope[CODEC], packed
