"""django_idempotency.testing: each helper against the app it stands in front of."""

from __future__ import annotations

import asyncio
import re
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import User
from django.http import HttpResponse
from django.test import AsyncClient, Client, RequestFactory, override_settings

from django_idempotency import IdempotencyInProgress, IdempotencyKey, idempotent_function
from django_idempotency._base.keys import hash_key
from django_idempotency.testing import (
    assert_replayed,
    concurrently,
    expire_key,
    hold_key,
    key_records,
    new_key,
    stale_key,
)
from tests.conftest import executions, problem_slug
from tests.testapp import policy_views, views
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db

JSON = {"content_type": "application/json"}
Post = Callable[..., Any]


def test_new_key_is_fresh_and_in_the_configured_format() -> None:
    assert new_key() != new_key()
    uuid.UUID(new_key())
    with override_settings(IDEMPOTENCY={"MIN_KEY_LENGTH": 100}):
        assert len(new_key()) >= 100
    pattern = re.compile(r"ord_[0-9a-f]{32}")
    with override_settings(IDEMPOTENCY={"KEY_FORMAT": pattern}):
        assert pattern.fullmatch(new_key())
    # Drawn from the pattern, and within what the header takes (255 printable ASCII characters).
    for drawn in (r"order-[0-9]{1,10}", r"(?:[a-z]{2}|\d+)-\w*-[^,]{3}", r"[a-z]{200,300}"):
        with override_settings(IDEMPOTENCY={"KEY_FORMAT": re.compile(drawn)}):
            key = new_key()
            assert re.fullmatch(drawn, key) and len(key) <= 255 and key.isascii(), key
    with (
        override_settings(IDEMPOTENCY={"KEY_FORMAT": re.compile(r"(k)\1")}),
        pytest.raises(ValueError, match="no key matching"),
    ):
        new_key()


def test_new_key_in_a_views_format(post: Post) -> None:
    key = new_key("/policy/order/")
    assert policy_views.ORDER_KEY.fullmatch(key)
    assert new_key(views.create) != key
    assert post("/policy/order/", key=key).status_code == 201
    uuid.UUID(new_key(views.ExecutionViewSet))


def test_new_key_of_a_function_ignores_the_headers_settings() -> None:
    @idempotent_function(key="event_id", key_format=re.compile(r"evt_[0-9a-f]{32}"))
    def handle(event_id: str) -> None: ...

    with override_settings(IDEMPOTENCY={"MIN_KEY_LENGTH": 200}):
        assert re.fullmatch(r"evt_[0-9a-f]{32}", new_key(handle))


def test_assert_replayed_passes_for_a_replay(post: Post, key: str) -> None:
    first = post("/create/", {"a": 1}, key=key)
    assert_replayed(post("/create/", {"a": 1}, key=key), first)


def test_assert_replayed_refuses_a_second_run_with_a_diff(post: Post) -> None:
    first = post("/create/", {"a": 1}, key=None)
    second = post("/create/", {"a": 1}, key=None)
    with pytest.raises(AssertionError) as failure:
        assert_replayed(second, first)
    message = str(failure.value)
    assert "no 'Idempotent-Replayed: true' header" in message
    assert f'-  "id": {first.json()["id"]},' in message
    assert f'+  "id": {second.json()["id"]},' in message


def test_assert_replayed_compares_bytes_status_and_stored_headers() -> None:
    original = HttpResponse(b'{"a": 1}', status=201, content_type="application/json")
    replay = HttpResponse(b'{"a":1}', status=201, content_type="application/json")
    replay["Idempotent-Replayed"] = "true"
    with pytest.raises(AssertionError, match="same JSON in other bytes"):
        assert_replayed(replay, original)
    replay.content = original.content
    assert_replayed(replay, original)
    replay["Location"] = "/elsewhere/"
    with pytest.raises(AssertionError, match=r"\+location: /elsewhere/"):
        assert_replayed(replay, original)
    del replay["Location"]
    replay.status_code = 200
    with pytest.raises(AssertionError, match=r"-status 201\n\+status 200"):
        assert_replayed(replay, original)


