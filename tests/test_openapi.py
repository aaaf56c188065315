"""drf-spectacular documents protected views with no work from the user.

The schema extension is registered by the app config (this module never imports
``_publish.openapi``); the schemas are generated with drf-spectacular's own generator.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings
from django.urls import path
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, viewsets
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter
from rest_framework.views import APIView

from django_idempotency import idempotent
from django_idempotency._base.keys import MAX_HEADER_LENGTH, key_format
from django_idempotency._publish.policy import key_pattern
from django_idempotency.rest_framework import IdempotencyMixin
from tests.testapp.models import Execution
from tests.testapp.policy_views import ORDER_KEY, tenant_scope

PROBLEM = "application/problem+json"
SPECTACULAR = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}


# @api_view and @extend_schema read DEFAULT_SCHEMA_CLASS when they run, at import: the views are
# defined as in a project whose settings name drf-spectacular's (the test settings don't).
_spectacular = override_settings(REST_FRAMEWORK=SPECTACULAR)
_spectacular.enable()


class Payment(serializers.Serializer):  # type: ignore[type-arg]
    amount = serializers.IntegerField()


class Receipt(serializers.Serializer):  # type: ignore[type-arg]
    id = serializers.IntegerField()


class RequiredView(IdempotencyMixin, APIView):
    serializer_class = Payment
    idempotency_required = True

    def post(self, request: Request) -> Response:
        return Response({}, status=201)

    def get(self, request: Request) -> Response:
        return Response({})


class PolicyView(IdempotencyMixin, APIView):
    """Take a payment."""

    serializer_class = Payment
    idempotency_required = True
    idempotency_ttl = 2 * 60 * 60

    @extend_schema(request=Payment, responses={201: Receipt, 404: None})
    def post(self, request: Request) -> Response:
        return Response({}, status=201)


class OptionalView(IdempotencyMixin, APIView):
    serializer_class = Payment
    idempotency_methods = ["POST"]

    def post(self, request: Request) -> Response:
        return Response({}, status=201)

    def patch(self, request: Request) -> Response:
        return Response({})


class AnnotatedView(IdempotencyMixin, APIView):
    idempotency_required = True

    @extend_schema(request=Payment, responses={201: Receipt, 400: Payment})
    def post(self, request: Request) -> Response:
        return Response({}, status=201)


class PlainView(APIView):
    serializer_class = Payment

    def post(self, request: Request) -> Response:
        return Response({}, status=201)


class PaymentViewSet(
    IdempotencyMixin, mixins.CreateModelMixin, mixins.ListModelMixin, viewsets.GenericViewSet
):
    idempotency_required = True
    serializer_class = Payment
    queryset = Execution.objects.all()


@extend_schema(request=Payment, responses={201: Receipt})
@api_view(["POST"])
@idempotent(required=True)
def decorated_required(request: Request) -> Response:
    return Response({}, status=201)


@extend_schema(request=Payment, responses={201: Receipt})
@api_view(["POST"])
@idempotent
def decorated_inside(request: Request) -> Response:
    return Response({}, status=201)


class TenantPolicyView(IdempotencyMixin, APIView):
    """Take a tenant's payment."""

    serializer_class = Payment
    idempotency_required = True
    idempotency_key_format = "uuid"
    idempotency_scope = tenant_scope

    @extend_schema(request=Payment, responses={201: Receipt})
    def post(self, request: Request) -> Response:
        return Response({}, status=201)


@extend_schema(request=Payment, responses={201: Receipt})
@api_view(["POST"])
@idempotent(key_format=ORDER_KEY, scope=tenant_scope)
def decorated_with_a_pattern(request: Request) -> Response:
    return Response({}, status=201)


_spectacular.disable()

router = SimpleRouter()
router.register("payments", PaymentViewSet, basename="payment")
urlpatterns = [
    path("required/", RequiredView.as_view()),
    path("policy/", PolicyView.as_view()),
    path("optional/", OptionalView.as_view()),
    path("annotated/", AnnotatedView.as_view()),
    path("plain/", PlainView.as_view()),
    path("outside/", decorated_required),
    path("inside/", decorated_inside),
    path("tenant-policy/", TenantPolicyView.as_view()),
    path("pattern/", decorated_with_a_pattern),
    *router.urls,
]


