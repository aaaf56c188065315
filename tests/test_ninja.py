"""django_idempotency.ninja.idempotent on ninja operations, through Django's test client."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, override_settings
from ninja import NinjaAPI, Router

from django_idempotency import IdempotencyKey
from django_idempotency.ninja import auth_scope, idempotent
from tests.conftest import executions, only_record, problem_slug, stored
from tests.testapp.ninja_api import ChargeIn

pytestmark = pytest.mark.django_db

CHARGE = {"amount": 4200, "currency": "eur"}


def send(
    path: str, body: Any = None, *, key: str | None, method: str = "post", **headers: str
) -> Any:
    if key is not None:
        headers["Idempotency-Key"] = key
    data = json.dumps(CHARGE if body is None else body)
    return getattr(Client(), method)(
        f"/ninja/{path}", data, content_type="application/json", headers=headers
    )


def assert_replay(first: Any, again: Any) -> None:
    assert again["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first
    assert (again.status_code, again.content) == (first.status_code, first.content)
    assert again["Content-Type"] == first["Content-Type"]


@pytest.mark.parametrize(
    ("path", "label", "status"),
    [
        ("charges", "ninja-charge", 201),
        ("dict", "ninja-dict", 200),
        ("status", "ninja-status", 202),
        ("http-response", "ninja-http", 201),
        ("temporal", "ninja-temporal", 201),
        ("async", "ninja-async", 201),
        ("router/charges", "ninja-router", 201),
        ("router/async", "ninja-router-async", 201),
    ],
)
def test_the_operation_runs_once_and_its_rendered_response_is_replayed(
    path: str, label: str, status: int, key: str
) -> None:
    first = send(path, key=key)
    again = send(path, key=key)
    assert first.status_code == status, first.content
    assert_replay(first, again)
    assert executions(label) == 1
    record = only_record()
    assert bytes(record.response_body) == first.content


@pytest.mark.filterwarnings("ignore:Returning tuple:DeprecationWarning")
def test_a_status_and_body_tuple_is_rendered_stored_and_replayed(key: str) -> None:
    first = send("tuple", key=key)
    again = send("tuple", key=key)
    assert first.status_code == 201
    assert first.json() == {"id": first.json()["id"]}
    assert_replay(first, again)
    assert executions("ninja-tuple") == 1


def test_a_4xx_status_the_operation_returns_is_stored(key: str) -> None:
    first = send("status", {"amount": 0}, key=key)
    again = send("status", {"amount": 0}, key=key)
    assert (first.status_code, first.json()) == (400, {"error": "amount"})
    assert_replay(first, again)
    assert only_record().status == IdempotencyKey.Status.FAILED


def test_headers_set_on_ninja_s_response_are_stored(key: str) -> None:
    first = send("temporal", key=key)
    again = send("temporal", key=key)
    assert again["Location"] == first["Location"] == f"/things/{first.json()['id']}"


def test_an_http_response_is_stored_as_returned(key: str) -> None:
    first = send("http-response", key=key)
    again = send("http-response", key=key)
    assert first.content.startswith(b"made ")
    assert again["Content-Type"] == "text/plain"
    assert again["Location"] == first["Location"]


@pytest.mark.parametrize(
    ("method", "path", "label"),
    [
        ("put", "things/7", "ninja-put"),
        ("delete", "things/7", "ninja-delete"),
        ("patch", "router/patch", "ninja-router-patch"),
    ],
)
def test_the_operation_s_own_method_is_protected(
    method: str, path: str, label: str, key: str
) -> None:
    first = send(path, {}, key=key, method=method)
    again = send(path, {}, key=key, method=method)
    assert first.status_code == 200, first.content
    assert_replay(first, again)
    assert executions(label) == 1


def test_a_safe_method_passes_through(key: str) -> None:
    for _ in range(2):
        response = Client().get("/ninja/things", headers={"Idempotency-Key": key})
        assert response.status_code == 200
        assert "Idempotent-Replayed" not in response
    assert not bool(stored())


def test_without_a_key_the_operation_runs_unprotected() -> None:
    assert send("charges", key=None).status_code == 201
    assert send("charges", key=None).json()["executions"] == 2
    assert not bool(stored())


def test_a_changed_body_is_a_key_reuse(key: str) -> None:
    send("charges", key=key)
    refused = send("charges", {"amount": 1}, key=key)
    assert (refused.status_code, problem_slug(refused)) == (422, "idempotency-key-reuse")
    assert executions("ninja-charge") == 1


def test_ninja_s_422_for_an_invalid_body_is_not_stored(key: str) -> None:
    invalid = send("charges", {"amount": "lots"}, key=key)
    assert invalid.status_code == 422
    assert invalid["Content-Type"] == "application/json; charset=utf-8"
    assert not bool(stored())
    assert send("charges", key=key).status_code == 201
    assert executions("ninja-charge") == 1


def test_ninja_s_400_for_a_body_it_cannot_parse_is_not_stored(key: str) -> None:
    unparsed = Client().post(
        "/ninja/charges",
        b'{"amount": 4',
        content_type="application/json",
        headers={"Idempotency-Key": key},
    )
    assert unparsed.status_code == 400
    assert not bool(stored())
    assert send("charges", key=key).status_code == 201


def test_an_http_error_the_operation_raises_is_answered_by_ninja_and_released(key: str) -> None:
    for _ in range(2):
        refused = send("http-error", key=key)
        assert (refused.status_code, refused.json()) == (403, {"detail": "Not yours."})
    assert executions("ninja-http-error") == 2
    assert not bool(stored())


def test_a_401_is_not_stored_and_the_key_then_runs_with_good_credentials(key: str) -> None:
    refused = send("api-key", key=key, **{"X-API-Key": "wrong"})
    assert refused.status_code == 401
    assert not bool(stored())
    accepted = send("api-key", key=key, **{"X-API-Key": "key-one"})
    assert accepted.status_code == 201
    assert executions("ninja-api-key") == 1


def test_each_api_key_has_its_own_keys_hashed_in_its_scope(key: str) -> None:
    one = send("api-key", key=key, **{"X-API-Key": "key-one"})
    two = send("api-key", key=key, **{"X-API-Key": "key-two"})
    assert "Idempotent-Replayed" not in two
    assert one.json()["id"] != two.json()["id"]
    scopes = set(IdempotencyKey.objects.values_list("scope", flat=True))
    assert scopes == {auth_scope("key-one"), auth_scope("key-two")}
    assert not any("key-" in scope for scope in scopes)
    assert_replay(one, send("api-key", key=key, **{"X-API-Key": "key-one"}))


def test_a_model_instance_authenticated_by_ninja_is_the_scope(key: str) -> None:
    user = User.objects.create_user("ada", password="secret-pw")
    credentials = {"Authorization": "Basic " + _basic("ada", "secret-pw")}
    first = send("basic", key=key, **credentials)
    assert first.status_code == 201
    assert only_record().scope == f"user:{user.pk}"
    assert_replay(first, send("basic", key=key, **credentials))


def _basic(username: str, password: str) -> str:
    import base64

    return base64.b64encode(f"{username}:{password}".encode()).decode()


def test_auth_scope_names_a_model_by_its_class_and_key() -> None:
    execution_scope = auth_scope(_execution())
    assert execution_scope.startswith("testapp.execution:")
    assert auth_scope("secret") == auth_scope("secret") != auth_scope("other")
    assert "secret" not in auth_scope("secret")


def _execution() -> Any:
    from tests.testapp.models import Execution

    return Execution.objects.create(label="scope")


def test_an_auth_value_that_names_no_principal_is_refused_before_the_claim(key: str) -> None:
    class Principal:
        pass

    with pytest.raises(TypeError, match="address in memory"):
        auth_scope(Principal())
    with pytest.raises(TypeError, match="address in memory"):
        send("opaque-auth", key=key)
    assert not bool(stored())
    assert executions("ninja-opaque") == 0


@pytest.mark.parametrize("value", ["true", "one", "float", "ellipsis"])
def test_an_auth_result_that_identifies_nobody_is_refused_before_the_claim(
    value: str, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An authenticate() returning True put every caller in one scope: alice's response was
    replayed to bob (issue 48). Refused, the view not run, nothing claimed."""
    for user in ("alice", "bob"):
        refused = send(f"constant-auth/{value}", key=key, **{"X-User": user})
        assert refused.status_code == 500
        assert problem_slug(refused) == "idempotency-misconfigured"
    assert "identifies nobody" in caplog.text and "scope option" in caplog.text
    assert executions("ninja-constant") == 0
    assert not bool(stored())
    for auth in (True, 1, 2.5):
        with pytest.raises(TypeError, match="identifies nobody"):
            auth_scope(auth)


