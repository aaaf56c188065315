"""The OpenAPI of long-running operations (issue 43): drf-spectacular publishes the status
endpoint, and both generators the ``202`` of ``in_progress="accepted"``."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings
from drf_spectacular.generators import SchemaGenerator

from tests import operations_urls
from tests.test_openapi import SPECTACULAR
from tests.testapp import operations_views

pytestmark = pytest.mark.urls("tests.operations_urls")

STATUS_PATH = "/idempotency/operations/{operation_id}"


def drf_schema() -> dict[str, Any]:
    with override_settings(REST_FRAMEWORK=SPECTACULAR):
        generator = SchemaGenerator(patterns=operations_urls.urlpatterns)
        return generator.get_schema(request=None, public=True)  # type: ignore[no-any-return]


def test_drf_spectacular_publishes_the_status_endpoint() -> None:
    schema = drf_schema()
    operation = schema["paths"][STATUS_PATH]["get"]
    assert set(schema["paths"][STATUS_PATH]) == {"get"}
    assert operation["operationId"] == "idempotency_operation_status"
    assert [p["name"] for p in operation["parameters"]] == ["operation_id"]
    assert set(operation["responses"]) == {"200", "404", "503"}
    state = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert state["properties"]["state"]["enum"] == ["running", "stalled", "succeeded", "failed"]
    assert "Retry-After" in operation["responses"]["200"]["headers"]
    problem = operation["responses"]["404"]["content"]["application/problem+json"]["schema"]
    assert problem == {"$ref": "#/components/schemas/IdempotencyProblem"}


def test_drf_spectacular_publishes_the_list_endpoint() -> None:
    operation = drf_schema()["paths"]["/idempotency/operations/"]["get"]
    assert operation["operationId"] == "idempotency_operation_list"
    assert [p["name"] for p in operation["parameters"]] == ["limit", "before", "state"]
    assert set(operation["responses"]) == {"200", "400", "503"}
    page = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert page["required"] == ["operations", "next"]
    item = page["properties"]["operations"]["items"]
    assert item["properties"]["state"]["enum"] == ["running", "stalled", "succeeded", "failed"]


def test_drf_spectacular_publishes_the_202_of_accepted() -> None:
    responses = drf_schema()["paths"]["/drf-export/"]["post"]["responses"]
    accepted = responses["202"]
    assert accepted["headers"]["Location"]["required"] is True
    assert "Retry-After" in accepted["headers"]
    assert "still running" in accepted["description"]


def test_ninja_publishes_the_202_of_accepted() -> None:
    schema = operations_views.api.get_openapi_schema(path_prefix="")
    accepted = schema["paths"]["/exports"]["post"]["responses"][202]
    assert set(accepted["headers"]) >= {"Location", "Retry-After"}
    body = accepted["content"]["application/json"]["schema"]
    assert body["properties"]["state"]["enum"] == ["running", "stalled", "succeeded", "failed"]


def test_the_ninja_router_puts_the_status_endpoint_in_the_apis_schema() -> None:
    """docs/openapi.rst: ``operations_router()`` added to a NinjaAPI publishes the endpoint
    as drf-spectacular does, without the API's security."""
    schema = operations_views.status_api.get_openapi_schema(path_prefix="")
    operation = schema["paths"]["/operations/{operation_id}"]["get"]
    assert operation["operationId"] == "idempotency_operation_status"
    assert operation["tags"] == ["idempotency"]
    assert "security" not in operation
    assert [p["name"] for p in operation["parameters"]] == ["operation_id"]
    responses = {str(status): answer for status, answer in operation["responses"].items()}
    assert set(responses) == {"200", "404", "503"}
    state = responses["200"]["content"]["application/json"]["schema"]
    assert state["properties"]["state"]["enum"] == ["running", "stalled", "succeeded", "failed"]
    assert "Retry-After" in responses["200"]["headers"]
    problem = responses["404"]["content"]["application/problem+json"]["schema"]
    assert problem["properties"]["type"]["type"] == "string"
    listed = schema["paths"]["/operations/"]["get"]
    assert listed["operationId"] == "idempotency_operation_list"
    assert "security" not in listed
    assert [p["name"] for p in listed["parameters"]] == ["limit", "before", "state"]
    assert operations_views.api.get_openapi_schema(path_prefix="")["paths"].keys() == {"/exports"}


def _accepted_operations(settings: dict[str, Any]) -> set[str]:
    from tests import test_openapi

    with override_settings(REST_FRAMEWORK=SPECTACULAR, IDEMPOTENCY=settings):
        generator = SchemaGenerator(patterns=test_openapi.urlpatterns)
        schema = generator.get_schema(request=None, public=True)
    return {
        f"{method} {path}"
        for path, methods in schema["paths"].items()
        for method, operation in methods.items()
        if "Location" in operation["responses"].get("202", {}).get("headers", {})
    }


def test_the_in_progress_setting_decides_the_202() -> None:
    assert _accepted_operations({}) == set()
    accepted = _accepted_operations({"IN_PROGRESS": "accepted"})
    assert {"post /required/", "post /payments/", "post /outside/"} <= accepted
    assert not any(operation.startswith("get ") for operation in accepted)