def schema() -> dict[str, Any]:
    with override_settings(REST_FRAMEWORK=SPECTACULAR):
        return SchemaGenerator(patterns=urlpatterns).get_schema(request=None, public=True)


def key_parameter(operation: dict[str, Any]) -> dict[str, Any] | None:
    found = [
        p for p in operation.get("parameters", []) if p["in"] == "header" and p["name"] == NAME
    ]
    assert len(found) <= 1
    return found[0] if found else None


NAME = "Idempotency-Key"


def assert_protected(operation: dict[str, Any], *, required: bool, mismatch: int = 422) -> None:
    parameter = key_parameter(operation)
    assert parameter is not None
    assert parameter["required"] is required
    assert parameter["schema"]["type"] == "string"
    assert parameter["schema"]["maxLength"] == MAX_HEADER_LENGTH
    assert parameter["schema"]["pattern"] == key_pattern(1)
    assert operation["x-idempotency"]["required"] is required
    responses = operation["responses"]
    for status in {"400", "409", str(mismatch), "500", "503"}:
        content = responses[status]["content"][PROBLEM]
        assert content["schema"] == {"$ref": "#/components/schemas/IdempotencyProblem"}
        assert responses[status]["description"]
    assert "Retry-After" in responses["409"]["headers"]
    (success,) = [response for code, response in responses.items() if code.startswith("2")]
    assert "Idempotent-Replayed" in success["headers"]


def assert_unprotected(operation: dict[str, Any]) -> None:
    assert key_parameter(operation) is None
    assert "409" not in operation["responses"]
    assert "422" not in operation["responses"]
    assert "x-idempotency" not in operation
    for response in operation["responses"].values():
        assert PROBLEM not in response.get("content", {})
        assert "Idempotent-Replayed" not in response.get("headers", {})


def test_mixin_view_with_a_required_key() -> None:
    paths = schema()["paths"]
    assert_protected(paths["/required/"]["post"], required=True)
    assert_unprotected(paths["/required/"]["get"])  # safe methods pass straight through


def test_mixin_view_with_an_optional_key_and_its_own_methods() -> None:
    paths = schema()["paths"]
    assert_protected(paths["/optional/"]["post"], required=False)
    assert "missing" not in paths["/optional/"]["post"]["responses"]["400"]["description"]
    assert_unprotected(paths["/optional/"]["patch"])  # idempotency_methods = ["POST"]


def test_viewset_create_is_protected_and_list_is_not() -> None:
    paths = schema()["paths"]
    assert_protected(paths["/payments/"]["post"], required=True)
    assert_unprotected(paths["/payments/"]["get"])


def test_unprotected_view_is_left_alone() -> None:
    assert_unprotected(schema()["paths"]["/plain/"]["post"])


@pytest.mark.parametrize(("url", "required"), [("/outside/", True), ("/inside/", False)])
def test_idempotent_api_view_functions(url: str, required: bool) -> None:
    assert_protected(schema()["paths"][url]["post"], required=required)


def test_extend_schema_keeps_both_its_responses_and_ours() -> None:
    operation = schema()["paths"]["/annotated/"]["post"]
    assert_protected(operation, required=True)
    responses = operation["responses"]
    assert responses["201"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Receipt"
    }
    # The view's own 400 (a validation error) and ours share the status, each its media type.
    assert responses["400"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Payment"
    }


def test_the_mixin_docstring_does_not_describe_the_view() -> None:
    description = schema()["paths"]["/required/"]["post"]["description"]
    assert description.startswith("**Idempotency.**")


def test_problem_component() -> None:
    component = schema()["components"]["schemas"]["IdempotencyProblem"]
    assert set(component["required"]) == {"type", "title", "status", "detail"}


@override_settings(IDEMPOTENCY={"REQUIRED": True, "HEADER": "X-Request-Key"})
def test_settings_decide_required_and_header_name() -> None:
    operation = schema()["paths"]["/optional/"]["post"]
    assert key_parameter(operation) is None
    (parameter,) = [p for p in operation["parameters"] if p["name"] == "X-Request-Key"]
    assert parameter["required"] is True


