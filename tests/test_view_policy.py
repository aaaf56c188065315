"""Per-view scope, fingerprint and key format (issue 18 items 1 and 2), on every kind of view
and on ``idempotent_function``."""

from __future__ import annotations

import logging
import re
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from django.test import RequestFactory, override_settings
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import (
    IdempotencyKey,
    IdempotencyKeyMismatch,
    InvalidKey,
    idempotent,
    idempotent_function,
    json_fingerprint,
)
from django_idempotency._base.keys import hash_key
from django_idempotency._conf.options import Options
from django_idempotency.rest_framework import IdempotencyMixin
from tests.conftest import executions, problem_slug
from tests.testapp.models import Execution
from tests.testapp.policy_views import broken_scope, method_scope, tenant_scope

pytestmark = pytest.mark.django_db

Post = Callable[..., Any]


def order_key() -> str:
    return f"order-{uuid.uuid4().int % 10**9}"


def uuid_key() -> str:
    return str(uuid.uuid4())


# Every kind of view with fingerprint=json_fingerprint(exclude=["/sent_at", "/meta/nonce"])
# and scope=tenant_scope: (path, a key of its format).
VOLATILE_VIEWS = pytest.mark.parametrize(
    ("path", "make_key"),
    [
        ("/policy/volatile/", uuid_key),
        ("/policy/async-volatile/", uuid_key),
        ("/policy/class-volatile/", uuid_key),
        ("/policy/drf-volatile/", uuid_key),
        ("/api/volatile-notes/", order_key),
    ],
    ids=["function", "async", "class", "drf-apiview", "drf-viewset"],
)


def body(sent_at: str, nonce: str, version: int = 1) -> dict[str, Any]:
    return {"label": "note", "sent_at": sent_at, "meta": {"nonce": nonce, "version": version}}


@VOLATILE_VIEWS
def test_the_views_fingerprint_leaves_out_volatile_parts(
    post: Post, path: str, make_key: Callable[[], str]
) -> None:
    key = make_key()
    tenant = {"X-Tenant": "acme"}
    first = post(path, body("10:00", "n1"), key=key, headers=tenant)
    assert first.status_code == 201
    retry = post(path, body("10:01", "n2"), key=key, headers=tenant)
    assert retry["Idempotent-Replayed"] == "true"
    assert retry.content == first.content
    # Without the volatile parts at all, it is still the same request...
    assert post(path, {"label": "note", "meta": {"version": 1}}, key=key, headers=tenant)[
        "Idempotent-Replayed"
    ]
    # ... but any other part counts.
    changed = post(path, body("10:02", "n3", version=2), key=key, headers=tenant)
    assert changed.status_code == 422
    assert executions() == 1


@VOLATILE_VIEWS
def test_the_views_scope_names_whose_key_it_is(
    post: Post, path: str, make_key: Callable[[], str]
) -> None:
    key = make_key()
    for tenant in ("a", "b", "a"):
        post(path, body("10:00", "n"), key=key, headers={"X-Tenant": tenant})
    assert executions() == 2
    assert set(IdempotencyKey.objects.values_list("scope", flat=True)) == {"tenant:a", "tenant:b"}


@pytest.mark.parametrize(
    ("path", "make_key", "bad_key"),
    [
        ("/policy/order/", order_key, uuid_key()),
        ("/policy/async-volatile/", uuid_key, "order-1"),
        ("/policy/class-volatile/", uuid_key, "order-1"),
        ("/policy/drf-volatile/", uuid_key, "order-1"),
        ("/api/volatile-notes/", order_key, uuid_key()),
    ],
    ids=["function", "async", "class", "drf-apiview", "drf-viewset"],
)
def test_the_views_key_format_refuses_other_keys(
    post: Post, path: str, make_key: Callable[[], str], bad_key: str
) -> None:
    assert post(path, body("10:00", "n"), key=make_key()).status_code == 201
    response = post(path, body("10:00", "n"), key=bad_key)
    assert response.status_code == 400
    assert problem_slug(response) == "invalid-idempotency-key"
    expected = "a UUID" if make_key is uuid_key else "order-[0-9]{1,10}"
    assert expected in response.json()["detail"]
    assert executions() == 1
    assert IdempotencyKey.objects.count() == 1


