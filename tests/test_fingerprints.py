from __future__ import annotations

from django.test import RequestFactory

from django_idempotency.fingerprints import canonical_body, request_fingerprint

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
