from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import RequestDataTooBig
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import RequestFactory, override_settings

from django_idempotency import json_fingerprint, request_fingerprint
from django_idempotency._http.canonical_json import canonical_json, written
from django_idempotency._http.fingerprints import canonical_body

factory = RequestFactory()


def fingerprint(body: bytes, content_type: str = "application/json", path: str = "/x/") -> str:
    return request_fingerprint(factory.post(path, body, content_type=content_type), "scope")


def test_json_key_order_and_whitespace_do_not_matter() -> None:
    assert fingerprint(b'{"a": 1, "b": [1, 2]}') == fingerprint(b'{"b":[1,2],"a":1}')
    assert fingerprint(b'{"a": 1}', "application/vnd.api+json") == fingerprint(b'{ "a":1 }')


def test_json_values_matter() -> None:
    assert fingerprint(b'{"a": 1}') != fingerprint(b'{"a": 2}')


def test_other_bodies_count_byte_for_byte() -> None:
    assert fingerprint(b"a=1&b=2", "application/x-www-form-urlencoded") != fingerprint(
        b"b=2&a=1", "application/x-www-form-urlencoded"
    )
    assert canonical_body("text/plain", b' {"a": 1}') == b' {"a": 1}'


def test_invalid_json_is_hashed_as_bytes() -> None:
    assert canonical_body("application/json", b"{nope") == b"{nope"


def test_path_query_string_method_and_scope_count() -> None:
    base = fingerprint(b"{}")
    assert fingerprint(b"{}", path="/y/") != base
    assert fingerprint(b"{}", path="/x/?a=1") != base
    put = request_fingerprint(factory.put("/x/", b"{}", content_type="application/json"), "scope")
    assert put != base
    other_scope = request_fingerprint(
        factory.post("/x/", b"{}", content_type="application/json"), "other"
    )
    assert other_scope != base


# json_fingerprint (issue 18)

VOLATILE = json_fingerprint(exclude=["/sent_at", "/meta/nonce", "/items/1", "/a~1b/~0c"])


def volatile(body: bytes, content_type: str = "application/json", method: str = "post") -> str:
    request = getattr(factory, method)("/x/", body, content_type=content_type)
    return VOLATILE(request, "scope")


def test_json_fingerprint_leaves_out_the_pointed_parts() -> None:
    base = volatile(b'{"n": 1, "sent_at": "10:00", "meta": {"nonce": "a", "v": 1}}')
    assert volatile(b'{"meta": {"v": 1, "nonce": "b"}, "sent_at": "11:00", "n": 1}') == base
    assert volatile(b'{"n": 1, "meta": {"v": 1}}') == base  # absent counts as present
    assert volatile(b'{"n": 2, "sent_at": "10:00", "meta": {"nonce": "a", "v": 1}}') != base
    assert volatile(b'{"n": 1, "meta": {"nonce": "a", "v": 2}}') != base
    # Duplicate members are each left out.
    assert volatile(b'{"n": 1, "sent_at": 1, "sent_at": 2, "meta": {"v": 1}}') == base
    # ~1 is "/", ~0 is "~".
    assert volatile(b'{"a/b": {"~c": 1, "d": 1}}') == volatile(b'{"a/b": {"~c": 2, "d": 1}}')
    assert volatile(b'{"a/b": {"~c": 1, "d": 1}}') != volatile(b'{"a/b": {"~c": 1, "d": 2}}')


def test_json_fingerprint_keeps_an_array_elements_place() -> None:
    assert volatile(b'{"items": [1, 2, 3]}') == volatile(b'{"items": [1, 9, 3]}')
    assert volatile(b'{"items": [1, 2, 3]}') != volatile(b'{"items": [1, 2]}')
    assert volatile(b'{"items": [1, 2, 3]}') != volatile(b'{"items": [2, 2, 3]}')
    # An index out of range: nothing to leave out. On an object "1" names a member (RFC 6901).
    assert volatile(b'{"items": [1]}') != volatile(b'{"items": [2]}')
    assert volatile(b'{"items": {"1": 1}}') == volatile(b'{"items": {"1": 2}}')
    # "01" is not an index (RFC 6901): only "1" is.
    leading = json_fingerprint(exclude=["/items/01"])
    request = factory.post("/x/", b'{"items": [1, 2]}', content_type="application/json")
    other = factory.post("/x/", b'{"items": [1, 3]}', content_type="application/json")
    assert leading(request, "s") != leading(other, "s")


def test_json_fingerprint_is_the_default_where_nothing_is_left_out() -> None:
    for body, content_type in [
        (b'{"n": 1, "meta": {"v": 1}}', "application/json"),
        (b'{"n": 1.10}', "application/problem+json"),
        (b"{not json", "application/json"),
        (b"sent_at=1", "text/plain"),
        (b"[" * 100_000 + b"]" * 100_000, "application/json"),  # too deep: counted as bytes
    ]:
        request = factory.post("/x/", body, content_type=content_type)
        again = factory.post("/x/", body, content_type=content_type)
        assert VOLATILE(request, "scope") == request_fingerprint(again, "scope")


