"""Ninja's OpenAPI schema shows each protected operation's policy, as drf-spectacular's does."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from django.test import override_settings
from drf_spectacular.plumbing import ComponentRegistry
from ninja import NinjaAPI, Router
from ninja.responses import NinjaJSONEncoder

from django_idempotency._conf.options import Options
from django_idempotency._publish import openapi as _openapi
from django_idempotency._publish.policy import key_schema
from django_idempotency.ninja import idempotent
from tests.testapp.ninja_api import api

PROBLEM = "application/problem+json"
REPLAYED = "Idempotent-Replayed"


def schema(of: NinjaAPI = api) -> dict[str, Any]:
    """The schema as ninja serves it (JSON: the statuses are strings)."""
    generated = of.get_openapi_schema(path_prefix="")
    return json.loads(json.dumps(generated, cls=NinjaJSONEncoder))  # type: ignore[no-any-return]


def operation(path: str, method: str = "post", of: NinjaAPI = api) -> dict[str, Any]:
    return schema(of)["paths"][path][method]  # type: ignore[no-any-return]


def key_parameters(op: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in op["parameters"] if p["in"] == "header" and p["name"] == "Idempotency-Key"]


def test_a_protected_operation_shows_the_key_header_with_its_pattern() -> None:
    (optional,) = key_parameters(operation("/charges"))
    assert optional["required"] is False
    assert optional["schema"] == key_schema(Options().resolve())
    (required,) = key_parameters(operation("/required"))
    assert required["required"] is True
    assert "[0-9a-fA-F]{8}-" in required["schema"]["pattern"]
    assert "Remembered for 2 minutes" in required["description"]


def test_the_problems_are_problem_json_and_the_replay_header_is_on_success() -> None:
    op = operation("/charges")
    responses = op["responses"]
    for status in ("400", "409", "422", "503"):
        assert PROBLEM in responses[status]["content"], status
    assert "Retry-After" in responses["409"]["headers"]
    assert responses["201"]["headers"][REPLAYED]["schema"] == {"type": "string", "enum": ["true"]}
    assert responses["201"]["content"]["application/json"]
    assert "headers" not in responses["503"] or REPLAYED not in responses["503"]["headers"]
    # Ninja's own 422 for an invalid request and 400 for a body it cannot parse, never stored.
    assert "application/json" in responses["422"]["content"]
    assert "application/json" in responses["400"]["content"]
    assert REPLAYED not in responses["422"].get("headers", {})
    assert REPLAYED not in responses["400"].get("headers", {})
    assert "application/json" not in operation("/dict")["responses"]["400"]["content"]
    assert op["x-idempotency"]["methods"] == ["POST"]
    assert "**Idempotency.**" in op["description"]


def test_it_mirrors_what_drf_spectacular_publishes() -> None:
    policy = Options().resolve()
    drf: dict[str, Any] = {"responses": {}}
    _openapi.document(drf, policy, ComponentRegistry())
    ninja = operation("/dict")
    assert key_parameters(ninja) == drf["parameters"]
    for status, response in drf["responses"].items():
        if PROBLEM in response.get("content", {}):
            ours = ninja["responses"][status]["content"][PROBLEM]
            assert ours["examples"] == response["content"][PROBLEM]["examples"], status
            assert ours["schema"] == _openapi.parts.PROBLEM_SCHEMA
    assert ninja["x-idempotency"] == {**drf["x-idempotency"], "methods": ["POST"]}


def test_each_operation_publishes_its_own_methods_and_scope() -> None:
    assert operation("/things/{thing_id}", "put")["x-idempotency"]["methods"] == ["PUT"]
    assert operation("/things/{thing_id}", "delete")["x-idempotency"]["methods"] == ["DELETE"]
    assert operation("/router/charges")["x-idempotency"]["inProgress"] == "wait"
    assert operation("/api-key")["x-idempotency"]["scope"].startswith(
        "Each principal the API authenticated"
    )
    assert operation("/charges")["x-idempotency"]["scope"].startswith("Each authenticated user")


def test_an_unprotected_operation_is_left_alone() -> None:
    op = operation("/things", "get")
    assert op["parameters"] == []
    assert "x-idempotency" not in op
    assert set(op["responses"]) == {"200"}


def test_the_schema_follows_the_settings_when_it_is_generated() -> None:
    with override_settings(IDEMPOTENCY={"REQUIRED": True, "TTL": 3600}):
        (parameter,) = key_parameters(operation("/charges"))
    assert parameter["required"] is True
    assert "Remembered for 1 hour" in parameter["description"]
    with override_settings(IDEMPOTENCY={"ENABLED": False}):
        assert "x-idempotency" not in operation("/charges")


def test_the_operation_s_own_openapi_extra_is_kept() -> None:
    own = NinjaAPI(urls_namespace=f"extra-{uuid.uuid4()}")
    router = Router()

    @router.post("/x", openapi_extra={"x-mine": 1, "responses": {409: {"description": "Mine."}}})
    @idempotent
    def made(request: Any) -> dict[str, int]:
        return {}

    own.add_router("/r", router)
    own.urls  # noqa: B018  # binds the router
    op = operation("/r/x", of=own)
    assert op["x-mine"] == 1
    assert op["responses"]["409"]["description"] == "Mine."
    assert PROBLEM in op["responses"]["409"]["content"]
    assert len(key_parameters(op)) == 1


@pytest.mark.parametrize("mounts", [1, 2])
def test_add_decorator_operations_are_documented(mounts: int) -> None:
    own = NinjaAPI(urls_namespace=f"decorated-{uuid.uuid4()}")
    router = Router()
    router.add_decorator(idempotent(required=True))

    @router.post("/x")
    def made(request: Any) -> dict[str, int]:
        return {}

    for mount in range(mounts):
        own.add_router(f"/m{mount}", router, url_name_prefix=f"m{mount}")
    own.urls  # noqa: B018
    for mount in range(mounts):
        (parameter,) = key_parameters(operation(f"/m{mount}/x", of=own))
        assert parameter["required"] is True
