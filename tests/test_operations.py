"""Long-running operations (issue 43, SPEC 4c): the operation of a record, its status endpoint,
its final response stored once and replayed, and ``in_progress="accepted"``."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.contrib.auth.models import User
from django.http import HttpResponse, JsonResponse
from django.test import Client, override_settings
from django.utils import timezone
from rest_framework.authtoken.models import Token

from django_idempotency import (
    IdempotencyKey,
    OperationError,
    complete_operation,
    set_operation_progress,
    store_for,
)
from django_idempotency._base.keys import hash_key
from django_idempotency.testing import assert_replayed, hold_key, stale_key
from tests.conftest import executions, problem_slug

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls("tests.operations_urls")]

Post = Callable[..., Any]


def start(post: Post, key: str, path: str = "/export/", **extra: Any) -> Any:
    response = post(path, {"rows": 3}, key=key, **extra)
    assert response.status_code == 202, response.content
    return response


def operation_of(response: Any) -> str:
    return str(json.loads(response.content)["operation"])


def status(client: Client, url: str, **extra: Any) -> Any:
    return client.get(url, **extra)


def test_a_view_answers_202_with_its_operation_and_retries_get_the_same(
    post: Post, client: Client, key: str
) -> None:
    first = start(post, key)
    operation_id = operation_of(first)
    record = IdempotencyKey.objects.get(key_hash=hash_key(key))
    assert operation_id.startswith(f"{record.pk}.")
    assert key not in operation_id and record.key_hash not in operation_id
    assert first["Location"] == f"/idempotency/operations/{operation_id}"
    retry = start(post, key)
    assert_replayed(retry, first)
    assert retry["Location"] == first["Location"]
    assert executions("export") == 1
    running = status(client, first["Location"])
    assert running.status_code == 200
    assert running["Retry-After"] == "1"
    assert running["Cache-Control"] == "no-store"
    assert json.loads(running.content) == {"id": operation_id, "state": "running"}


def test_the_final_response_is_stored_once_and_replayed(
    post: Post, client: Client, key: str
) -> None:
    first = start(post, key)
    operation_id = operation_of(first)
    final = JsonResponse({"url": "/files/1.csv"}, status=201, headers={"Location": "/files/1"})
    complete_operation(operation_id, final)
    retry = post("/export/", {"rows": 3}, key=key)
    assert retry.status_code == 201
    assert retry["Idempotent-Replayed"] == "true"
    assert retry.content == final.content
    assert retry["Location"] == "/files/1"
    assert executions("export") == 1
    shown = status(client, first["Location"])
    assert shown.status_code == 200
    assert "Retry-After" not in shown
    assert json.loads(shown.content) == {
        "id": operation_id,
        "state": "succeeded",
        "response": {
            "status": 201,
            "content_type": "application/json",
            "location": "/files/1",
            "body": {"url": "/files/1.csv"},
        },
    }
    with pytest.raises(OperationError, match="already completed") as refused:
        complete_operation(operation_id, status=200, data={"other": True})
    assert refused.value.reason == "completed"
    assert post("/export/", {"rows": 3}, key=key).content == final.content


def test_a_failed_operation_is_stored_the_same_way(post: Post, client: Client, key: str) -> None:
    first = start(post, key)
    complete_operation(operation_of(first), status=422, data={"detail": "bad rows"})
    retry = post("/export/", {"rows": 3}, key=key)
    assert retry.status_code == 422
    assert json.loads(retry.content) == {"detail": "bad rows"}
    assert retry["Idempotent-Replayed"] == "true"
    shown = json.loads(status(client, first["Location"]).content)
    assert shown["state"] == "failed"
    assert shown["response"]["status"] == 422
    assert IdempotencyKey.objects.get().status == IdempotencyKey.Status.FAILED


def test_a_text_body_is_shown_as_a_string(post: Post, client: Client, key: str) -> None:
    first = start(post, key)
    complete_operation(operation_of(first), HttpResponse("done\n", content_type="text/plain"))
    shown = json.loads(status(client, first["Location"]).content)
    assert shown["response"]["body"] == "done\n"
    assert shown["response"]["content_type"] == "text/plain"


def test_a_json_body_nested_past_the_parsers_depth_is_shown_as_a_string(
    post: Post, client: Client, key: str
) -> None:
    """``json.loads`` raises ``RecursionError``, not ``ValueError``, on a body nested past its
    depth: it was a ``500`` (issue 48). 100,000 deep: Python 3.12+ parses 5,000 in C."""
    first = start(post, key)
    deep = "[" * 100_000 + "]" * 100_000
    complete_operation(operation_of(first), HttpResponse(deep, content_type="application/json"))
    shown = status(client, first["Location"])
    assert shown.status_code == 200
    assert json.loads(shown.content)["response"]["body"] == deep


def test_a_json_body_with_nan_is_shown_as_a_string(post: Post, client: Client, key: str) -> None:
    """Python writes NaN and Infinity into JSON, and reads them back: shown as parsed, they
    made the endpoint's own answer no JSON, which a client's parser refuses."""
    first = start(post, key)
    complete_operation(operation_of(first), status=200, data={"ratio": float("nan")})
    shown = status(client, first["Location"])
    body = json.loads(shown.content, parse_constant=lambda name: pytest.fail(f"{name} answered"))
    assert body["response"]["body"] == '{"ratio": NaN}'


@override_settings(IDEMPOTENCY={"ENCRYPTION_KEYS": [Fernet.generate_key().decode()]})
def test_a_sealed_final_response_replays_byte_for_byte(
    post: Post, client: Client, key: str
) -> None:
    first = start(post, key)
    body = {"rows": [{"n": index, "text": "x" * 40} for index in range(200)]}  # compressed
    final = JsonResponse(body, status=200)
    complete_operation(operation_of(first), final)
    stored = IdempotencyKey.objects.get()
    assert b"rows" not in bytes(stored.response_body)  # encrypted at rest
    retry = post("/export/", {"rows": 3}, key=key)
    assert retry.content == final.content
    assert retry["Idempotent-Replayed"] == "true"
    assert json.loads(status(client, first["Location"]).content)["response"]["body"] == body


@override_settings(IDEMPOTENCY={"ENCRYPTION_KEYS": [Fernet.generate_key().decode()]})
def test_a_sealed_final_response_copied_into_another_operation_is_not_shown(
    post: Post, client: Client, key: str
) -> None:
    """Someone who can write the table copies one operation's sealed response into their own
    record: its status endpoint showed it in the clear (issue 48); the token is bound to its
    record, and opens nowhere else."""
    victim = start(post, key)
    complete_operation(operation_of(victim), JsonResponse({"card": "4242424242424242"}))
    mine = start(post, key + "-mine")
    sealed = IdempotencyKey.objects.get(key_hash=hash_key(key))
    IdempotencyKey.objects.filter(key_hash=hash_key(key + "-mine")).update(
        status=sealed.status,
        response_status=sealed.response_status,
        response_headers=sealed.response_headers,
        response_body=sealed.response_body,
        unlock_at=None,
    )
    shown = status(client, mine["Location"])
    assert shown.status_code == 200
    assert b"4242" not in shown.content
    assert json.loads(shown.content)["response"] is None
    assert b"4242" in status(client, victim["Location"]).content


def test_store_for_sets_the_records_ttl_from_completion(post: Post, key: str) -> None:
    operation_id = operation_of(start(post, key))
    complete_operation(operation_id, store_for(JsonResponse({}), timedelta(days=7)))
    left = IdempotencyKey.objects.get().expires_at - timezone.now()
    assert timedelta(days=6, hours=23) < left <= timedelta(days=7)


def test_a_final_202_is_refused(post: Post, key: str) -> None:
    operation_id = operation_of(start(post, key))
    with pytest.raises(ValueError, match="202"):
        complete_operation(operation_id, HttpResponse(status=202))
    assert IdempotencyKey.objects.get().response_status == 202


def test_an_expired_operation_is_refused_and_not_shown(
    post: Post, client: Client, key: str
) -> None:
    first = start(post, key)
    IdempotencyKey.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(OperationError, match="expired") as refused:
        complete_operation(operation_of(first), status=201, data={})
    assert refused.value.reason == "expired"
    assert IdempotencyKey.objects.get().response_status == 202
    assert status(client, first["Location"]).status_code == 404


@pytest.mark.parametrize(
    "operation_id",
    [
        *["", "1", "x.y", "1.AAAAAAAAAAAAAAAAAAAAAA", "1.2.3", "9999999999999999999.x", "\u0661.x"],
        # Redis operations' shape (r<store>-<oid>): no such store, none's shape.
        *["r00000000-AAAA.AAAA", "r.x", "r-.x", "rzzzzzzzz-.x", "r" + "0" * 8 + "-\u0661.x"],
    ],
)
def test_an_unknown_operation_is_refused(operation_id: str) -> None:
    with pytest.raises(OperationError, match="No operation") as refused:
        complete_operation(operation_id, status=201, data={})
    assert refused.value.reason == "unknown"


def test_an_operation_of_a_redis_store_this_process_does_not_know_says_so() -> None:
    """A worker whose settings lack the store of the view that answered the ``202`` (its
    ``STORE``, or its ``SECRET_KEY``) is told so, not that the id is none."""
    from django_idempotency._store.redis import names

    operation_id = f"{names.name('redis://elsewhere.invalid:6379/0', 'AAAA')}.AAAA"
    mark = names.tag("redis://elsewhere.invalid:6379/0")
    with pytest.raises(OperationError) as refused:
        complete_operation(operation_id, status=201, data={})
    assert refused.value.reason == "unknown"
    said = str(refused.value)
    assert f"the id names an operation of a Redis store (the store marked {mark!r}" in said
    assert "the same STORE or CACHES alias" in said and "the same SECRET_KEY" in said
    with pytest.raises(OperationError, match="knows no Redis store of that mark"):
        set_operation_progress(operation_id, {"done": 1})


def test_an_erased_operation_is_refused(post: Post, key: str) -> None:
    operation_id = operation_of(start(post, key))
    IdempotencyKey.objects.all().delete()
    with pytest.raises(OperationError) as refused:
        complete_operation(operation_id, status=201, data={})
    assert refused.value.reason == "unknown"


def test_an_operation_whose_request_still_runs(client: Client, key: str) -> None:
    claim = hold_key(key, "POST", "/export/", {"rows": 3}, content_type="application/json")
    shown = status(client, claim.operation_url)
    assert shown.status_code == 200
    assert json.loads(shown.content) == {"id": claim.operation_id, "state": "running"}
    with pytest.raises(OperationError, match="not stored its response") as refused:
        complete_operation(claim.operation_id, status=201, data={})
    assert refused.value.reason == "running"


def test_an_operation_whose_owner_died_is_stalled_not_running(
    post: Post, client: Client, key: str
) -> None:
    # The worker running the request died: its lock lapsed and no attempt holds the record.
    dead = stale_key(key, "POST", "/export/", {"rows": 3}, content_type="application/json")
    shown = status(client, dead.operation_url)
    assert shown.status_code == 200
    assert json.loads(shown.content) == {"id": dead.operation_id, "state": "stalled"}
    assert not shown.has_header("Retry-After")  # nothing runs it: polling would wait forever
    # What the state tells the client to do: retry the original request, which resumes it.
    resumed = start(post, key)
    assert operation_of(resumed) == dead.operation_id
    assert json.loads(status(client, dead.operation_url).content)["state"] == "running"


def test_a_view_that_finished_its_work_is_a_finished_operation(
    post: Post, client: Client, key: str
) -> None:
    post("/created/", {}, key=key)
    record = IdempotencyKey.objects.get()
    from django_idempotency._call.operations import make_id, status_url

    operation_id = make_id(record.pk, record.scope, record.key_hash, record.created_at)
    shown = json.loads(status(client, status_url(operation_id)).content)
    assert shown["state"] == "succeeded"
    assert shown["response"]["status"] == 201
    with pytest.raises(OperationError) as refused:
        complete_operation(operation_id, status=200, data={})
    assert refused.value.reason == "completed"


def test_the_operation_id_is_stable_across_a_takeover(post: Post, key: str) -> None:
    dead = stale_key(key, "POST", "/export/", {"rows": 3}, content_type="application/json")
    taken = start(post, key)
    assert operation_of(taken) == dead.operation_id


def test_another_principal_and_an_unknown_id_are_the_same_404(
    post: Post, client: Client, key: str
) -> None:
    alice = User.objects.create_user("alice", password="pw")
    bob = User.objects.create_user("bob", password="pw")
    client.force_login(alice)
    first = start(post, key)
    operation_id = operation_of(first)
    assert status(client, first["Location"]).status_code == 200
    named, mac = operation_id.split(".")
    forged = [
        f"{named}.{mac[:-1]}{'A' if mac[-1] != 'A' else 'B'}",
        f"9999999999999999999.{mac}",
        f"{another(named)}.{mac}",
        f"{named}.",
        "nothing",
    ]
    answers = [status(client, f"/idempotency/operations/{each}") for each in forged]
    client.force_login(bob)
    answers.append(status(client, first["Location"]))
    client.logout()
    answers.append(status(client, first["Location"]))  # anonymous
    assert {answer.status_code for answer in answers} == {404}
    assert {answer.content for answer in answers} == {answers[0].content}
    assert problem_slug(answers[0]) == "operation-not-found"
    # A cache between must keep no answer of the endpoint, its 404 either (issue 48).
    assert {answer["Cache-Control"] for answer in answers} == {"no-store"}


def another(named: str) -> str:
    """Another record's name in an operation id: the next primary key, or on a Redis store
    (``r<store>-<oid>``) an oid one letter off."""
    if named.isdigit():
        return str(int(named) + 1)
    return f"{named[:-1]}{'A' if named[-1] != 'A' else 'B'}"


def test_a_principal_of_a_long_scope_reads_its_own_operation(
    post: Post, client: Client, key: str
) -> None:
    """A scope longer than the column is stored as its hash: the endpoint compared the asker's
    scope as it is, and answered its own principal ``404``."""
    with override_settings(IDEMPOTENCY={"SCOPE_FUNCTION": lambda request: "tenant:" + "x" * 300}):
        first = start(post, key)
        assert IdempotencyKey.objects.get().scope.startswith("sha256:")
        assert status(client, first["Location"]).status_code == 200


def test_only_get_and_head(client: Client, post: Post, key: str) -> None:
    url = start(post, key)["Location"]
    assert client.head(url).status_code == 200
    assert client.post(url).status_code == 405


def test_drf_token_authenticates_the_status_endpoint(client: Client, key: str) -> None:
    alice = User.objects.create_user("alice")
    bob = User.objects.create_user("bob")
    alice_token, bob_token = Token.objects.create(user=alice), Token.objects.create(user=bob)
    first = client.post(
        "/drf-export/",
        {},
        content_type="application/json",
        headers={"Idempotency-Key": key, "Authorization": f"Token {alice_token.key}"},
    )
    assert first.status_code == 202
    url = first["Location"]
    mine = status(client, url, headers={"Authorization": f"Token {alice_token.key}"})
    assert mine.status_code == 200
    assert json.loads(mine.content)["state"] == "running"
    theirs = status(client, url, headers={"Authorization": f"Token {bob_token.key}"})
    wrong = status(client, url, headers={"Authorization": "Token nope"})
    anonymous = status(client, url)
    assert theirs.status_code == wrong.status_code == anonymous.status_code == 404


def test_ninja_api_key_authenticates_the_status_endpoint(client: Client, key: str) -> None:
    first = client.post(
        "/ninja/exports",
        {},
        content_type="application/json",
        headers={"Idempotency-Key": key, "X-API-Key": "key-one"},
    )
    assert first.status_code == 202, first.content
    url = first["Location"]
    scope = {"OPERATION_SCOPE_FUNCTION": "tests.testapp.operations_views.ninja_operation_scope"}
    with override_settings(IDEMPOTENCY=scope):
        assert status(client, url, headers={"X-API-Key": "key-one"}).status_code == 200
        assert status(client, url, headers={"X-API-Key": "key-two"}).status_code == 404
        assert status(client, url).status_code == 404
    # Without the setting the endpoint cannot know ninja's principal: not the owner.
    assert status(client, url, headers={"X-API-Key": "key-one"}).status_code == 404


def test_the_ninja_router_serves_the_status_endpoint_as_the_view_does(
    client: Client, key: str
) -> None:
    """``operations_router()``: the same answers under a NinjaAPI (whose ``auth`` it does not
    take: the endpoint's own principal check decides)."""
    first = client.post(
        "/ninja/exports",
        {},
        content_type="application/json",
        headers={"Idempotency-Key": key, "X-API-Key": "key-one"},
    )
    operation_id = first["Location"].rsplit("/", 1)[1]
    ninja = f"/ninja-status/operations/{operation_id}"
    scope = {"OPERATION_SCOPE_FUNCTION": "tests.testapp.operations_views.ninja_operation_scope"}
    with override_settings(IDEMPOTENCY=scope):
        mine = status(client, ninja, headers={"X-API-Key": "key-one"})
        view = status(client, first["Location"], headers={"X-API-Key": "key-one"})
        assert mine.status_code == view.status_code == 200
        assert mine.content == view.content
        assert json.loads(mine.content) == {"id": operation_id, "state": "running"}
        assert mine["Retry-After"] == "1"
        assert status(client, ninja, headers={"X-API-Key": "key-two"}).status_code == 404
        unknown = status(client, "/ninja-status/operations/1.nope", headers={"X-API-Key": "k"})
        assert unknown.status_code == 404
        assert unknown["Content-Type"] == "application/problem+json"


def test_in_progress_accepted_answers_202_with_the_status_url(
    post: Post, client: Client, key: str
) -> None:
    claim = hold_key(key, "POST", "/export/", {"rows": 3}, content_type="application/json")
    duplicate = post("/export/", {"rows": 3}, key=key)
    assert duplicate.status_code == 202
    assert duplicate["Location"] == claim.operation_url
    assert duplicate["Retry-After"] == "1"
    assert json.loads(duplicate.content) == {"id": claim.operation_id, "state": "running"}
    assert executions("export") == 0
    assert IdempotencyKey.objects.get().status == IdempotencyKey.Status.PROCESSING


def test_an_async_view_with_accepted(post: Post, client: Client, key: str) -> None:
    first = start(post, key, "/async-export/")
    assert json.loads(status(client, first["Location"]).content)["state"] == "running"
    IdempotencyKey.objects.update(status=IdempotencyKey.Status.PROCESSING)  # as if running
    duplicate = post("/async-export/", {"rows": 3}, key=key)
    assert duplicate.status_code == 202
    assert duplicate["Location"] == first["Location"]
    assert executions("async-export") == 1


def test_a_function_with_accepted_raises_in_progress(key: str) -> None:
    from django_idempotency import IdempotencyInProgress, idempotent_function

    @idempotent_function(key="key", in_progress="accepted")
    def work(key: str) -> int:
        return 1

    hold_key(key, work, key)
    with pytest.raises(IdempotencyInProgress):
        work(key)


def test_in_progress_conflict_is_still_409(post: Post, key: str) -> None:
    hold_key(key, "POST", "/conflicting/", {"rows": 3}, content_type="application/json")
    assert post("/conflicting/", {"rows": 3}, key=key).status_code == 409


def test_in_progress_accepted_as_a_setting(post: Post, key: str) -> None:
    hold_key(key, "POST", "/conflicting/", {"rows": 3}, content_type="application/json")
    with override_settings(IDEMPOTENCY={"IN_PROGRESS": "accepted"}):
        assert post("/conflicting/", {"rows": 3}, key=key).status_code == 202


def test_drf_mixin_in_progress_accepted(client: Client, key: str) -> None:
    alice = User.objects.create_user("alice")
    token = Token.objects.create(user=alice)
    headers = {"Idempotency-Key": key, "Authorization": f"Token {token.key}"}
    hold_key(key, "POST", "/drf-export/", {}, content_type="application/json", user=alice)
    duplicate = client.post("/drf-export/", {}, content_type="application/json", headers=headers)
    assert duplicate.status_code == 202
    assert duplicate["Location"].startswith("/idempotency/operations/")


def test_ninja_in_progress_accepted(client: Client, key: str) -> None:
    headers = {"Idempotency-Key": key, "X-API-Key": "key-one"}
    first = client.post("/ninja/exports", {}, content_type="application/json", headers=headers)
    IdempotencyKey.objects.update(status=IdempotencyKey.Status.PROCESSING)  # as if running
    duplicate = client.post("/ninja/exports", {}, content_type="application/json", headers=headers)
    assert duplicate.status_code == 202
    assert duplicate["Location"] == first["Location"]


@pytest.mark.urls("tests.urls")
def test_accepted_without_the_status_urls_is_refused_by_a_check() -> None:
    from django_idempotency._ops.checks import check_views

    assert not [error for error in check_views() if error.id == "django_idempotency.E071"]
    with override_settings(IDEMPOTENCY={"IN_PROGRESS": "accepted"}):
        errors = [error for error in check_views() if error.id == "django_idempotency.E071"]
    assert len(errors) == 1
    assert "IDEMPOTENCY['IN_PROGRESS']" in errors[0].msg
    assert "django_idempotency.urls" in errors[0].hint


def test_a_view_with_accepted_and_the_status_urls_passes_the_check() -> None:
    from django_idempotency._ops.checks import check_views

    assert not [error for error in check_views() if error.id == "django_idempotency.E071"]


@pytest.mark.urls("tests.operations_urls_missing")
def test_a_view_with_accepted_without_the_status_urls_is_named() -> None:
    from django_idempotency._ops.checks import check_views

    errors = [error for error in check_views() if error.id == "django_idempotency.E071"]
    assert len(errors) == 1
    assert "operations_views.export" in errors[0].msg
    assert "DrfExport" in errors[0].msg and "ninja_export" in errors[0].msg
    assert "conflicting" not in errors[0].msg


@pytest.mark.urls("tests.urls")
def test_operation_url_without_the_status_urls_says_what_to_do(key: str) -> None:
    from django.core.exceptions import ImproperlyConfigured

    claim = hold_key(key, "POST", "/create/", {}, content_type="application/json")
    assert claim.operation_id.partition(".")[0] in (str(claim.pk), named_on_redis(claim))
    with pytest.raises(ImproperlyConfigured, match=r"django_idempotency\.urls"):
        assert claim.operation_url


def named_on_redis(claim: Any) -> str | None:
    """A Redis claim's operation name (``r<store>-<oid>``), ``None`` on the database."""
    from django_idempotency._store import using
    from django_idempotency._store.redis.names import name

    store: Any = using(claim.alias)
    handles = getattr(store, "_handles", None)
    oid = None if handles is None else handles.oids.get(claim.pk)
    return None if oid is None else name(claim.alias, oid)


@pytest.mark.parametrize("value", ["no.such.function", 3, "django.utils.timezone.now"])
def test_operation_scope_function_is_checked(value: object) -> None:
    from django_idempotency._ops.checks import check_settings

    with override_settings(IDEMPOTENCY={"OPERATION_SCOPE_FUNCTION": value}):
        ids = [error.id for error in check_settings()]
    assert "django_idempotency.E070" in ids


def test_the_admin_shows_the_operation(post: Post, key: str) -> None:
    admin = Client()
    admin.force_login(User.objects.create_superuser("admin", "admin@example.com", None))
    operation_id = operation_of(start(post, key))
    page = f"/admin/django_idempotency/idempotencykey/{IdempotencyKey.objects.get().pk}/change/"
    with override_settings(ROOT_URLCONF="tests.urls"):
        running = admin.get(page).content.decode()
        complete_operation(operation_id, JsonResponse({"file": "final-export.csv"}, status=201))
        finished = admin.get(page).content.decode()
    assert operation_id in running and "running" in running
    assert "final-export.csv" not in running
    assert "succeeded" in finished and "final-export.csv" in finished


def test_cleanup_removes_an_operation_with_its_record(post: Post, key: str) -> None:
    from django.core.management import call_command

    operation_id = operation_of(start(post, key))
    IdempotencyKey.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    call_command("idempotency_cleanup", verbosity=0)
    assert not IdempotencyKey.objects.exists()
    with pytest.raises(OperationError) as refused:
        complete_operation(operation_id, status=201, data={})
    assert refused.value.reason == "unknown"


def test_a_functions_record_is_a_finished_operation_without_a_response(client: Client) -> None:
    from django_idempotency import idempotent_function
    from django_idempotency._call.operations import make_id, status_url

    @idempotent_function(key="order")
    def work(order: int) -> int:
        return order

    work(7)
    record = IdempotencyKey.objects.get()
    url = status_url(make_id(record.pk, record.scope, record.key_hash, record.created_at))
    assert status(client, url).status_code == 404  # a function's scope is no request's
    scope = {"OPERATION_SCOPE_FUNCTION": lambda request: record.scope}
    with override_settings(IDEMPOTENCY=scope):
        shown = json.loads(status(client, url).content)
    assert shown["state"] == "succeeded"
    assert shown["response"] is None


def test_an_expired_key_used_again_is_a_new_operation(post: Post, client: Client, key: str) -> None:
    first = start(post, key)
    old = operation_of(first)
    IdempotencyKey.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    second = start(post, key)
    new = operation_of(second)
    assert new != old  # the row may be the same (PostgreSQL reuses it), its life is not
    assert status(client, first["Location"]).status_code == 404
    with pytest.raises(OperationError) as refused:
        complete_operation(old, status=201, data={"life": 1})
    assert refused.value.reason == "unknown"
    complete_operation(new, status=201, data={"life": 2})
    assert json.loads(post("/export/", {"rows": 3}, key=key).content) == {"life": 2}
    assert executions("export") == 2


def test_the_claim_reads_the_records_life_once(post: Post, key: str) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_idempotency._call.operations import make_id

    claim = hold_key(key, "POST", "/export/", {"rows": 3}, content_type="application/json")
    with CaptureQueriesContext(connection) as queries:
        operation_id = claim.operation_id
    with CaptureQueriesContext(connection) as again:
        assert claim.operation_id == operation_id
        assert claim.operation_url.endswith(operation_id)
    # None when the claim knew the life (a record it inserted, or PostgreSQL's claim function's
    # row): what it knew is what the record keeps, as the status endpoint reads it.
    assert len(queries) <= 1 and len(again) == 0
    record = IdempotencyKey.objects.get(pk=claim.pk)
    assert operation_id == make_id(record.pk, record.scope, record.key_hash, record.created_at)
