"""The published policy says what the server does: the key pattern is held to the parser."""

from __future__ import annotations

import re
from datetime import timedelta
from functools import cache
from typing import Any

import pytest
from django.test import override_settings
from hypothesis import example, given, settings
from hypothesis import strategies as st

from django_idempotency import InvalidKey, describe, idempotent
from django_idempotency._base.keys import (
    MAX_HEADER_LENGTH,
    MAX_KEY_LENGTH,
    key_format,
    parse_key,
)
from django_idempotency._conf.options import Options
from django_idempotency._publish.policy import (
    duration_text,
    ecma_pattern,
    key_pattern,
    key_schema,
    not_stored,
)
from tests.testapp import views

# What clients send, and what hostile ones do: printable ASCII, quotes, escapes, the
# parameter separator, and the characters the server refuses (tabs, controls, non-ASCII).
_CHARS = st.sampled_from([*map(chr, range(0x20, 0x7F)), "\t", "\x00", "\x7f", "é", "€"])
_WEIGHTED = st.one_of(_CHARS, st.sampled_from(['"', "\\", ";", " ", "a"]))


def _values(max_size: int) -> st.SearchStrategy[str]:
    body = st.text(_WEIGHTED, max_size=max_size)
    return st.one_of(body, body.map(lambda text: f'"{text}"'), body.map(lambda t: f'"{t}";x=1'))


def accepted(value: str, min_length: int, bare: bool = True) -> bool:
    try:
        parse_key(value, min_length=min_length, bare=bare)
    except InvalidKey:
        return False
    return True


@cache
def published_schema(min_length: int, bare: bool) -> dict[str, Any]:
    """The header's schema as published with these settings (``BARE_KEYS`` is ``bare``)."""
    with override_settings(IDEMPOTENCY={"MIN_KEY_LENGTH": min_length, "BARE_KEYS": bare}):
        return key_schema(Options.build().resolve())


def matches(value: str, min_length: int, bare: bool = True) -> bool:
    schema = published_schema(min_length, bare)
    assert schema["maxLength"] == MAX_HEADER_LENGTH
    schema_ok = schema["maxLength"] >= len(value) >= schema["minLength"]
    return schema_ok and re.fullmatch(schema["pattern"], value) is not None


EDGES = [
    "a",
    "a b",
    "a,b",
    'a"b',
    '"a"',
    '"a" ;x=1',
    '"a"x',
    '"a',
    '""',
    '"\\"',
    '"\\a"',
    '"\\\\"',
    "a\tb",
    "é",
    "x" * 255,
    "x" * 256,
    '"' + "x" * 255 + '"',
    '"' + "x" * 256 + '"',
    '"' + "\\\\" * 255 + '"',
    '"' + "\\\\" * 255 + '";x',
]


@pytest.mark.parametrize("value", EDGES)
@pytest.mark.parametrize("min_length", [1, 2, 36])
@pytest.mark.parametrize("bare", [True, False], ids=["bare-keys", "quoted-only"])
def test_edges(value: str, min_length: int, bare: bool) -> None:
    assert matches(value, min_length, bare) == accepted(value, min_length, bare)


@settings(max_examples=400, deadline=None)
@given(value=_values(40), min_length=st.sampled_from([1, 2, 5]), bare=st.booleans())
@example(value=" a", min_length=1, bare=True)
@example(value="a ", min_length=1, bare=True)
@example(value='"a"', min_length=1, bare=False)
@example(value="a", min_length=1, bare=False)
def test_the_pattern_accepts_what_the_server_accepts(
    value: str, min_length: int, bare: bool
) -> None:
    # The server strips surrounding spaces (HTTP servers strip them before it does), so the
    # schema need only describe the stripped value.
    stripped = value.strip(" \t")
    assert matches(stripped, min_length, bare) == accepted(value, min_length, bare)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), min_length=st.sampled_from([1, 3, MAX_KEY_LENGTH]), bare=st.booleans())
def test_every_value_the_pattern_allows_is_a_key(
    data: st.DataObject, min_length: int, bare: bool
) -> None:
    value = data.draw(st.from_regex(key_pattern(min_length, bare=bare), fullmatch=True))
    if len(value) <= MAX_HEADER_LENGTH:
        key = parse_key(value, min_length=min_length, bare=bare)
        assert min_length <= len(key) <= MAX_KEY_LENGTH
        assert bare or len(value) >= published_schema(min_length, bare)["minLength"]


@pytest.mark.parametrize("min_length", [1, 2, 36])
def test_without_bare_keys_only_the_quoted_alternative_is_published(min_length: int) -> None:
    schema = published_schema(min_length, False)
    assert schema["pattern"] == key_pattern(min_length, bare=False)
    assert schema["pattern"].startswith('^"')
    key = "k" * min_length
    assert re.fullmatch(schema["pattern"], f'"{key}"')
    assert not re.fullmatch(schema["pattern"], key)
    assert re.fullmatch(published_schema(min_length, True)["pattern"], key)
    assert schema["minLength"] == min_length + 2
    assert published_schema(min_length, True)["minLength"] == min_length


def test_a_header_longer_than_any_quoted_key_is_refused() -> None:
    longest = '"' + "\\\\" * MAX_KEY_LENGTH + '"'
    assert len(longest) == MAX_HEADER_LENGTH
    assert parse_key(longest) == "\\" * MAX_KEY_LENGTH
    with pytest.raises(InvalidKey, match="longer than 512"):
        parse_key(longest + ";x")


