"""Canonical JSON for the fingerprint: key order and whitespace do not count, nothing else is
lost.

- Numbers count as spelled: ``0.1`` and ``0.10000000000000000001`` are two requests (a view
  reading ``Decimal`` amounts tells them apart), and so are ``1``, ``1.0`` and ``1e0`` (an
  integer field refuses ``1.0``). Nothing goes through ``float``.
- Strings are written with ASCII escapes, so a lone surrogate (``"\\ud83d"``) is text like any
  other, and canonical output is always valid JSON: it can never equal the raw bytes of some
  other, invalid body.
- Duplicate object keys are kept, in order: ``{"a": 1, "a": 2}`` is not ``{"a": 2}``.
- Parts of the document can be left out, named by JSON Pointers (RFC 6901) already split into
  tokens: an object's member is dropped (present or absent, it does not count), an array's
  element is written as ``?``, which no JSON value is, so the array's length still counts.
- The output is written without recursion. A document nested deeper than Python's parser
  recursion allows is not canonicalised: :func:`canonical_json` returns ``None`` and its bytes
  count as sent.
- Most bodies (no fraction or exponent, no ``-0``, no duplicate key, nothing left out) are
  written by the ``json`` module's C encoder instead, which writes them byte for byte as the
  writer here does at a fraction of its cost; anything else takes the writer.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from json.encoder import encode_basestring_ascii
from typing import Any

from django_idempotency._base.json import acyclic_encoder

#: A JSON Pointer's reference tokens, unescaped: ``"/a/0"`` is ``("a", "0")``.
Pointer = tuple[str, ...]


class _Raw(str):
    """Text written out as it is: punctuation, and numbers as the client spelled them."""


class _Object(list[tuple[str, Any]]):
    """An object's members in the order sent; sorted (stably) when written."""


_TRUE, _FALSE, _NULL = _Raw("true"), _Raw("false"), _Raw("null")
_EXCLUDED = _Raw("?")


def canonical_json(body: bytes, exclude: Collection[Pointer] = ()) -> bytes | None:
    """The canonical form of a JSON body, or ``None`` when it is not JSON that can be read;
    without the parts ``exclude`` points at."""
    if not exclude:
        encoded = _encoded(body)
        if encoded is not None:
            return encoded
    return written(body, exclude)


def written(body: bytes, exclude: Collection[Pointer] = ()) -> bytes | None:
    """:func:`canonical_json` as this module's own writer writes it, every body alike."""
    try:
        document = json.loads(
            body,
            parse_float=_Raw,
            parse_int=_Raw,
            parse_constant=_Raw,
            object_pairs_hook=_Object,
        )
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    for pointer in exclude:
        _exclude(document, pointer)
    return _write(document).encode("ascii")


class _Elsewhere(Exception):
    """The body needs :func:`_write`: the C encoder would not write it as spelled."""


def _int(text: str) -> int:
    if text == "-0":  # the only integer the C encoder would spell otherwise ("0")
        raise _Elsewhere
    return int(text)


def _elsewhere(text: str) -> Any:
    raise _Elsewhere


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    members = dict(pairs)
    if len(members) != len(pairs):  # a duplicate member: kept, in order, by _write only
        raise _Elsewhere
    return members


def _encoded(body: bytes) -> bytes | None:
    """The canonical form written by the C encoder, or ``None``: :func:`_write` decides.

    The same text: members sorted by name (names are unique here), ``,`` and ``:`` without
    spaces, strings with ASCII escapes (the same function), ``true``, ``false``, ``null``, and
    integers, which ``int`` spells as sent (JSON has no leading zeros) save ``-0``. A number
    with a fraction or an exponent, a duplicate member, ``-0`` or an error leave it to the
    writer, which also decides what is not JSON.
    """
    try:
        document = _DECODER.decode(body.decode(_encoding(body), "surrogatepass"))
        return _encode(document).encode("ascii")
    except (_Elsewhere, ValueError, RecursionError):
        return None


def _encoding(body: bytes) -> str:
    """``json.detect_encoding``, its answer for most bodies found first: no byte-order mark
    and no NUL among the first four bytes is UTF-8."""
    if body[:1] not in _MARKS and b"\0" not in body[:4]:
        return "utf-8"
    return json.detect_encoding(body)


#: The first bytes of the byte-order marks ``json.detect_encoding`` reads.
_MARKS = (b"\xef", b"\xfe", b"\xff", b"\x00")


#: Made once: ``json.loads`` and ``json.dumps`` with options make a decoder or an encoder (and
#: its C scanner) on every call, which costs more than a small body's parsing.
_DECODER = json.JSONDecoder(
    parse_float=_elsewhere, parse_int=_int, parse_constant=_elsewhere, object_pairs_hook=_unique
)
_ENCODER = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), sort_keys=True)


#: ``_ENCODER.encode``, its C encoder made once (a parsed document has no cycle).
_encode = acyclic_encoder(_ENCODER)


def _exclude(document: Any, pointer: Pointer) -> None:
    """Leave out what ``pointer`` names; each of an object's duplicate members is followed."""
    nodes = [document]
    for token in pointer[:-1]:
        nodes = [child for node in nodes for child in _children(node, token)]
    last = pointer[-1]
    for node in nodes:
        if isinstance(node, _Object):
            node[:] = [(name, value) for name, value in node if name != last]
        elif isinstance(node, list) and (index := _index(node, last)) is not None:
            node[index] = _EXCLUDED


def _children(node: Any, token: str) -> list[Any]:
    if isinstance(node, _Object):
        return [value for name, value in node if name == token]
    if isinstance(node, list) and (index := _index(node, token)) is not None:
        return [node[index]]
    return []


def _index(array: list[Any], token: str) -> int | None:
    """The array index a token names (RFC 6901: digits, no leading zero), if within bounds."""
    if not token.isdigit() or not token.isascii() or (token != "0" and token[0] == "0"):
        return None
    index = int(token)
    return index if index < len(array) else None


def _write(document: Any) -> str:
    out: list[str] = []
    pending: list[Any] = [document]
    while pending:
        item = pending.pop()
        if isinstance(item, _Raw):
            out.append(item)
        elif isinstance(item, str):
            out.append(encode_basestring_ascii(item))
        elif item is True or item is False or item is None:
            out.append(_TRUE if item is True else _FALSE if item is False else _NULL)
        elif isinstance(item, _Object):
            tokens: list[Any] = [_Raw("{")]
            for index, (name, value) in enumerate(sorted(item, key=lambda pair: pair[0])):
                tokens += [_Raw(",")] if index else []
                tokens += [name, _Raw(":"), value]
            tokens.append(_Raw("}"))
            pending.extend(reversed(tokens))
        else:  # an array
            tokens = [_Raw("[")]
            for index, value in enumerate(item):
                tokens += [_Raw(","), value] if index else [value]
            tokens.append(_Raw("]"))
            pending.extend(reversed(tokens))
    return "".join(out)
