"""Operations that end, and that say where they are (issue 49 item 3, SPEC 4c): a task's
failure (``fail_operation``), stuck operations in ``idempotency_recover``, ``idempotency_stats``
and the admin, an operation's progress, and the principal's list of operations."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client, override_settings
from django.utils import timezone
from rest_framework.authtoken.models import Token

from django_idempotency import (
    IdempotencyKey,
    OperationError,
    complete_operation,
    fail_operation,
    set_operation_progress,
)
from django_idempotency._ops.maintenance import OPERATION_STUCK_AFTER
from django_idempotency.testing import hold_key, stale_key
from tests.conftest import problem_slug

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls("tests.operations_urls")]

Post = Callable[..., Any]
LIST = "/idempotency/operations/"


def start(post: Post, key: str) -> tuple[str, str]:
    """An operation handed on: its ``202`` stored, its task to come. (id, status URL)"""
    response = post("/export/", {"rows": 3}, key=key)
    assert response.status_code == 202, response.content
    return json.loads(response.content)["operation"], response["Location"]


def shown(client: Client, url: str) -> dict[str, Any]:
    response = client.get(url)
    assert response.status_code == 200, response.content
    return json.loads(response.content)  # type: ignore[no-any-return]


def silent_for(operation_id: str, time: timedelta) -> None:
    """As if ``time`` had passed since the operation's last word (its 202, its progress)."""
    pk = int(operation_id.partition(".")[0])
    record = IdempotencyKey.objects.filter(pk=pk)
    assert record.update(updated_at=timezone.now() - time) == 1


def command(name: str, *args: str) -> str:
    out = StringIO()
    call_command(name, *args, stdout=out)
    return out.getvalue()


# fail_operation


def test_a_task_fails_its_operation_with_a_problem(post: Post, client: Client, key: str) -> None:
    operation_id, url = start(post, key)
    fail_operation(operation_id, "The export could not be made: no orders table.", status=503)
    state = shown(client, url)
    assert state["state"] == "failed"
    assert state["response"]["status"] == 503
    assert state["response"]["content_type"] == "application/problem+json"
    assert state["response"]["body"]["detail"] == "The export could not be made: no orders table."
    assert state["response"]["body"]["title"] == "Operation failed"
    assert state["response"]["body"]["type"].endswith("operation-failed")
    retry = post("/export/", {"rows": 3}, key=key)
    assert retry.status_code == 503
    assert retry["Idempotent-Replayed"] == "true"
    assert problem_slug(retry) == "operation-failed"
    with pytest.raises(OperationError) as refused:
        fail_operation(operation_id, "again")
    assert refused.value.reason == "completed"


def test_a_failure_is_a_4xx_or_5xx(post: Post, key: str) -> None:
    operation_id, _ = start(post, key)
    with pytest.raises(ValueError, match="4xx or 5xx"):
        fail_operation(operation_id, "fine", status=200)


# Stuck operations: idempotency_recover, idempotency_stats, the admin


@pytest.mark.database_store  # the table's updated_at (silent_for), its admin
def test_recover_lists_and_fails_stuck_operations(post: Post, client: Client, key: str) -> None:
    stuck_id, stuck_url = start(post, key)
    recent_id, _ = start(post, str(uuid.uuid4()))
    silent_for(stuck_id, timedelta(hours=3))
    listed = json.loads(
        command("idempotency_recover", "--operations", "--older-than", "1h", "--json")
    )
    assert [row["operation"] for row in listed] == [stuck_id]
    assert listed[0]["silent_seconds"] >= 3 * 3600 - 5
    # "Stuck" as idempotency_stats counts it (silent an hour) by default: a 2-second-old
    # operation was called stuck with --older-than's old default of 0.
    text = command("idempotency_recover", "--operations")
    assert "1 stuck operation." in text and stuck_id in text and recent_id not in text
    text = command("idempotency_recover", "--operations", "--older-than", "0")
    assert "2 silent operations." in text and stuck_id in text and recent_id in text
    dry = command(
        "idempotency_recover", "--operations", "--older-than", "1h", "--fail", "--dry-run"
    )
    assert "Would fail 1 stuck operation" in dry
    assert shown(client, stuck_url)["state"] == "running"
    done = command("idempotency_recover", "--operations", "--older-than", "1h", "--fail")
    assert "Failed 1 of 1 stuck operation." in done
    state = shown(client, stuck_url)
    assert state["state"] == "failed"
    assert state["response"]["body"]["type"].endswith("operation-failed")
    assert "marked as failed by an operator" in state["response"]["body"]["detail"]
    with pytest.raises(CommandError, match="--release does not apply"):
        command("idempotency_recover", "--operations", "--release")