def test_an_auth_result_that_identifies_nobody_may_have_a_scope_option(key: str) -> None:
    alice = send("constant-auth-scoped/true", key=key, **{"X-User": "alice"})
    bob = send("constant-auth-scoped/true", key=key, **{"X-User": "bob"})
    assert alice.status_code == bob.status_code == 201
    assert "Idempotent-Replayed" not in bob
    assert alice.json()["id"] != bob.json()["id"]


def test_a_scope_option_wins_over_ninja_s_auth(key: str) -> None:
    one = send("scoped", key=key, **{"X-API-Key": "key-one", "X-Tenant": "t1"})
    two = send("scoped", key=key, **{"X-API-Key": "key-two", "X-Tenant": "t1"})
    assert_replay(one, two)
    assert only_record().scope == "tenant:t1"


def test_the_operation_s_fingerprint_option_is_used(key: str) -> None:
    first = send("fingerprint", {"amount": 5, "currency": "usd"}, key=key)
    assert_replay(first, send("fingerprint", {"amount": 5, "currency": "eur"}, key=key))
    refused = send("fingerprint", {"amount": 6, "currency": "usd"}, key=key)
    assert refused.status_code == 422


def test_the_operation_s_required_key_format_and_ttl(key: str) -> None:
    missing = send("required", key=None)
    assert (missing.status_code, problem_slug(missing)) == (400, "missing-idempotency-key")
    invalid = send("required", key="not-a-uuid")
    assert (invalid.status_code, problem_slug(invalid)) == (400, "invalid-idempotency-key")
    assert send("required", key=key).status_code == 201
    assert send("required", key=key)["Idempotent-Replayed"] == "true"
    record = only_record()
    assert record.expires_at - record.created_at == timedelta(seconds=120)
    assert executions("ninja-required") == 1