@pytest.mark.parametrize(
    ("header", "status"),
    [
        ("8e03978e-40d5-43e8-bc93-6894a57f9324", 201),
        ('"8E03978E-40D5-43E8-BC93-6894A57F9324"', 201),  # quoted, upper case
        ('"8e03978e-40d5-43e8-bc93-6894a57f9324";v=1', 201),
        ("8e03978e40d543e8bc936894a57f9324", 400),  # no hyphens
        ("{8e03978e-40d5-43e8-bc93-6894a57f9324}", 400),
        ("urn:uuid:8e03978e-40d5-43e8-bc93-6894a57f9324", 400),
        ("8e03978e-40d5-43e8-bc93-6894a57f932", 400),
        ("8e03978e-40d5-43e8-bc93-6894a57f9324 x", 400),
        ("g e03978e-40d5-43e8-bc93-6894a57f9324", 400),
    ],
)
def test_uuid_keys(post: Post, header: str, status: int) -> None:
    response = post("/policy/uuid/", key=header)
    assert response.status_code == status
    if status == 400:
        assert response.json()["detail"] == (
            "The Idempotency-Key must be a UUID (8-4-4-4-12 hexadecimal digits)."
        )


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/policy/uuid/", {}),
        ("/policy/async-volatile/", {"X-Tenant": "acme"}),
        ("/policy/drf-volatile/", {"X-Tenant": "acme"}),
    ],
    ids=["function", "async", "drf-apiview"],
)
def test_a_uuid_key_is_the_same_key_in_either_case(
    post: Post, path: str, headers: dict[str, str]
) -> None:
    """Case means nothing in a UUID: a retry in upper case is a replay, not a second charge
    (issue 26)."""
    key = uuid_key()
    data = body("10:00", "n")
    first = post(path, data, key=key, headers=headers)
    assert first.status_code == 201
    for spelling in (key.upper(), f'"{key.upper()}"', key[:8].upper() + key[8:]):
        retry = post(path, data, key=spelling, headers=headers)
        assert retry.status_code == 201
        assert retry["Idempotent-Replayed"] == "true"
        assert retry.content == first.content
    assert executions() == 1
    (record,) = IdempotencyKey.objects.all()
    assert record.key_hash == hash_key(key)


def test_any_other_key_keeps_its_case(post: Post) -> None:
    assert post("/create/", key="Order-1").status_code == 201
    assert "Idempotent-Replayed" not in post("/create/", key="order-1")
    assert executions() == 2


@pytest.mark.parametrize(
    ("header", "status"),
    [("order-1", 201), ('"order-22"', 201), ("order-", 400), ("xorder-1", 400)],
)
def test_a_pattern_must_match_the_whole_key(post: Post, header: str, status: int) -> None:
    assert post("/policy/order/", key=header).status_code == status


def test_key_format_is_a_setting_a_views_option_overrides(post: Post) -> None:
    with override_settings(IDEMPOTENCY={"KEY_FORMAT": "uuid"}):
        refused = post("/create/", key="abc")
        assert refused.status_code == 400
        assert "UUID" in refused.json()["detail"]
        assert post("/create/", key=uuid_key()).status_code == 201
        assert post("/policy/order/", key="order-7").status_code == 201
        assert Options.build(key_format="any").resolve().key_format.pattern is None
    with override_settings(IDEMPOTENCY={"KEY_FORMAT": re.compile("[a-c]+")}):
        assert post("/create/", key="abc").status_code == 201
        assert post("/create/", key="abd").status_code == 400
    assert post("/create/", key="abd").status_code == 201