@pytest.mark.database_store  # the table's updated_at (silent_for), its admin
def test_stats_count_and_warn_of_stuck_operations(post: Post, key: str) -> None:
    quiet = json.loads(command("idempotency_stats", "--json"))
    assert quiet["operations_running"] == 0 and quiet["warnings"] == []
    stuck_id, _ = start(post, key)
    start(post, str(uuid.uuid4()))
    fresh = json.loads(command("idempotency_stats", "--json"))
    assert fresh["operations_running"] == 2
    assert fresh["operations_stuck"] == 0
    assert fresh["warnings"] == []
    silent_for(stuck_id, OPERATION_STUCK_AFTER + timedelta(minutes=5))
    figures = json.loads(command("idempotency_stats", "--json"))
    assert figures["operations_running"] == 2
    assert figures["operations_stuck"] == 1
    assert figures["longest_operation_silence_seconds"] >= 3900 - 5
    assert len(figures["warnings"]) == 1
    assert "1 long-running operation had no final response" in figures["warnings"][0]
    assert "idempotency_recover --operations" in figures["warnings"][0]
    text = command("idempotency_stats")
    assert "Operations running:   2 (1 stuck, longest silent 65m)" in text


@pytest.mark.database_store  # the table's updated_at (silent_for), its admin
def test_the_admin_filters_records_by_operation_state(post: Post, key: str) -> None:
    admin = Client()
    admin.force_login(User.objects.create_superuser("admin", "admin@example.com", None))
    running_id, _ = start(post, key)
    failed_id, _ = start(post, str(uuid.uuid4()))
    fail_operation(failed_id, "no")
    done_id, _ = start(post, str(uuid.uuid4()))
    complete_operation(done_id, status=201, data={})
    dead = stale_key(
        str(uuid.uuid4()), "POST", "/export/", {"rows": 3}, content_type="application/json"
    )
    live = hold_key(
        str(uuid.uuid4()), "POST", "/export/", {"rows": 1}, content_type="application/json"
    )

    def listed(state: str) -> set[int]:
        with override_settings(ROOT_URLCONF="tests.urls"):
            page = admin.get(f"/admin/django_idempotency/idempotencykey/?operation={state}")
        assert page.status_code == 200
        return {record.pk for record in page.context["cl"].result_list}

    def pk(operation_id: str) -> int:
        return int(operation_id.partition(".")[0])

    assert listed("running") == {pk(running_id), live.pk}
    assert listed("stalled") == {dead.pk}
    assert listed("failed") == {pk(failed_id)}
    assert listed("succeeded") == {pk(done_id)}
    with override_settings(ROOT_URLCONF="tests.urls"):
        page = admin.get(f"/admin/django_idempotency/idempotencykey/{dead.pk}/change/")
    assert "stalled" in page.content.decode()


# Progress


@pytest.mark.database_store  # the table's updated_at (silent_for), its admin
def test_a_task_sets_its_operations_progress(post: Post, client: Client, key: str) -> None:
    operation_id, url = start(post, key)
    assert "progress" not in shown(client, url)
    set_operation_progress(operation_id, {"done": 40, "total": 100})
    assert shown(client, url) == {
        "id": operation_id,
        "state": "running",
        "progress": {"done": 40, "total": 100},
    }
    set_operation_progress(operation_id, "writing the file")
    assert shown(client, url)["progress"] == "writing the file"
    # Progress is a word from the task: the operation is not stuck.
    silent_for(operation_id, timedelta(hours=3))
    set_operation_progress(operation_id, {"done": 90, "total": 100})
    assert (
        json.loads(command("idempotency_recover", "--operations", "--older-than", "1h", "--json"))
        == []
    )
    complete_operation(operation_id, status=201, data={"file": "x.csv"})
    assert "progress" not in shown(client, url)
    with pytest.raises(OperationError) as refused:
        set_operation_progress(operation_id, {"done": 100})
    assert refused.value.reason == "completed"


def test_progress_is_bounded_and_json(post: Post, client: Client, key: str) -> None:
    operation_id, url = start(post, key)
    with pytest.raises(ValueError, match="at most 1024 bytes"):
        set_operation_progress(operation_id, "x" * 1100)
    with pytest.raises(ValueError, match="must be JSON"):
        set_operation_progress(operation_id, {"done": object()})
    for number in (float("nan"), float("inf")):  # no JSON: the database's column refused it
        with pytest.raises(ValueError, match="must be JSON"):
            set_operation_progress(operation_id, {"done": number})
    assert "progress" not in shown(client, url)


def test_progress_waits_for_the_202(key: str) -> None:
    claim = hold_key(key, "POST", "/export/", {"rows": 3}, content_type="application/json")
    with pytest.raises(OperationError) as refused:
        set_operation_progress(claim.operation_id, {"done": 1})
    assert refused.value.reason == "running"