@override_settings(IDEMPOTENCY={"MISMATCH_STATUS": 400})
def test_mismatch_status_400_shares_the_400_response() -> None:
    operation = schema()["paths"]["/required/"]["post"]
    assert_protected(operation, required=True, mismatch=400)
    assert "422" not in operation["responses"]
    assert "different request" in operation["responses"]["400"]["description"]


@override_settings(IDEMPOTENCY={"ENABLED": False})
def test_disabled_app_documents_nothing() -> None:
    assert_unprotected(schema()["paths"]["/required/"]["post"])


BASE = "https://api.example.com/docs/errors#"
REPLAYED = {
    "schema": {"type": "string", "enum": ["true"]},
    "description": "Present when this is the stored response of an earlier request with the "
    "same idempotency key, replayed.",
}


def problem_types(response: dict[str, Any]) -> set[str]:
    examples = response["content"][PROBLEM]["examples"]
    for slug, example in examples.items():
        assert example["value"]["type"] == BASE + slug
    return set(examples)


@override_settings(IDEMPOTENCY={"MIN_KEY_LENGTH": 16, "PROBLEM_TYPE_BASE": BASE})
def test_the_published_policy_of_a_protected_operation_field_by_field() -> None:
    operation = schema()["paths"]["/policy/"]["post"]

    # The key: required, and the format the server accepts (tests/test_published.py holds the
    # pattern to the parser).
    (parameter,) = [p for p in operation["parameters"] if p["in"] == "header"]
    assert parameter["name"] == NAME
    assert parameter["required"] is True
    assert parameter["schema"] == {
        "type": "string",
        "minLength": 16,
        "maxLength": 512,
        "pattern": key_pattern(16),
    }
    assert "16 to 255 printable ASCII characters" in parameter["description"]
    assert "Remembered for 2 hours" in parameter["description"]

    # The policy, for machines and for people.
    policy = operation["x-idempotency"]
    assert policy == {
        "header": NAME,
        "required": True,
        "keyFormat": "any",
        "keySchema": parameter["schema"],
        "bareKeys": True,
        "ttl": 7200,
        "scope": "Each authenticated user has their own keys; anonymous requests share one scope.",
        "methods": ["PATCH", "POST"],
        "inProgress": "conflict",
        "mismatchStatus": 422,
        "notStored": ["408", "429", "5XX"],
        "replayedHeader": "Idempotent-Replayed",
        "specification": "https://datatracker.ietf.org/doc/draft-ietf-httpapi-idempotency-key-header/",
    }
    description = operation["description"]
    assert description.startswith("Take a payment.\n\n**Idempotency.** This operation requires")
    assert "remembered for 2 hours, and scoped: each authenticated user" in description
    assert "refused (422)" in description
    assert "Responses 408, 429, 5XX are not remembered" in description

    responses = operation["responses"]
    assert sorted(responses) == ["201", "400", "404", "409", "413", "422", "500", "503"]
    # The view's own responses are stored and replayed, its 404 as much as its 201.
    assert responses["201"]["headers"] == {"Idempotent-Replayed": REPLAYED}
    assert responses["404"]["headers"] == {"Idempotent-Replayed": REPLAYED}
    # 400: DRF's validation errors (stored, replayed) next to the key's problems (not stored).
    bad = responses["400"]
    assert set(bad["content"]) == {"application/json", PROBLEM}
    assert bad["content"]["application/json"] == {"schema": {}}
    assert bad["headers"] == {"Idempotent-Replayed": REPLAYED}
    assert problem_types(bad) == {
        "missing-idempotency-key",
        "invalid-idempotency-key",
        "invalid-request-body",
    }
    assert "missing" in bad["description"] and "invalid" in bad["description"]
    assert "body could not be read" in bad["description"]
    # The app's own answers: problem details only, never replayed.
    conflict = responses["409"]
    assert set(conflict["content"]) == {PROBLEM}
    assert problem_types(conflict) == {"request-in-progress"}
    assert conflict["headers"] == {
        "Retry-After": {
            "schema": {"type": "integer", "minimum": 1},
            "description": "Seconds to wait before retrying.",
            "required": True,
        }
    }
    assert set(responses["422"]["content"]) == {PROBLEM}
    assert problem_types(responses["422"]) == {"idempotency-key-reuse"}
    assert "headers" not in responses["422"]
    assert problem_types(responses["500"]) == {"response-not-stored", "request-abandoned"}
    assert problem_types(responses["503"]) == {"idempotency-unavailable"}
    assert "unreachable" in responses["503"]["description"]
    assert responses["503"]["headers"] == conflict["headers"]  # issue 25: with Retry-After