@pytest.mark.parametrize(
    "path",
    ["/policy/scope-raises/", "/policy/async-scope-raises/", "/policy/class-scope-raises/"],
    ids=["function", "async", "class"],
)
def test_a_scope_function_that_raises_stops_the_request(
    post: Post, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    with (
        caplog.at_level(logging.ERROR, "django_idempotency"),
        pytest.raises(LookupError, match="no tenant header") as raised,
    ):
        post(path, key="k1")
    assert executions() == 0
    assert not IdempotencyKey.objects.exists()
    (logged,) = [r for r in caplog.records if r.name == "django_idempotency"]
    assert logged.levelno == logging.ERROR
    message = logged.getMessage()
    assert "tests.testapp.policy_views.broken_scope" in message
    assert "the view's scope option" in message
    assert "raised LookupError: no tenant header" in message
    assert f"POST {path} request was refused before its view ran" in message
    if sys.version_info >= (3, 11):
        assert raised.value.__notes__ == [message]


def test_a_scope_setting_that_raises_is_named_as_the_setting(
    post: Post, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        override_settings(IDEMPOTENCY={"SCOPE_FUNCTION": broken_scope}),
        pytest.raises(LookupError),
    ):
        post("/create/", key="k1")
    assert "IDEMPOTENCY['SCOPE_FUNCTION']" in caplog.text
    assert executions() == 0


def test_a_fingerprint_that_is_not_a_str_is_a_type_error(
    post: Post, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(TypeError, match=r"not_a_str_fingerprint .*returned int, not a str"):
        post("/policy/fingerprint-not-a-str/", key="k1")
    assert executions() == 0
    assert "not_a_str_fingerprint" in caplog.text


class RaisingScopeView(IdempotencyMixin, APIView):
    idempotency_scope = broken_scope

    def post(self, request: HttpRequest) -> Response:
        Execution.objects.create(label="raising")
        return Response({}, status=201)


def test_drf_a_scope_function_that_raises_stops_the_request() -> None:
    request = RequestFactory().post("/r/", {}, headers={"Idempotency-Key": "k"})
    with pytest.raises(LookupError):
        RaisingScopeView.as_view()(request)
    assert executions() == 0
    assert not IdempotencyKey.objects.exists()


@dataclass
class UnhashableScope:
    """A callable dataclass: it defines __eq__, and so is unhashable."""

    prefix: str

    def __call__(self, request: HttpRequest) -> str:
        return self.prefix


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"key_format": "uuid4"}, "'any', 'uuid' or a compiled regular expression"),
        ({"key_format": "^[a-z]+$"}, "not '\\^\\[a-z\\]\\+\\$'"),
        ({"key_format": 36}, "not 36"),
        ({"key_format": re.compile(b"[a-z]+")}, "compiled from a str"),
        ({"scope": "tenant"}, "scope must be a callable taking \\(request\\)"),
        ({"scope": lambda: "x"}, "cannot be called as f\\(request\\)"),
        ({"scope": method_scope}, "without self: use a staticmethod"),
        ({"fingerprint": tenant_scope}, "cannot be called as f\\(request, scope\\)"),
        ({"fingerprint": 42}, "fingerprint must be a callable"),
        ({"scope": UnhashableScope("t")}, "scope must be hashable, and UnhashableScope is not"),
    ],
)
def test_bad_options_fail_when_the_view_is_defined(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        idempotent(**options)
    with pytest.raises(ImproperlyConfigured, match=message):
        type(
            "Bad",
            (IdempotencyMixin, APIView),
            {f"idempotency_{name}": value for name, value in options.items()},
        )


def test_a_method_written_in_the_view_class_is_refused() -> None:
    with pytest.raises(ImproperlyConfigured, match="without self"):

        class Bad(IdempotencyMixin, APIView):
            def idempotency_fingerprint(self, request: HttpRequest) -> str:
                return "x"


def test_a_mixin_reads_functions_unbound_whatever_their_kind() -> None:
    fingerprint = json_fingerprint(exclude=["/a"])

    class Functions(IdempotencyMixin, APIView):
        idempotency_scope = tenant_scope
        idempotency_fingerprint = staticmethod(lambda request, scope: "f")

    class Callables(Functions):
        idempotency_fingerprint = fingerprint

    for view, expected in ((Functions, "f"), (Callables, None)):
        options = view.get_idempotency_options()
        assert options.get("scope") is tenant_scope
        assert options.get("fingerprint") is not None
        if expected:
            assert options.get("fingerprint")(HttpRequest(), "s") == expected
        else:
            assert options.get("fingerprint") is fingerprint
        # As the mixin reads them for each request, from an instance too.
        assert view().get_idempotency_options() == options


# idempotent_function


def test_function_key_format(key: str) -> None:
    @idempotent_function(key="message_id", key_format="uuid")
    def handle(message_id: str) -> int:
        return Execution.objects.create(label="handle").pk

    first = handle(key)
    assert handle(uuid.UUID(key)) == first
    # The same UUID is the same key (issue 26); the payload, which holds its spelling, differs.
    with pytest.raises(IdempotencyKeyMismatch):
        handle(key.upper())
    with pytest.raises(InvalidKey, match=r"handle: the idempotency key must be a UUID"):
        handle("evt_1")
    assert executions() == 1


@override_settings(IDEMPOTENCY={"KEY_FORMAT": "uuid"})
def test_the_key_format_setting_is_the_headers_not_a_functions() -> None:
    @idempotent_function(key="event_id")
    def handle(event_id: str) -> None:
        Execution.objects.create(label="handle")

    handle("evt_1NKeZbC")
    assert executions() == 1


def test_function_fingerprint_decides_what_must_match(key: str) -> None:
    @idempotent_function(key="message_id", fingerprint=lambda message_id, body, sent_at: body)
    def handle(message_id: str, body: str, sent_at: str) -> int:
        return Execution.objects.create(label="handle").pk

    first = handle(key, "charge 10", sent_at="10:00")
    assert handle(key, "charge 10", sent_at="10:01") == first
    with pytest.raises(IdempotencyKeyMismatch):
        handle(key, "charge 11", sent_at="10:00")
    assert executions() == 1


def test_function_fingerprint_must_return_a_str(key: str) -> None:
    @idempotent_function(key="message_id", fingerprint=lambda message_id: 1)
    def handle(message_id: str) -> None:
        Execution.objects.create(label="handle")

    with pytest.raises(TypeError, match="fingerprint\\(\\) must return a str, not int"):
        handle(key)
    assert executions() == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"fingerprint": "body"}, "fingerprint must be a callable"),
        ({"fingerprint": str, "payload": str}, "not both"),
        ({"key_format": "uuid4"}, "'any', 'uuid' or a compiled"),
    ],
)
def test_function_bad_options(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        idempotent_function(key="message_id", **options)(lambda message_id: None)


def test_views_without_the_options_follow_the_settings() -> None:
    def scope(request: HttpRequest) -> str:
        return "s"

    with override_settings(IDEMPOTENCY={"SCOPE_FUNCTION": scope}):
        policy = Options.build().resolve()
        assert policy.scope is scope
        assert Options.build(scope=tenant_scope).resolve().scope is tenant_scope