# Operations on a Redis store


@pytest.mark.redis
def test_a_view_reading_its_operation_on_a_redis_store_runs_and_its_operation_completes(
    post: Post, client: Client, key: str
) -> None:
    """It was refused before its claim (a Redis record's id named nothing in the database):
    its id now names its Redis record, which the status endpoint and complete_operation()
    find (the suite's Redis server, db of IDEMPOTENCY_TEST_REDIS_STORE_URL)."""
    import os

    from tests.testapp.models import Execution

    with override_settings(IDEMPOTENCY={"STORE": os.environ["IDEMPOTENCY_TEST_REDIS_STORE_URL"]}):
        response = post("/started/", {"rows": 3}, key=key)
        assert response.status_code == 202, response.content
        operation_id = json.loads(response.content)["operation"]
        assert operation_id.startswith("r")
        assert shown(client, response["Location"])["state"] == "running"
        complete_operation(operation_id, status=201, data={"file": "x.csv"})
        assert shown(client, response["Location"])["response"]["status"] == 201
        assert post("/started/", {"rows": 3}, key=key).status_code == 201
    assert Execution.objects.count() == 1


# The principal's list


def test_the_list_shows_the_principals_own_operations(post: Post, client: Client) -> None:
    alice = User.objects.create_user("alice", password="pw")
    bob = User.objects.create_user("bob", password="pw")
    client.force_login(alice)
    mine = [start(post, str(uuid.uuid4()))[0] for _ in range(3)]
    set_operation_progress(mine[2], {"done": 1})
    complete_operation(mine[0], status=201, data={})
    client.force_login(bob)
    theirs, _ = start(post, str(uuid.uuid4()))
    client.force_login(alice)
    page = client.get(LIST)
    assert page.status_code == 200
    assert page["Cache-Control"] == "no-store"
    body = json.loads(page.content)
    assert [item["id"] for item in body["operations"]] == mine[::-1]  # newest first
    assert theirs not in page.content.decode()
    assert [item["state"] for item in body["operations"]] == ["running", "running", "succeeded"]
    assert body["operations"][0]["progress"] == {"done": 1}
    assert body["operations"][0]["url"] == f"{LIST}{mine[2]}"
    assert body["next"] is None
    running = json.loads(client.get(LIST, {"state": "running"}).content)
    assert [item["id"] for item in running["operations"]] == mine[:0:-1]
    client.logout()
    assert json.loads(client.get(LIST).content)["operations"] == []  # anonymous: none of theirs


def test_the_list_is_paginated_and_bounded(post: Post, client: Client) -> None:
    client.force_login(User.objects.create_user("alice"))
    ids = [start(post, str(uuid.uuid4()))[0] for _ in range(5)]
    seen: list[str] = []
    url: str | None = f"{LIST}?limit=2"
    pages = 0
    while url is not None:
        body = json.loads(client.get(url).content)
        assert len(body["operations"]) <= 2
        seen += [item["id"] for item in body["operations"]]
        url = body["next"]
        pages += 1
    assert seen == ids[::-1]
    assert pages == 3
    for query in ("limit=0", "limit=101", "limit=x", "before=-1", "state=sleeping"):
        refused = client.get(f"{LIST}?{query}")
        assert refused.status_code == 400, query
        assert problem_slug(refused) == "invalid-operation-query"
    assert client.post(LIST).status_code == 405


def test_the_list_never_shows_the_shared_anonymous_scope(post: Post, client: Client) -> None:
    """Every anonymous client shares one scope, whose operations only their unguessable ids
    guard: listed, any anonymous client (or a token user, anonymous to Django's middleware)
    would get every other's ids, and through them their final responses."""
    victim, url = start(post, str(uuid.uuid4()))
    for asking in (Client(), client):
        listed = asking.get(LIST)
        assert listed.status_code == 200
        assert json.loads(listed.content) == {"operations": [], "next": None}
    token = Token.objects.create(user=User.objects.create_user("tokened"))
    as_token = Client(headers={"Authorization": f"Token {token.key}"})
    assert json.loads(as_token.get(LIST).content)["operations"] == []
    assert shown(Client(), url)["id"] == victim  # the id, held, still reads it (docs say so)


def test_the_ninja_router_serves_the_list_as_the_view_does(post: Post, client: Client) -> None:
    client.force_login(User.objects.create_user("alice"))
    operation_id, _ = start(post, str(uuid.uuid4()))
    view = json.loads(client.get(LIST).content)
    routed = client.get("/ninja-status/operations/")
    assert routed.status_code == 200, routed.content
    assert json.loads(routed.content)["operations"][0]["id"] == operation_id
    assert [item["id"] for item in json.loads(routed.content)["operations"]] == [
        item["id"] for item in view["operations"]
    ]