@pytest.mark.parametrize("code", [500, 503, 429])
def test_a_retryable_status_releases_the_key(code: int, key: str) -> None:
    assert send(f"status-code/{code}", key=key).status_code == code
    assert send(f"status-code/{code}", key=key).status_code == code
    assert executions("ninja-status-code") == 2
    assert not bool(stored())


def test_an_exception_releases_the_key(key: str) -> None:
    for _ in range(2):
        with pytest.raises(RuntimeError, match="boom"):
            send("explode", key=key)
    assert executions("ninja-explode") == 2
    assert not bool(stored())


def test_the_request_carries_its_claim(key: str) -> None:
    api = NinjaAPI(urls_namespace=f"claim-{uuid.uuid4()}")
    seen: list[Any] = []

    @api.post("/x")
    @idempotent
    def operation(request: Any) -> dict[str, str]:
        seen.append(request.idempotency)
        return {}

    from ninja.testing import TestClient

    TestClient(api).post("/x", json={}, headers={"Idempotency-Key": key})
    assert seen[0] is not None and seen[0].attempt == 1


def test_ninjas_test_client_s_key_is_read_and_its_request_left_as_it_came(key: str) -> None:
    """Ninja's ``TestClient`` spells the header's ``META`` name as given (``HTTP_Idempotency_Key``):
    the key is read through ``request.headers``, and ``META`` is not rewritten (issue 40)."""
    api = NinjaAPI(urls_namespace=f"meta-{uuid.uuid4()}")
    metas: list[dict[str, Any]] = []

    @api.post("/x")
    @idempotent
    def operation(request: Any) -> dict[str, str]:
        metas.append(dict(request.META))
        return {}

    from ninja.testing import TestClient

    client = TestClient(api)
    first = client.post("/x", json={}, headers={"Idempotency-Key": key})
    again = client.post("/x", json={}, headers={"Idempotency-Key": key})
    assert (first.status_code, again.status_code) == (200, 200)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert len(metas) == 1
    assert metas[0]["HTTP_Idempotency_Key"] == key
    assert "HTTP_IDEMPOTENCY_KEY" not in metas[0]


