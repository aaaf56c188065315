"""Hypothesis strategies for what clients send: key headers, JSON spelled many ways, content
types. Shared by tests/test_properties.py and tests/test_fuzz.py."""

from __future__ import annotations

import json
import random
import string
from decimal import Decimal
from typing import Any

from hypothesis import strategies as st

CONTENT_TYPES = [
    "application/json",
    "application/json; charset=utf-8",
    "application/vnd.api+json",
    "application/problem+json",
    "text/plain",
    "application/octet-stream",
    "application/x-www-form-urlencoded",
    "",
]

#: Text with lone surrogates too: JSON can escape them (``"\\ud83d"``), and clients do.
texts = st.text(
    alphabet=st.one_of(
        st.characters(),
        st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, exclude_categories=()),
    ),
    max_size=12,
)

#: Text that is mostly lone surrogates.
surrogate_texts = st.text(
    alphabet=st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010, exclude_categories=()),
    min_size=1,
    max_size=6,
)

#: Numbers as a client may spell them, beyond float precision included.
numbers = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.decimals(allow_nan=False, allow_infinity=False, places=None),
    st.floats(allow_nan=False, allow_infinity=False),
)

json_documents = st.recursive(
    st.one_of(st.none(), st.booleans(), numbers, texts),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(texts, children, max_size=4)
    ),
    max_leaves=12,
)


def spell(document: Any, rnd: random.Random) -> bytes:
    """One of the many JSON texts of ``document``: key order, whitespace and escapes vary."""
    space = rnd.choice(["", " ", "\n", "\t "])

    def write(value: Any) -> str:
        if isinstance(value, dict):
            items = list(value.items())
            rnd.shuffle(items)
            members = [f"{write(name)}{space}:{space}{write(item)}" for name, item in items]
            return "{" + space + f",{space}".join(members) + space + "}"
        if isinstance(value, list):
            return "[" + space + f",{space}".join(write(item) for item in value) + space + "]"
        if isinstance(value, Decimal):
            return str(value)
        if isinstance(value, str):
            return json.dumps(value, ensure_ascii=rnd.random() < 0.5 or not _encodable(value))
        return json.dumps(value)

    return write(document).encode("utf-8", "surrogatepass")


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def json_texts() -> st.SearchStrategy[bytes]:
    return st.builds(spell, json_documents, st.randoms(use_true_random=False))


def same_document(first: bytes, first_type: str, second: bytes, second_type: str) -> bool:
    """Whether two bodies are the same JSON document, numbers compared as spelled."""
    try:
        return bool(_read(first) == _read(second))
    except (ValueError, RecursionError):
        return False


def _read(body: bytes) -> Any:
    return json.loads(
        body,
        parse_float=lambda text: ("number", text),
        parse_int=lambda text: ("number", text),
        parse_constant=lambda text: ("number", text),
        object_pairs_hook=lambda pairs: ("object", sorted(pairs, key=lambda pair: pair[0])),
    )


def header_values() -> st.SearchStrategy[str]:
    """Idempotency-Key values: tokens, quoted strings, lists, and any latin-1 text."""
    printable = st.text(alphabet=string.printable, min_size=0, max_size=300)
    quoted = printable.map(lambda key: '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return st.one_of(
        printable,
        quoted,
        st.lists(st.uuids().map(str), min_size=2, max_size=3).map(", ".join),
        st.binary(max_size=60).map(lambda raw: raw.decode("latin-1")),
    )
