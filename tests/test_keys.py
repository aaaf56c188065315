from __future__ import annotations

import hashlib
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_idempotency import InvalidKey
from django_idempotency._base.keys import (
    BARE_KEY_REFUSED,
    MAX_KEY_LENGTH,
    hash_key,
    parse_key,
)


@pytest.mark.parametrize(
    ("header", "key"),
    [
        ("abc", "abc"),
        ('"abc"', "abc"),
        ("  8e03978e-40d5-43e8-bc93-6894a57f9324 ", "8e03978e-40d5-43e8-bc93-6894a57f9324"),
        ('"8e03978e-40d5-43e8-bc93-6894a57f9324"', "8e03978e-40d5-43e8-bc93-6894a57f9324"),
        (r'"a\"b\\c"', 'a"b\\c'),
        ('"abc";v=1', "abc"),
        ("order 42 / retry", "order 42 / retry"),
    ],
)
def test_parses_sf_strings_and_bare_tokens(header: str, key: str) -> None:
    assert parse_key(header) == key


@pytest.mark.parametrize(
    "header",
    ["", "   ", '""', '"abc', '"abc"x', r'"a\b"', "caf\u00e9", "tab\tinside", "nul\x00", "x" * 256],
)
def test_rejects_invalid_values(header: str) -> None:
    with pytest.raises(InvalidKey):
        parse_key(header)


def test_limits() -> None:
    assert parse_key("x" * MAX_KEY_LENGTH) == "x" * MAX_KEY_LENGTH
    assert parse_key('"' + "x" * MAX_KEY_LENGTH + '"') == "x" * MAX_KEY_LENGTH
    with pytest.raises(InvalidKey, match="shorter than 16"):
        parse_key("short", min_length=16)


def test_quoted_and_bare_spell_the_same_key() -> None:
    assert hash_key(parse_key('"k-1"')) == hash_key(parse_key("k-1"))
    assert hash_key("k-1") == hashlib.sha256(b"k-1").hexdigest()


@given(st.text())
def test_any_text_is_parsed_or_refused_cleanly(value: str) -> None:
    try:
        key = parse_key(value)
    except InvalidKey:
        return
    assert 1 <= len(key) <= MAX_KEY_LENGTH
    assert all(char in string.printable for char in key)


@pytest.mark.parametrize(
    ("header", "key"),
    [('"abc"', "abc"), ('  "abc" ', "abc"), ('"abc";v=1', "abc"), (r'"a\"b"', 'a"b')],
)
def test_quoted_keys_are_accepted_without_bare_keys(header: str, key: str) -> None:
    assert parse_key(header, bare=False) == key


@pytest.mark.parametrize("header", ["abc", "a,b", "order 42", "x" * MAX_KEY_LENGTH, 'a"b"'])
def test_bare_values_are_refused_without_bare_keys(header: str) -> None:
    with pytest.raises(InvalidKey) as refused:
        parse_key(header, bare=False)
    assert str(refused.value) == BARE_KEY_REFUSED


@pytest.mark.parametrize(
    ("header", "message"),
    [("", "empty"), ('""', "empty"), ("caf\u00e9", "printable ASCII"), ('"abc', "closing quote")],
)
def test_other_mistakes_keep_their_own_detail_without_bare_keys(header: str, message: str) -> None:
    with pytest.raises(InvalidKey, match=message):
        parse_key(header, bare=False)