def test_json_fingerprint_keeps_the_defaults_guarantees() -> None:
    base = volatile(b'{"n": 1.0}')
    assert volatile(b'{"n": 1}') != base  # numbers as spelled, never through float
    assert volatile(b'{"n": 1.0}', method="put") != base
    assert VOLATILE(factory.post("/y/", b'{"n": 1.0}', content_type="application/json"), "scope")
    assert (
        VOLATILE(factory.post("/x/", b'{"n": 1.0}', content_type="application/json"), "other")
        != base
    )


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=10)
def test_a_body_over_the_memory_limit_is_refused_unread() -> None:
    request = factory.post("/x/", b'{"n": 1, "sent_at": "10:00"}', content_type="application/json")
    with pytest.raises(RequestDataTooBig):
        VOLATILE(request, "scope")
    assert not request._read_started  # type: ignore[attr-defined]


def test_json_fingerprint_leaves_out_form_fields() -> None:
    form = "application/x-www-form-urlencoded"
    base = volatile(b"n=1&sent_at=10%3A00", form)
    assert volatile(b"sent_at=11%3A00&n=1", form) == base
    assert volatile(b"n=1", form) == base
    assert volatile(b"n=2&sent_at=10%3A00", form) != base
    # A pointer of more than one token names no form field.
    assert volatile(b"n=1&meta=x", form) != base
    assert volatile(b"n=1&meta=x", form, method="patch") == volatile(b"meta=x&n=1", form, "patch")
    # By field, in name order (the default counts a URL-encoded body's bytes).
    assert volatile(b"b=2&a=1", form) == volatile(b"a=1&b=2", form)


def test_json_fingerprint_leaves_out_multipart_fields_and_files() -> None:
    def multipart(**data: Any) -> str:
        return VOLATILE(factory.post("/x/", data), "scope")

    base = multipart(n="1", sent_at="10:00")
    assert multipart(n="1", sent_at="11:00") == base
    assert multipart(n="1") == base
    assert multipart(n="2", sent_at="10:00") != base
    upload = SimpleUploadedFile("a.txt", b"one")
    assert multipart(n="1", sent_at=upload) == base
    assert multipart(n="1", f=SimpleUploadedFile("a.txt", b"one")) != base


@pytest.mark.parametrize(
    ("exclude", "error"),
    [
        (["sent_at"], "starts with '/'"),
        ([""], "starts with '/'"),
        (["/a~2"], "'~' must be '~0' or '~1'"),
        (["/a~"], "'~' must be '~0' or '~1'"),
        ([1], "is not a JSON Pointer"),
    ],
)
def test_json_fingerprint_refuses_bad_pointers_when_built(exclude: list[Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        json_fingerprint(exclude=exclude)


def test_json_fingerprint_refuses_a_string_and_says_what_it_is() -> None:
    with pytest.raises(TypeError, match="not a string"):
        json_fingerprint(exclude="/sent_at")
    assert repr(json_fingerprint(exclude=["/a"])) == "json_fingerprint(exclude=['/a'])"
    assert json_fingerprint(exclude=["/a"]) == json_fingerprint(exclude=("/a",))


@override_settings(IDEMPOTENCY={"FINGERPRINT_FUNCTION": VOLATILE})
def test_json_fingerprint_as_the_setting(client: Any, db: None) -> None:
    headers = {"Idempotency-Key": "k"}
    first = client.post(
        "/create/", {"sent_at": 1}, content_type="application/json", headers=headers
    )
    again = client.post(
        "/create/", {"sent_at": 2}, content_type="application/json", headers=headers
    )
    assert first.status_code == 201
    assert again["Idempotent-Replayed"] == "true"


@pytest.mark.parametrize(
    "body",
    [
        b'{"b": 1, "a": [true, false, null, "x\\u00e9"], "c": {}}',
        b'{"amount": 4200, "currency": "usd", "nested": {"z": [], "y": -12}}',
        b'"\\ud83d lone"',
        b"[1, -0, 2]",
        b'{"a": 1, "a": 2}',
        b'{"n": 0.10000000000000000001, "e": 1e0, "f": 1.0}',
        b'{"\\u00e9": 1, "e": 2, "\\ud83d\\ude00": 3, "Z": 4}',
        b"12345678901234567890123456789",
        b"not json",
        b"[" * 5000 + b"]" * 5000,
    ],
)
def test_the_fast_canonical_form_is_the_writers(body: bytes) -> None:
    """Most bodies are written by the C encoder (issue 28), byte for byte as the module's own
    writer writes them; the rest (-0, duplicates, fractions) by the writer itself."""
    assert canonical_json(body) == written(body)