def test_not_stored_writes_a_full_hundred_as_a_range() -> None:
    assert not_stored({408, 429, *range(500, 600)}) == ["408", "429", "5XX"]
    assert not_stored({500, 503}) == ["500", "503"]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(86400, "1 day"), (7200, "2 hours"), (90, "90 seconds"), (60, "1 minute"), (1, "1 second")],
)
def test_duration_text(seconds: int, text: str) -> None:
    assert duration_text(timedelta(seconds=seconds)) == text


@override_settings(IDEMPOTENCY={"MISMATCH_STATUS": 400, "TTL": 600})
def test_describe_a_function_view_for_a_site_without_drf() -> None:
    @idempotent(required=True, methods=["POST"])
    def view(request: object) -> None: ...

    policy = describe(view)
    assert policy["required"] is True
    assert policy["ttl"] == 600
    assert policy["methods"] == ["POST"]
    assert policy["mismatchStatus"] == 400
    assert describe(Options.build(ttl=60))["ttl"] == 60
    with pytest.raises(TypeError, match="not a protected view"):
        describe(lambda request: None)


def test_describe_what_a_url_resolves_to() -> None:
    """What as_view() makes, of the DRF mixin or of a decorated dispatch: a URL's view."""
    assert describe(views.ExecutionViewSet.as_view({"post": "create"})) == describe(
        views.ExecutionViewSet
    )
    assert describe(views.ClassView.as_view())["required"] is True
    with pytest.raises(TypeError, match="not a protected view"):
        describe(views.DecoratedApiView.as_view())


def tenant_scope(request: object) -> str:
    """Each tenant has its own keys.

    Not published: only the first paragraph is.
    """
    return "tenant"


@pytest.mark.parametrize(
    ("function", "text"),
    [
        (tenant_scope, "Each tenant has its own keys."),
        (lambda request: "x", "the principal named by <lambda>"),
    ],
)
def test_the_scope_is_the_first_paragraph_of_the_scope_functions_docstring(
    function: object, text: str
) -> None:
    with override_settings(IDEMPOTENCY={"SCOPE_FUNCTION": function}):
        assert describe(Options.build())["scope"] == text


UUID = key_format("uuid")
_UUIDS = st.uuids().map(str)
_UUID_VALUES = st.one_of(
    _UUIDS,
    _UUIDS.map(str.upper),
    _UUIDS.map(lambda u: f'"{u}"'),
    _UUIDS.map(lambda u: f'"{u}";v=1'),
    _UUIDS.map(lambda u: u[:-1]),
    _UUIDS.map(lambda u: u.replace("-", "")),
    _UUIDS.map(lambda u: f"{{{u}}}"),
    _UUIDS.map(lambda u: f"{u}x"),
    _values(40),
)


def accepted_as_uuid(value: str, bare: bool = True) -> bool:
    try:
        UUID.check(parse_key(value, bare=bare))
    except InvalidKey:
        return False
    return True


@settings(max_examples=300, deadline=None)
@given(value=_UUID_VALUES, bare=st.booleans())
def test_the_uuid_pattern_accepts_what_the_server_accepts(value: str, bare: bool) -> None:
    stripped = value.strip(" \t")
    published = re.fullmatch(key_pattern(1, UUID, bare=bare), stripped) is not None
    assert published == accepted_as_uuid(value, bare)


def test_a_pattern_is_published_in_ecma_262_spelling() -> None:
    pattern = re.compile(r"(?P<kind>order|refund)-(?P=kind)-[0-9]+")
    assert ecma_pattern(pattern) == r"(?<kind>order|refund)-\k<kind>-[0-9]+"
    published = key_pattern(1, key_format(re.compile(r"order-[0-9]+")))
    assert published == r'^(?:"(?:order-[0-9]+)"(?: *;(?:[ -~]*[!-~])?)?|(?:order-[0-9]+))$'
    for value in ("order-1", '"order-1"', '"order-1";a=b'):
        assert re.fullmatch(published, value)
        assert accepted(value, 1)
    assert not re.fullmatch(published, "order-")
    quoted = key_pattern(1, key_format(re.compile(r"order-[0-9]+")), bare=False)
    assert quoted == r'^"(?:order-[0-9]+)"(?: *;(?:[ -~]*[!-~])?)?$'
    for value in ('"order-1"', '"order-1";a=b', "order-1"):
        assert (re.fullmatch(quoted, value) is not None) == accepted(value, 1, bare=False)


def test_describe_a_views_own_key_format_and_scope() -> None:
    @idempotent(key_format="uuid", scope=tenant_scope)
    def view(request: object) -> None: ...

    policy = describe(view)
    assert policy["keyFormat"] == "uuid"
    assert policy["keySchema"]["pattern"] == key_pattern(1, UUID)
    assert policy["scope"] == "Each tenant has its own keys."
    pattern = describe(Options.build(key_format=re.compile("[a-z]{8}")))
    assert pattern["keyFormat"] == "pattern"
    assert (
        pattern["keySchema"]["pattern"]
        == '^(?:"(?:[a-z]{8})"(?: *;(?:[ -~]*[!-~])?)?|(?:[a-z]{8}))$'
    )
    with override_settings(IDEMPOTENCY={"KEY_FORMAT": "uuid"}):
        assert describe(Options.build())["keyFormat"] == "uuid"


def test_describe_states_whether_bare_keys_are_accepted() -> None:
    assert describe(Options.build())["bareKeys"] is True
    with override_settings(IDEMPOTENCY={"BARE_KEYS": False, "KEY_FORMAT": "uuid"}):
        policy = describe(Options.build())
    assert policy["bareKeys"] is False
    assert policy["keySchema"]["pattern"] == key_pattern(1, UUID, bare=False)
    assert policy["keySchema"]["minLength"] == 3