def test_above_the_operation_s_decorator_it_is_an_error_at_import() -> None:
    api = NinjaAPI(urls_namespace=f"misplaced-{uuid.uuid4()}")
    with pytest.raises(ImproperlyConfigured, match=r"under the operation's decorator \(@api"):

        @idempotent(required=True)
        @api.post("/x")
        def operation(request: Any) -> dict[str, str]:
            return {}


def test_in_view_mode_it_is_an_error_at_import() -> None:
    from ninja.decorators import decorate_view

    api = NinjaAPI(urls_namespace=f"view-mode-{uuid.uuid4()}")
    with pytest.raises(ImproperlyConfigured, match="view mode"):

        @api.post("/x")
        @decorate_view(idempotent)
        def operation(request: Any) -> dict[str, str]:
            return {}

    router = Router()
    router.add_decorator(idempotent, mode="view")

    @router.post("/y")
    def other(request: Any) -> dict[str, str]:
        return {}

    api.add_router("/r", router)
    with pytest.raises(ImproperlyConfigured, match="view mode"):
        api.urls  # noqa: B018


def test_string_annotations_resolve_where_the_function_was_written(key: str) -> None:
    """Ninja evaluates string annotations in the wrapper's globals; the wrapper's signature
    carries them evaluated, even when the return annotation cannot be."""
    api = NinjaAPI(urls_namespace=f"annotations-{uuid.uuid4()}")

    @api.post("/x")
    @idempotent
    def operation(request: Any, payload: ChargeIn) -> OnlyForTypeCheckers:  # type: ignore[name-defined]  # noqa: F821
        return {"amount": payload.amount}

    from ninja.testing import TestClient

    answer = TestClient(api).post("/x", json=CHARGE, headers={"Idempotency-Key": key})
    assert (answer.status_code, answer.json()) == (200, {"amount": 4200})


def test_a_router_mounted_twice_protects_both_mounts(key: str) -> None:
    router = Router()

    @router.post("/x")
    @idempotent
    def operation(request: Any) -> dict[str, int]:
        return {"n": executions("twice") + _run_twice()}

    api = NinjaAPI(urls_namespace=f"twice-{uuid.uuid4()}")
    api.add_router("/a", router, url_name_prefix="a")
    api.add_router("/b", router, url_name_prefix="b")
    from ninja.testing import TestClient

    client = TestClient(api)
    first = client.post("/a/x", json={}, headers={"Idempotency-Key": key})
    again = client.post("/b/x", json={}, headers={"Idempotency-Key": key})
    assert first.status_code == 200
    # Two paths: two requests, each with its own record.
    assert len(stored()) == 1
    assert again.status_code == 422


def _run_twice() -> int:
    from tests.testapp.models import Execution

    Execution.objects.create(label="twice")
    return 1


def test_the_plain_decorator_under_an_operation_s_decorator_is_an_error_at_import() -> None:
    """``django_idempotency.idempotent`` under ``@api.post``: ninja would render the dict after
    the wrapper, which stored nothing, released the key, and ran again at each retry."""
    from django_idempotency import idempotent as plain

    api = NinjaAPI(urls_namespace=f"plain-{uuid.uuid4()}")
    with pytest.raises(ImproperlyConfigured, match=r"django_idempotency\.ninja\.idempotent"):

        @api.post("/x")
        @plain(required=True)
        def operation(request: Any) -> dict[str, str]:
            return {}


