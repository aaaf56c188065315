"""Property-based tests (issue 20): whatever a client sends, through a protected view.

For any key header, body, content type and settings value generated here: no answer is a 5xx
other than the documented 503; a replay is byte for byte the first answer; and no two requests
that read differently are both executed, or replayed for each other. Bounded (``max_examples``)
so they run in the normal suite; ``tests/test_fuzz.py`` runs longer in CI.
"""

from __future__ import annotations

import json
import random
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.core.checks import Tags
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client, override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import executions
from tests.strategies import (
    CONTENT_TYPES,
    header_values,
    json_documents,
    json_texts,
    numbers,
    same_document,
    spell,
    surrogate_texts,
)
from tests.test_hostile_input import checks

pytestmark = [pytest.mark.urls("tests.hostile_urls"), pytest.mark.django_db]

PROPERTY = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

bodies = st.one_of(
    st.binary(max_size=300),
    json_texts(),
    st.text(max_size=100).map(lambda text: text.encode("utf-8", "surrogatepass")),
)


def post(body: bytes, content_type: str, key: str | None) -> Any:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return Client().post("/echo/", body, content_type=content_type, headers=headers)


def assert_not_5xx(response: Any) -> None:
    assert response.status_code < 500 or response.status_code == 503, response.content


def reads_the_same(first: tuple[bytes, str], second: tuple[bytes, str]) -> bool:
    """The oracle: the same bytes, or (both sent as JSON) the same document."""
    if first[0] == second[0]:
        return True
    json_types = {ct for ct in CONTENT_TYPES if "json" in ct}
    return first[1] in json_types and second[1] in json_types and same_document(*first, *second)


@PROPERTY
@given(first=bodies, second=bodies, types=st.tuples(*[st.sampled_from(CONTENT_TYPES)] * 2))
def test_two_bodies_under_one_key(first: bytes, second: bytes, types: tuple[str, str]) -> None:
    key = str(uuid.uuid4())
    before = executions("echo")
    one = post(first, types[0], key)
    two = post(second, types[1], key)
    for response in (one, two):
        assert_not_5xx(response)
    assert executions("echo") - before <= 1, "two requests under one key both ran"
    if two.get("Idempotent-Replayed") == "true":
        assert two.status_code == one.status_code
        assert two.content == one.content
        # The replay answers with the first body's digest: it must stand for the second too.
        assert reads_the_same((first, types[0]), (second, types[1]))
    elif one.status_code == 201 and (first, types[0]) == (second, types[1]):
        pytest.fail(f"the same request was not replayed: {two.status_code} {two.content!r}")


@PROPERTY
@given(document=json_documents, rnd=st.randoms(use_true_random=False))
def test_a_document_however_spelled_is_one_request(document: Any, rnd: Any) -> None:
    """Key order and whitespace never count: every spelling of one document is replayed."""
    key = str(uuid.uuid4())
    texts = [spell(document, rnd) for _ in range(2)]
    one = post(texts[0], "application/json", key)
    two = post(texts[1], "application/json", key)
    assert one.status_code == 201
    assert two["Idempotent-Replayed"] == "true"
    assert two.content == one.content


@PROPERTY
@given(number=numbers, more=st.integers(min_value=1, max_value=10**6))
def test_numbers_spelled_apart_are_two_requests(number: Any, more: int) -> None:
    """Digits beyond float precision count: a view reading Decimal amounts sees them."""
    text = json.dumps(number) if isinstance(number, float) else str(number)
    longer = (text if "." in text or "e" in text.lower() else text + ".") + "0" * 20 + str(more)
    if "e" in text.lower():  # digits go before the exponent
        mantissa, exponent = text.lower().split("e")
        longer = (mantissa if "." in mantissa else mantissa + ".") + "0" * 20 + f"{more}e{exponent}"
    key = str(uuid.uuid4())
    assert post(f'{{"amount": {text}}}'.encode(), "application/json", key).status_code == 201
    second = post(f'{{"amount": {longer}}}'.encode(), "application/json", key)
    assert second.status_code == 422, (text, longer)


@PROPERTY
@given(text=surrogate_texts, other=surrogate_texts)
def test_strings_with_lone_surrogates(text: str, other: str) -> None:
    key = str(uuid.uuid4())
    body = json.dumps({"s": text}).encode()
    one = post(body, "application/json", key)
    assert one.status_code == 201
    again = post(json.dumps({"s": text}, indent=1).encode(), "application/json", key)
    assert again.content == one.content
    if other != text:
        assert post(json.dumps({"s": other}).encode(), "application/json", key).status_code == 422