def test_hold_key_makes_the_next_request_409(post: Post, key: str) -> None:
    claim = hold_key(key, "POST", "/create/", {"a": 1}, **JSON)
    response = post("/create/", {"a": 1}, key=key)
    assert response.status_code == 409
    assert problem_slug(response) == "request-in-progress"
    assert executions() == 0
    assert key_records(key).get().pk == claim.pk
    # Another body is another request: the scope and fingerprint are the app's.
    assert post("/create/", {"a": 2}, key=key).status_code == 422


def test_hold_key_computes_the_users_scope(client: Any, key: str) -> None:
    alice = User.objects.create_user("alice")
    hold_key(key, "POST", "/create/", {"a": 1}, user=alice, **JSON)
    client.force_login(alice)
    headers = {"Idempotency-Key": key}
    assert client.post("/create/", {"a": 1}, headers=headers, **JSON).status_code == 409
    assert key_records(key).get().scope == f"user:{alice.pk}"
    client.logout()  # another principal: its own record
    assert client.post("/create/", {"a": 1}, headers=headers, **JSON).status_code == 201


def test_hold_key_with_a_drf_viewset_and_a_request(client: Any, key: str) -> None:
    hold_key(key, "POST", "/api/executions/", {"label": "x"}, **JSON)
    headers = {"Idempotency-Key": key}
    response = client.post("/api/executions/", {"label": "x"}, headers=headers, **JSON)
    assert response.status_code == 409
    other = new_key()
    request = RequestFactory().post("/class/", {"b": 2}, **JSON)
    hold_key(other, request)
    response = client.post("/class/", {"b": 2}, headers={"Idempotency-Key": other}, **JSON)
    assert response.status_code == 409


@override_settings(IDEMPOTENCY={"WAIT_TIMEOUT": 0.2})
def test_hold_key_makes_a_waiting_view_wait_then_409(post: Post, key: str) -> None:
    hold_key(key, "POST", "/wait-short/", {"a": 1}, **JSON)
    response = post("/wait-short/", {"a": 1}, key=key)
    assert response.status_code == 409
    assert executions() == 0


def test_hold_key_refuses_what_the_app_would(key: str) -> None:
    with pytest.raises(ValueError, match="not a protected method"):
        hold_key(key, "GET", "/create/")
    with pytest.raises(ValueError, match="No view answers"):
        hold_key(key, "POST", "/nowhere/")
    with pytest.raises(ValueError, match=r"refuses key 'abc'.*UUID"):
        hold_key("abc", "POST", "/policy/uuid/")
    hold_key(key, "POST", "/create/")
    with pytest.raises(ValueError, match="already has a live record"):
        hold_key(key, "POST", "/create/")


def test_stale_key_is_taken_over_at_its_recovery_point(post: Post, key: str) -> None:
    stale_key(key, "POST", "/recovery/", {}, **JSON, recovery_point="charge", recovery_data={})
    response = post("/recovery/", key=key)
    assert response.status_code == 200
    assert response.json()["done"] == ["ship"]
    assert response.json()["attempt"] == 2
    assert executions("step-reserve") == executions("step-charge") == 0


def test_expire_key_makes_the_next_request_a_first(post: Post, key: str) -> None:
    first = post("/create/", {"a": 1}, key=key)
    record = expire_key(key, "POST", "/create/", {"a": 1}, **JSON)
    assert record.is_expired
    again = post("/create/", {"a": 1}, key=key)
    assert again.status_code == 201 and "Idempotent-Replayed" not in again
    assert again.content != first.content
    with pytest.raises(LookupError, match="send the request first"):
        expire_key(new_key(), "POST", "/create/")


def test_key_records_are_every_scopes(client: Any, post: Post, key: str) -> None:
    assert not key_records(key).exists()
    post("/create/", key=key)
    client.force_login(User.objects.create_user("bob"))
    client.post("/create/", headers={"Idempotency-Key": key})
    assert key_records(key)[0].scope == "anonymous"
    assert key_records(key).count() == 2
    assert set(key_records(key).values_list("key_hash", flat=True)) == {hash_key(key)}


