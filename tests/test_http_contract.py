"""Every row of SPEC section 2, on function views, sync and async."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client, RequestFactory, override_settings
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_idempotency import IdempotencyKey, request_fingerprint
from django_idempotency._base.keys import hash_key
from django_idempotency.testing import expire_key, hold_key
from tests.conftest import REDIS_STORE, executions, problem_slug, redis_records, stored
from tests.factories import IdempotencyKeyFactory

pytestmark = pytest.mark.django_db

Post = Callable[..., Any]
SYNC_AND_ASYNC = pytest.mark.parametrize(
    ("path", "label"), [("/create/", "create"), ("/async/", "async")]
)


def record(key: str) -> IdempotencyKey:
    """The key's one record, on either store."""
    if REDIS_STORE:
        (found,) = redis_records(hash_key(key))
        return found  # type: ignore[no-any-return]
    return IdempotencyKey.objects.get(key_hash=hash_key(key))


def test_no_key_optional_runs_as_undecorated(post: Post) -> None:
    first = post("/create/", {"a": 1}, key=None)
    second = post("/create/", {"a": 1}, key=None)
    assert first.status_code == second.status_code == 201
    assert executions("create") == 2
    assert not bool(stored())
    assert "Idempotent-Replayed" not in second


def test_no_key_required_is_400(post: Post) -> None:
    response = post("/required/", key=None)
    assert response.status_code == 400
    assert problem_slug(response) == "missing-idempotency-key"
    assert executions() == 0


@pytest.mark.parametrize("header", ["", '""', "x" * 256, "caf\u00e9", '"unterminated', "a\x01b"])
def test_invalid_key_is_400(post: Post, header: str) -> None:
    response = post("/create/", key=header)
    assert response.status_code == 400
    assert problem_slug(response) == "invalid-idempotency-key"
    assert executions() == 0