@PROPERTY
@given(value=header_values())
def test_any_key_header(value: str) -> None:
    response = post(b"{}", "application/json", value)
    assert_not_5xx(response)
    assert response.status_code in (201, 400), response.content
    if response.status_code == 400:
        assert response.json()["type"].endswith("#invalid-idempotency-key")


@PROPERTY
@given(
    content_type=st.one_of(st.sampled_from(CONTENT_TYPES), st.text(max_size=40)),
    body=st.binary(max_size=200),
)
def test_any_content_type(content_type: str, body: bytes) -> None:
    content_type = content_type.encode("latin-1", "replace").decode("latin-1")
    key = str(uuid.uuid4())
    one = post(body, content_type, key)
    assert_not_5xx(one)
    two = post(body, content_type, key)
    assert_not_5xx(two)
    if one.status_code == 201:
        assert two["Idempotent-Replayed"] == "true"
        assert two.content == one.content


form_fields = st.dictionaries(
    st.text("abcdefgh", min_size=1, max_size=5), st.text(max_size=20), max_size=4
)


@PROPERTY
@given(
    fields=st.tuples(form_fields, form_fields),
    files=st.tuples(st.binary(max_size=2000), st.binary(max_size=2000)),
)
def test_form_uploads_under_one_key(
    fields: tuple[dict[str, str], dict[str, str]], files: tuple[bytes, bytes]
) -> None:
    key = str(uuid.uuid4())
    before = executions("upload")
    answers = [
        Client().post(
            "/upload/",
            {**data, "file": SimpleUploadedFile("f.bin", content)},
            headers={"Idempotency-Key": key},
        )
        for data, content in zip(fields, files, strict=True)
    ]
    for response in answers:
        assert_not_5xx(response)
    assert executions("upload") - before <= 1
    if answers[1].get("Idempotent-Replayed") == "true":
        assert answers[1].content == answers[0].content
        # Django reads a field's text with invalid characters replaced, so compare as it reads.
        assert answers[0].json()["fields"] == answers[1].json()["fields"] or fields[0] == fields[1]
        assert files[0] == files[1]


durations = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.timedeltas(),
    st.text(max_size=5),
    st.none(),
    st.booleans(),
)


@PROPERTY
@given(ttl=durations, lock_timeout=durations, wait_timeout=durations)
def test_any_duration_settings(ttl: Any, lock_timeout: Any, wait_timeout: Any) -> None:
    """The checks never crash; settings they pass never make a keyed request fail."""
    config = {"TTL": ttl, "LOCK_TIMEOUT": lock_timeout, "WAIT_TIMEOUT": wait_timeout}
    with override_settings(IDEMPOTENCY=config):
        errors = checks(Tags.compatibility)
        if errors:
            return
        response = post(b"{}", "application/json", str(uuid.uuid4()))
        assert response.status_code == 201, response.content


anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**6), max_value=10**6),
    st.floats(),
    st.text(max_size=20),
    st.lists(st.one_of(st.integers(100, 700), st.text("POSTGETPATCHDELETE", max_size=6))),
)
other_settings = st.fixed_dictionaries(
    {},
    optional={
        name: anything
        for name in (
            "ENABLED",
            "HEADER",
            "REQUIRED",
            "METHODS",
            "IN_PROGRESS",
            "RETRY_AFTER",
            "RETRYABLE_STATUSES",
            "MISMATCH_STATUS",
            "MIN_KEY_LENGTH",
            "REPLAYED_HEADERS",
            "MAX_BODY_SIZE",
            "BARE_KEYS",
        )
    },
)


@PROPERTY
@given(config=other_settings, body=bodies)
def test_any_other_settings(config: dict[str, Any], body: bytes) -> None:
    with override_settings(IDEMPOTENCY=config):
        if checks(Tags.compatibility):
            return
        key = str(uuid.uuid4())
        one = post(body, "application/json", key)
        two = post(body, "application/json", key)
    for response in (one, two):
        assert_not_5xx(response)
    if two.get("Idempotent-Replayed") == "true":
        assert two.content == one.content


def test_the_duration_strategy_reaches_valid_settings() -> None:
    """Not vacuous: some generated settings pass the checks and serve requests."""
    config = {"TTL": timedelta(days=365_000), "LOCK_TIMEOUT": 1, "WAIT_TIMEOUT": 1e-6}
    with override_settings(IDEMPOTENCY=config):
        assert checks(Tags.compatibility) == []


def test_same_document_oracle() -> None:
    assert same_document(b'{"a":1,"b":2}', "", b'{"b": 2, "a": 1}', "")
    assert not same_document(b'{"a":1.0}', "", b'{"a":1}', "")
    assert not same_document(b"{nope", "", b"{nope", "")
    assert json.loads(spell({"b": [1, {"c": None}], "a": "é"}, random.Random(3))) == {
        "a": "é",
        "b": [1, {"c": None}],
    }