# --- django-ninja operations (issue 38) ---------------------------------------------------------

CHARGE = {"amount": 4200, "currency": "eur"}


def _ninja(path: str, key: str, **headers: str) -> Any:
    headers["Idempotency-Key"] = key
    return Client().post(f"/ninja/{path}", CHARGE, headers=headers, **JSON)


def test_new_key_of_a_ninja_operation_by_path_or_function() -> None:
    from tests.testapp import ninja_api

    uuid.UUID(new_key("/ninja/required"))  # key_format="uuid"
    assert new_key(ninja_api.required) != new_key(ninja_api.required)
    uuid.UUID(new_key("/ninja/things/1"))  # PUT and DELETE, protected alike
    with pytest.raises(ValueError, match="No view answers"):
        new_key("/ninja/nowhere")


def test_hold_key_on_a_ninja_operation_by_path(key: str) -> None:
    claim = hold_key(key, "POST", "/ninja/charges", CHARGE, **JSON)
    response = _ninja("charges", key)
    assert response.status_code == 409
    assert problem_slug(response) == "request-in-progress"
    assert executions("ninja-charge") == 0
    assert key_records(key).get().pk == claim.pk
    assert _ninja("charges", key, X_Other="1").status_code == 409  # headers are not the body
    changed = Client().post(
        "/ninja/charges", {**CHARGE, "amount": 1}, headers={"Idempotency-Key": key}, **JSON
    )
    assert changed.status_code == 422


def test_hold_key_on_a_ninja_operation_uses_ninjas_authentication(key: str) -> None:
    """The scope is ninja's ``request.auth``, as the operation computes it: made by the
    operation's own authentication from the headers the test describes, or set on a request."""
    api_key = {"X-API-Key": "key-one"}
    hold_key(key, "POST", "/ninja/api-key", CHARGE, headers=api_key, **JSON)
    assert _ninja("api-key", key, **api_key).status_code == 409
    assert _ninja("api-key", key, **{"X-API-Key": "key-two"}).status_code == 201  # another's
    assert executions("ninja-api-key") == 1
    with pytest.raises(ValueError, match=r"authentication refuses POST /ninja/api-key \(401\)"):
        hold_key(new_key(), "POST", "/ninja/api-key", CHARGE, **JSON)

    other = new_key()
    request = RequestFactory().post("/ninja/api-key", CHARGE, **JSON)
    request.auth = "key-two"  # type: ignore[attr-defined]
    hold_key(other, request)
    assert _ninja("api-key", other, **{"X-API-Key": "key-two"}).status_code == 409
    assert _ninja("api-key", other, **api_key).status_code == 201


def test_hold_key_on_an_async_ninja_operation_with_a_users_password(key: str) -> None:
    User.objects.create_user("alice", password="secret")
    basic = {"Authorization": "Basic YWxpY2U6c2VjcmV0"}  # alice:secret
    hold_key(key, "POST", "/ninja/basic", CHARGE, headers=basic, **JSON)
    assert _ninja("basic", key, **basic).status_code == 409
    hold_key(key, "POST", "/ninja/async", CHARGE, **JSON)
    assert _ninja("async", key).status_code == 409
    assert executions("ninja-basic") == executions("ninja-async") == 0


def test_stale_and_expire_key_on_a_ninja_operation(key: str) -> None:
    stale_key(key, "POST", "/ninja/recovery", CHARGE, **JSON, recovery_point="charged")
    response = _ninja("recovery", key)
    assert response.status_code == 201 and response.json()["attempt"] == 2
    assert executions("ninja-recovery-charge") == 0 and executions("ninja-recovery-ship") == 1
    expire_key(key, "POST", "/ninja/recovery", CHARGE, **JSON)
    again = _ninja("recovery", key)
    assert again.status_code == 201 and "Idempotent-Replayed" not in again
    assert again.json()["attempt"] == 1