@SYNC_AND_ASYNC
def test_first_request_runs_once_and_retries_replay(
    post: Post, key: str, path: str, label: str
) -> None:
    first = post(path, {"amount": 1}, key=key)
    retries = [post(path, {"amount": 1}, key=key) for _ in range(3)]
    assert first.status_code == 201
    assert executions(label) == 1
    for retry in retries:
        assert retry.status_code == first.status_code
        assert retry.content == first.content
        assert retry["Content-Type"] == first["Content-Type"]
        assert retry["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first
    stored = record(key)
    assert stored.status == IdempotencyKey.Status.COMPLETED
    assert stored.key_hash == hash_key(key) != key


def test_quoted_and_bare_key_are_the_same_key(post: Post) -> None:
    first = post("/create/", {"a": 1}, key="k-123")
    retry = post("/create/", {"a": 1}, key='"k-123"')
    assert retry["Idempotent-Replayed"] == "true"
    assert retry.content == first.content


def test_replay_keeps_allow_listed_headers_only(post: Post, key: str) -> None:
    first = post("/create/", key=key)
    retry = post("/create/", key=key)
    assert first["Location"] == retry["Location"]
    assert "X-Not-Stored" in first
    assert "X-Not-Stored" not in retry
    assert "session-ish" in first.cookies
    assert "session-ish" not in retry.cookies
    assert "Set-Cookie" not in retry


@override_settings(IDEMPOTENCY={"REPLAYED_HEADERS": ["Content-Type", "X-Not-Stored"]})
def test_replayed_header_allow_list_is_a_setting(post: Post, key: str) -> None:
    post("/create/", key=key)
    retry = post("/create/", key=key)
    assert retry["X-Not-Stored"] == "1"
    assert "Location" not in retry


@pytest.mark.parametrize("replayed", [None, ["Content-Type"]], ids=["default", "Content-Type"])
def test_a_private_response_stays_private_to_caches_when_replayed(
    key: str, replayed: list[str] | None
) -> None:
    """The view's ``Cache-Control`` and ``Vary`` are replayed, whatever ``REPLAYED_HEADERS``
    lists: dropped, a shared cache could keep one principal's replayed response and serve it to
    others (issue 48). The app's own answers say ``no-store``."""
    from django.http import HttpRequest, JsonResponse

    from django_idempotency import idempotent

    @idempotent(scope=lambda request: request.headers["X-Tenant"])
    def balance(request: HttpRequest) -> JsonResponse:
        response = JsonResponse({"balance": 42}, status=201)
        response["Cache-Control"] = "no-store, private"
        response["Vary"] = "Authorization, Accept-Language"
        return response

    def send(body: bytes = b"{}") -> Any:
        request = RequestFactory().post(
            "/balance/",
            body,
            content_type="application/json",
            headers={"Idempotency-Key": key, "X-Tenant": "acme"},
        )
        return balance(request)

    settings = {} if replayed is None else {"REPLAYED_HEADERS": replayed}
    with override_settings(IDEMPOTENCY=settings):
        send()
        retry = send()
        mismatch = send(b'{"other": 1}')
    assert retry["Idempotent-Replayed"] == "true"
    assert retry["Cache-Control"] == "no-store, private"
    assert retry["Vary"] == "Authorization, Accept-Language"
    assert mismatch.status_code == 422 and mismatch["Cache-Control"] == "no-store"


def test_json_body_canonicalised_for_the_fingerprint(post: Post, key: str) -> None:
    post("/create/", '{"a": 1, "b": 2}', key=key)
    retry = post("/create/", '{ "b":2,"a":1 }', key=key)
    assert retry["Idempotent-Replayed"] == "true"
    assert executions() == 1


@SYNC_AND_ASYNC
def test_different_body_is_422_and_record_untouched(
    post: Post, key: str, path: str, label: str
) -> None:
    post(path, {"amount": 1}, key=key)
    before = record(key)
    response = post(path, {"amount": 2}, key=key)
    assert response.status_code == 422
    assert problem_slug(response) == "idempotency-key-reuse"
    assert executions(label) == 1
    after = record(key)
    assert (after.request_hash, after.response_body, after.updated_at) == (
        before.request_hash,
        before.response_body,
        before.updated_at,
    )


def test_different_path_or_method_is_422(client: Client, post: Post, key: str) -> None:
    post("/create/", {"a": 1}, key=key)
    other_path = post("/create/?page=2", {"a": 1}, key=key)
    other_method = client.patch(
        "/create/", {"a": 1}, content_type="application/json", headers={"Idempotency-Key": key}
    )
    assert other_path.status_code == other_method.status_code == 422
    assert executions() == 1


@override_settings(IDEMPOTENCY={"MISMATCH_STATUS": 400})
def test_mismatch_status_is_a_setting(post: Post, key: str) -> None:
    post("/create/", {"a": 1}, key=key)
    response = post("/create/", {"a": 2}, key=key)
    assert response.status_code == 400
    assert problem_slug(response) == "idempotency-key-reuse"


def test_another_principal_has_its_own_records(client: Client, key: str) -> None:
    alice = User.objects.create_user("alice")
    bob = User.objects.create_user("bob")
    responses = {}
    for user in (alice, bob, alice):
        client.force_login(user)
        responses.setdefault(user.username, []).append(
            client.post(
                "/create/",
                {"a": 1},
                content_type="application/json",
                headers={"Idempotency-Key": key},
            )
        )
    client.logout()
    anonymous = client.post(
        "/create/", {"a": 1}, content_type="application/json", headers={"Idempotency-Key": key}
    )
    assert executions() == 3  # alice once, bob once, anonymous once
    alice_first, alice_retry = responses["alice"]
    (bob_first,) = responses["bob"]
    assert alice_retry.content == alice_first.content
    assert bob_first.content != alice_first.content
    assert "Idempotent-Replayed" not in bob_first
    assert "Idempotent-Replayed" not in anonymous
    assert set(IdempotencyKey.objects.values_list("scope", flat=True)) == {
        f"user:{alice.pk}",
        f"user:{bob.pk}",
        "anonymous",
    }


def test_retry_while_first_in_flight_is_409(post: Post, key: str) -> None:
    # A record owned by a live attempt, as a concurrent first request leaves it.
    hold_key(key, "POST", "/create/", {"a": 1}, content_type="application/json")
    response = post("/create/", {"a": 1}, key=key)
    assert response.status_code == 409
    assert problem_slug(response) == "request-in-progress"
    assert response["Retry-After"] == "1"
    assert executions() == 0


@pytest.mark.parametrize("code", [500, 503, 429, 408])
def test_retryable_status_releases_the_record(post: Post, key: str, code: int) -> None:
    first = post(f"/status/{code}/", key=key)
    retry = post(f"/status/{code}/", key=key)
    assert first.status_code == retry.status_code == code
    assert "Idempotent-Replayed" not in retry
    assert executions() == 2
    assert not bool(stored())


@pytest.mark.parametrize("code", [400, 404, 409])
def test_deterministic_4xx_is_stored_as_failed_and_replayed(
    post: Post, key: str, code: int
) -> None:
    first = post(f"/status/{code}/", key=key)
    retry = post(f"/status/{code}/", key=key)
    assert retry.status_code == first.status_code == code
    assert retry["Idempotent-Replayed"] == "true"
    assert executions() == 1
    assert record(key).status == IdempotencyKey.Status.FAILED


@override_settings(IDEMPOTENCY={"RETRYABLE_STATUSES": [409]})
def test_retryable_statuses_is_a_setting(post: Post, key: str) -> None:
    post("/status/409/", key=key)
    post("/status/409/", key=key)
    assert executions() == 2
    post("/status/500/", key=key)
    assert record(key).status == IdempotencyKey.Status.FAILED


@pytest.mark.parametrize(
    ("path", "label"), [("/explode/", "explode"), ("/async-explode/", "async-explode")]
)
def test_exception_releases_and_is_reraised(post: Post, key: str, path: str, label: str) -> None:
    for _ in range(2):
        with pytest.raises(RuntimeError, match="boom"):
            post(path, key=key)
    assert executions(label) == 2
    assert not bool(stored())


def test_expired_record_is_treated_as_absent(post: Post, key: str) -> None:
    first = post("/create/", {"a": 1}, key=key)
    expire_key(key, "POST", "/create/", {"a": 1}, content_type="application/json")
    again = post("/create/", {"a": 2}, key=key)  # even another body: the old record is gone
    assert again.status_code == 201
    assert "Idempotent-Replayed" not in again
    assert again.content != first.content
    assert executions() == 2
    renewed = record(key)
    assert renewed.attempt == 1
    assert renewed.expires_at > timezone.now()


def test_stale_processing_record_is_taken_over(post: Post, key: str) -> None:
    with pytest.raises(KeyboardInterrupt):
        post("/recovery/", key=key, headers={"X-Crash-After": "charge"})
    stale = record(key)
    assert stale.status == IdempotencyKey.Status.PROCESSING
    assert stale.recovery_point == "charge"
    conflict = post("/recovery/", key=key)
    assert conflict.status_code == 409
    IdempotencyKey.objects.update(unlock_at=timezone.now() - timedelta(seconds=1))
    takeover = post("/recovery/", key=key)
    assert takeover.status_code == 200
    assert takeover.json()["done"] == ["ship"]
    assert takeover.json()["attempt"] == 2
    assert list(IdempotencyKey.objects.values_list("status", "attempt")) == [
        (IdempotencyKey.Status.COMPLETED, 2)
    ]
    assert [executions(f"step-{step}") for step in ("reserve", "charge", "ship")] == [1, 1, 1]
    assert post("/recovery/", key=key).content == takeover.content


def test_stale_record_with_another_body_is_422_not_taken_over(post: Post, key: str) -> None:
    with pytest.raises(KeyboardInterrupt):
        post("/recovery/", {"a": 1}, key=key, headers={"X-Crash-After": "reserve"})
    IdempotencyKey.objects.update(unlock_at=timezone.now() - timedelta(seconds=1))
    response = post("/recovery/", {"a": 2}, key=key)
    assert response.status_code == 422
    assert record(key).attempt == 1


def test_binary_body_is_replayed_byte_for_byte(post: Post, key: str) -> None:
    first = post("/binary/", key=key)
    retry = post("/binary/", key=key)
    assert len(first.content) == 1024
    assert retry.content == first.content == bytes(range(256)) * 4
    assert retry["Content-Type"] == "application/octet-stream"


def test_long_query_string_is_stored(post: Post, key: str) -> None:
    path = "/create/?" + "&".join(f"param{i}=value{i}" for i in range(500))
    assert len(path) > 5000
    first = post(path, key=key)
    retry = post(path, key=key)
    assert retry["Idempotent-Replayed"] == "true"
    assert record(key).path == path
    assert first.status_code == 201


def test_streaming_response_is_refused_with_a_clear_error(post: Post, key: str) -> None:
    from django_idempotency import UnreplayableResponse

    with pytest.raises(UnreplayableResponse, match="streaming responses cannot be stored"):
        post("/streaming/", key=key)
    assert not bool(stored())


def test_a_view_returning_no_response_says_that_a_retry_runs_it_again(key: str) -> None:
    """A ``dict`` (a view meant for another framework): not an ``AttributeError`` in the
    storing code, but what happened and what a retry does."""
    from django_idempotency import UnreplayableResponse, idempotent

    runs: list[int] = []

    @idempotent
    def view(request: Any) -> Any:
        runs.append(1)
        return {"charged": True}

    request = RequestFactory().post("/dict/", {}, headers={"Idempotency-Key": key})
    with pytest.raises(
        UnreplayableResponse, match="returned a dict, not an HttpResponse"
    ) as raised:
        view(request)
    assert "a retry with the same key runs it again" in str(raised.value)
    assert (runs, stored()) == ([1], [])


@override_settings(IDEMPOTENCY={"MAX_BODY_SIZE": 100})
def test_body_over_the_cap_is_not_stored_and_not_rerun(post: Post, key: str) -> None:
    small = post("/large/?size=100", key="small")
    assert post("/large/?size=100", key="small").content == small.content
    first = post("/large/?size=101", key=key)
    assert first.status_code == 200
    assert len(first.content) == 101
    retry = post("/large/?size=101", key=key)
    assert retry.status_code == 500
    assert problem_slug(retry) == "response-not-stored"
    assert executions() == 2


def test_safe_methods_pass_through(client: Client, key: str) -> None:
    response = client.get("/class/", headers={"Idempotency-Key": key})
    assert response.status_code == 200
    assert not bool(stored())


@override_settings(IDEMPOTENCY={"ENABLED": False})
def test_disabled_runs_every_request(post: Post, key: str) -> None:
    post("/create/", key=key)
    post("/create/", key=key)
    assert executions() == 2


@override_settings(IDEMPOTENCY={"HEADER": "X-Request-Once", "REQUIRED": True})
def test_header_and_required_are_settings(client: Client, key: str) -> None:
    missing = client.post("/create/", headers={"Idempotency-Key": key})
    assert missing.status_code == 400
    assert "X-Request-Once" in missing.json()["detail"]
    client.post("/create/", headers={"X-Request-Once": key})
    assert client.post("/create/", headers={"X-Request-Once": key})["Idempotent-Replayed"]


@override_settings(IDEMPOTENCY={"METHODS": ["PUT"]})
def test_methods_setting_chooses_what_is_protected(client: Client, key: str) -> None:
    for _ in range(2):
        client.post("/create/", headers={"Idempotency-Key": key})
        client.put("/create/", headers={"Idempotency-Key": key})
    assert executions() == 3  # two POSTs, one PUT


@override_settings(IDEMPOTENCY={"MIN_KEY_LENGTH": 16})
def test_minimum_key_length_is_a_setting(post: Post) -> None:
    assert post("/create/", key="short").status_code == 400
    assert post("/create/", key="x" * 16).status_code == 201


def tenant_scope(request: Any) -> str:
    return "tenant:" + request.headers.get("X-Tenant", "none")


@override_settings(IDEMPOTENCY={"SCOPE_FUNCTION": "tests.test_http_contract.tenant_scope"})
def test_scope_function_is_a_setting(post: Post, key: str) -> None:
    post("/create/", key=key, headers={"X-Tenant": "a"})
    post("/create/", key=key, headers={"X-Tenant": "b"})
    post("/create/", key=key, headers={"X-Tenant": "a"})
    assert executions() == 2
    assert set(IdempotencyKey.objects.values_list("scope", flat=True)) == {"tenant:a", "tenant:b"}


def body_blind_fingerprint(request: Any, scope: str) -> str:
    return f"{request.method}:{request.path}"


@override_settings(
    IDEMPOTENCY={"FINGERPRINT_FUNCTION": "tests.test_http_contract.body_blind_fingerprint"}
)
def test_fingerprint_function_is_a_setting(post: Post, key: str) -> None:
    post("/create/", {"a": 1}, key=key)
    assert post("/create/", {"a": 2}, key=key)["Idempotent-Replayed"] == "true"


@pytest.mark.database_store
def test_query_counts(post: Post, key: str, django_assert_num_queries: Any) -> None:
    with django_assert_num_queries(1):  # the view's own INSERT: no key, no statement of ours
        post("/status/201/", key=None)
    # The claim reads first, inside one call of the claim function (PostgreSQL) or procedure
    # (MySQL, MariaDB). SQLite inserts first inside a transaction (this test's), then reads.
    # Then the view's INSERT and the stored response.
    claim = {"postgresql": (1, 1), "mysql": (1, 1), "sqlite": (1, 2)}[connection.vendor]
    with django_assert_num_queries(claim[0] + 2):
        post("/status/201/", key=key)
    with django_assert_num_queries(claim[1]):  # a replay: the claim alone
        post("/status/201/", key=key)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(header=st.text(alphabet=st.characters(max_codepoint=0xFF), max_size=300))
def test_no_header_value_causes_a_500(post: Post, header: str) -> None:
    response = post("/create/", key=header)
    assert response.status_code in (201, 400)


def test_replay_comes_from_the_stored_record(post: Post, key: str) -> None:
    request = RequestFactory().post("/create/", {"a": 1}, content_type="application/json")
    IdempotencyKeyFactory(
        key=key, completed=True, request_hash=request_fingerprint(request, "anonymous")
    )
    response = post("/create/", {"a": 1}, key=key)
    assert (response.status_code, response.content) == (201, b'{"id": 1}')
    assert executions() == 0
    IdempotencyKey.objects.update(expires_at=timezone.now())
    assert "Idempotent-Replayed" not in post("/create/", {"a": 1}, key=key)


def test_problem_types_point_at_the_problem_type_base(post: Post) -> None:
    with override_settings(IDEMPOTENCY={"PROBLEM_TYPE_BASE": "https://api.example.com/errors/"}):
        response = post("/required/", key=None)
    assert response.json()["type"] == "https://api.example.com/errors/missing-idempotency-key"
    default = post("/required/", key=None).json()["type"]
    assert default == (
        "https://django-idempotency.readthedocs.io/en/latest/problems.html#missing-idempotency-key"
    )