def test_the_plain_decorator_given_to_add_decorator_is_an_error_when_urls_are_built() -> None:
    from django_idempotency import idempotent as plain

    for mode in ("operation", "view"):
        router = Router()
        router.add_decorator(plain, mode=mode)  # type: ignore[arg-type]

        @router.post("/y")
        def other(request: Any) -> dict[str, str]:
            return {}

        api = NinjaAPI(urls_namespace=f"plain-{mode}-{uuid.uuid4()}")
        api.add_router("/r", router)
        with pytest.raises(ImproperlyConfigured, match=r"django_idempotency\.ninja\.idempotent"):
            api.urls  # noqa: B018


@pytest.mark.parametrize("asynchronous", [False, True])
def test_the_plain_decorator_hidden_from_ninja_is_refused_before_the_claim(
    key: str, asynchronous: bool
) -> None:
    """A wrapper that copies nothing hides ninja's hook: the view's first call finds
    ``Operation.run`` among its callers and refuses before the claim, at every call."""
    from asgiref.sync import async_to_sync
    from ninja.testing import TestAsyncClient, TestClient

    from django_idempotency import idempotent as plain

    def hide(view: Any) -> Any:
        if asynchronous:

            async def hidden_async(request: Any) -> Any:
                return await view(request)

            return hidden_async

        def hidden(request: Any) -> Any:
            return view(request)

        return hidden

    api = NinjaAPI(urls_namespace=f"hidden-{uuid.uuid4()}")
    if asynchronous:

        @plain(required=True)
        async def charge_async(request: Any) -> dict[str, str]:
            await _record_async("ninja-hidden")
            return {}

        api.post("/x")(hide(charge_async))
    else:

        @plain(required=True)
        def charge(request: Any) -> dict[str, str]:
            _record("ninja-hidden")
            return {}

        api.post("/x")(hide(charge))
    post = async_to_sync(TestAsyncClient(api).post) if asynchronous else TestClient(api).post
    for _ in range(2):
        with pytest.raises(ImproperlyConfigured, match=r"django_idempotency\.ninja\.idempotent"):
            post("/x", json={}, headers={"Idempotency-Key": key})
    assert executions("ninja-hidden") == 0
    assert stored() == []


def _record(label: str) -> None:
    from tests.testapp.models import Execution

    Execution.objects.create(label=label)


async def _record_async(label: str) -> None:
    from asgiref.sync import sync_to_async

    await sync_to_async(_record)(label)


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=10)
def test_a_body_over_django_s_limit_is_ninja_s_error_and_claims_nothing(key: str) -> None:
    """Ninja parses the body before the operation: Django's 400 (docs/ninja.rst), with or
    without a key; the handler the page shows makes it a 413."""
    from django.core.exceptions import RequestDataTooBig
    from django.test import RequestFactory

    for headers in ({}, {"Idempotency-Key": key}):
        answer = Client(raise_request_exception=False).post(
            "/ninja/charges", json.dumps(CHARGE), content_type="application/json", headers=headers
        )
        assert answer.status_code == 400
    assert (executions("ninja-charge"), stored()) == (0, [])

    api = NinjaAPI(urls_namespace=f"too-big-{uuid.uuid4()}")

    @api.exception_handler(RequestDataTooBig)
    def body_too_large(request: Any, exc: Exception) -> Any:
        return api.create_response(request, {"detail": str(exc)}, status=413)

    @api.post("/x")
    @idempotent
    def operation(request: Any, payload: ChargeIn) -> dict[str, str]:
        return {}

    # Ninja's TestClient hands the body over as is; Django's request checks its size.
    (pattern,) = [p for p in api.urls[0] if str(p.pattern) == "x"]
    request = RequestFactory().post(
        "/x", json.dumps(CHARGE), content_type="application/json", headers={"Idempotency-Key": key}
    )
    assert pattern.callback(request).status_code == 413
    assert stored() == []