def test_the_helpers_refuse_a_ninja_operation_that_is_not_protected(key: str) -> None:
    with pytest.raises(ValueError, match="not protected"):
        hold_key(key, "GET", "/ninja/things")  # protected, but a safe method
    with pytest.raises(ValueError, match="No protected ninja operation answers PATCH"):
        hold_key(key, "PATCH", "/ninja/charges", CHARGE, **JSON)


def test_function_states(key: str) -> None:
    @idempotent_function(key="event_id")
    def handle(event_id: str, amount: int, *, idempotency: Any = None) -> dict[str, Any]:
        Execution.objects.create(label="handle")
        return {"attempt": idempotency.attempt, "from": idempotency.recovery_point}

    hold_key(key, handle, key, 3)
    with pytest.raises(IdempotencyInProgress):
        handle(key, 3)
    other = new_key(handle)
    stale_key(other, handle, other, amount=3, recovery_point="charged")
    assert handle(other, 3) == {"attempt": 2, "from": "charged"}
    expire_key(other, handle, other, 3)
    assert handle(other, 3) == {"attempt": 1, "from": ""}
    with pytest.raises(ValueError, match="The call's key is"):
        hold_key(key, handle, new_key(), 3)


@pytest.mark.django_db(transaction=True)
def test_concurrently_runs_the_calls_at_once_in_threads(key: str) -> None:
    def send() -> Any:  # a client each: a test client is not shared between threads
        return Client().post("/create/", {"a": 1}, headers={"Idempotency-Key": key}, **JSON)

    answers = concurrently(send, 4)
    assert len(answers) == 4
    assert executions() == 1
    replays = [answer for answer in answers if answer.get("Idempotent-Replayed") == "true"]
    conflicts = [answer for answer in answers if answer.status_code == 409]
    fresh = [answer for answer in answers if answer not in replays + conflicts]
    assert [answer.status_code for answer in fresh] == [201]
    assert len(replays) + len(conflicts) == 3


@pytest.mark.django_db(transaction=True)
def test_concurrently_collects_exceptions(key: str) -> None:
    @idempotent_function(key="event_id")
    def handle(event_id: str) -> int:
        return IdempotencyKey.objects.count()

    hold_key(key, handle, key)
    answers = concurrently(lambda: handle(key), 3, return_exceptions=True)
    assert [type(answer) for answer in answers] == [IdempotencyInProgress] * 3
    with pytest.raises(IdempotencyInProgress):
        concurrently(lambda: handle(key), 2)


def test_concurrently_refuses_a_test_transaction() -> None:
    with pytest.raises(RuntimeError, match="transaction=True"):
        concurrently(lambda: None, 2)


def test_concurrently_runs_coroutines_as_tasks() -> None:
    running = 0
    peak = 0

    async def call() -> int:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0)
        running -= 1
        return 7

    assert asyncio.run(concurrently(call, 3)) == [7, 7, 7]
    assert peak == 3


@pytest.mark.django_db(transaction=True)
def test_concurrently_has_every_call_running_at_once() -> None:
    """Each call waits for all the others to have started: calls one after another never
    would (the barrier breaks after its timeout, far above any run's)."""
    met = threading.Barrier(3, timeout=30)
    assert sorted(concurrently(lambda: met.wait(), 3)) == [0, 1, 2]


@pytest.mark.django_db(transaction=True)
def test_concurrently_with_an_async_client(key: str) -> None:
    async def send() -> Any:
        headers = {"Idempotency-Key": key}
        return await AsyncClient().post("/async/", {"a": 1}, headers=headers, **JSON)

    async def main() -> list[Any]:
        return await concurrently(send, 3)

    # async_to_sync, not asyncio.run: the ORM's sync work then runs on this thread's connection,
    # which the test closes (asyncio.run's would be left open on an executor's thread).
    answers = async_to_sync(main)()
    assert executions("async") == 1
    assert all(answer.status_code in (201, 409) for answer in answers)