@override_settings(IDEMPOTENCY={"MIN_KEY_LENGTH": 16, "BARE_KEYS": False})
def test_without_bare_keys_the_schema_publishes_only_the_quoted_spelling() -> None:
    paths = schema()["paths"]
    operation = paths["/policy/"]["post"]
    (parameter,) = [p for p in operation["parameters"] if p["in"] == "header"]
    assert parameter["schema"] == {
        "type": "string",
        "minLength": 18,  # the quotes and 16 characters
        "maxLength": 512,
        "pattern": key_pattern(16, bare=False),
    }
    assert "(quoted: a bare value is refused), 16 to 255" in parameter["description"]
    assert "or a bare value" not in parameter["description"]
    assert operation["x-idempotency"]["bareKeys"] is False
    assert operation["x-idempotency"]["keySchema"] == parameter["schema"]
    (uuid,) = [p for p in paths["/tenant-policy/"]["post"]["parameters"] if p["in"] == "header"]
    assert uuid["schema"]["pattern"] == key_pattern(16, key_format("uuid"), bare=False)


@override_settings(IDEMPOTENCY={"RETRYABLE_STATUSES": [404, 408, 429, *range(500, 600)]})
def test_a_released_status_is_not_documented_as_replayed() -> None:
    responses = schema()["paths"]["/policy/"]["post"]["responses"]
    assert "headers" not in responses["404"]
    assert "Idempotent-Replayed" in responses["201"]["headers"]
    assert "404, 408, 429, 5XX" in schema()["paths"]["/policy/"]["post"]["description"]


@override_settings(IDEMPOTENCY={"MIN_KEY_LENGTH": 16})
def test_the_published_policy_shows_a_views_own_key_format_and_scope() -> None:
    paths = schema()["paths"]
    operation = paths["/tenant-policy/"]["post"]
    (parameter,) = [p for p in operation["parameters"] if p["in"] == "header"]
    assert parameter["schema"] == {
        "type": "string",
        "minLength": 16,
        "maxLength": 512,
        "pattern": key_pattern(16, key_format("uuid")),
    }
    assert parameter["schema"]["pattern"] == (
        '^(?:"(?:[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"'
        "(?: *;(?:[ -~]*[!-~])?)?|(?:[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}"
        "-[0-9a-fA-F]{12}))$"
    )
    assert "the key must be a UUID (8-4-4-4-12 hexadecimal digits)" in parameter["description"]
    policy = operation["x-idempotency"]
    assert policy["keyFormat"] == "uuid"
    assert policy["keySchema"] == parameter["schema"]
    assert policy["scope"] == "Each tenant has its own keys."
    assert "scoped: each tenant has its own keys." in operation["description"]

    operation = paths["/pattern/"]["post"]
    (parameter,) = [p for p in operation["parameters"] if p["in"] == "header"]
    assert parameter["schema"]["pattern"] == (
        '^(?:"(?:order-[0-9]{1,10})"(?: *;(?:[ -~]*[!-~])?)?|(?:order-[0-9]{1,10}))$'
    )
    assert "regular expression order-[0-9]{1,10}" in parameter["description"]
    assert operation["x-idempotency"]["keyFormat"] == "pattern"
    assert operation["x-idempotency"]["scope"] == "Each tenant has its own keys."
    # Other views keep the settings' format and scope.
    assert paths["/policy/"]["post"]["x-idempotency"]["keyFormat"] == "any"
