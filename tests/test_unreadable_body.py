"""A body the fingerprint cannot read, sent with a key, is the app's own problem+json 400
(``invalid-request-body``), not Django's HTML 400; nothing is claimed and the view does not run
(issue 26 item 7)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client, override_settings

from django_idempotency import IdempotencyKey
from tests.conftest import executions, problem_slug

pytestmark = pytest.mark.django_db

VIEWS = pytest.mark.parametrize(
    "path",
    ["/create/", "/async/", "/class/", "/drf/", "/api/executions/"],
    ids=["function", "async", "class", "drf-apiview", "drf-viewset"],
)


def refused(response: Any, reason: str) -> None:
    assert response.status_code == 400, response.content
    assert problem_slug(response) == "invalid-request-body"
    assert response.json()["title"] == "Invalid request body"
    assert response.json()["detail"].startswith("The request body could not be read: ")
    assert reason in response.json()["detail"]
    assert executions() == 0
    assert not IdempotencyKey.objects.exists()


@VIEWS
def test_multipart_without_a_boundary(path: str, key: str) -> None:
    response = Client().post(
        path, b"amount=1", content_type="multipart/form-data", headers={"Idempotency-Key": key}
    )
    refused(response, "Invalid boundary in multipart: None.")


@VIEWS
def test_more_form_fields_than_django_allows(path: str, key: str) -> None:
    with override_settings(DATA_UPLOAD_MAX_NUMBER_FIELDS=2):
        response = Client().post(
            path, {"a": "1", "b": "2", "c": "3"}, headers={"Idempotency-Key": key}
        )
    refused(response, "DATA_UPLOAD_MAX_NUMBER_FIELDS")


def test_the_same_body_with_its_boundary_is_fingerprinted_as_usual(key: str) -> None:
    first = Client().post("/create/", {"amount": "1"}, headers={"Idempotency-Key": key})
    assert first.status_code == 201
    again = Client().post("/create/", {"amount": "1"}, headers={"Idempotency-Key": key})
    assert again["Idempotent-Replayed"] == "true"
    assert executions() == 1


def test_a_body_that_is_not_json_is_not_refused_but_fingerprinted_as_sent(key: str) -> None:
    """README's row said "a body the fingerprint cannot parse" is refused: only a body Django
    cannot read or parse is (above); malformed JSON runs the view, and its bytes are its
    fingerprint (the same bytes replay, other bytes are another request)."""
    from django.http import HttpRequest, JsonResponse
    from django.test import RequestFactory

    from django_idempotency import idempotent

    @idempotent
    def view(request: HttpRequest) -> JsonResponse:
        return JsonResponse({}, status=201)

    def post(body: bytes) -> Any:
        request = RequestFactory().post(
            "/o/", body, "application/json", headers={"Idempotency-Key": key}
        )
        return view(request)

    first, again, other = post(b"{not json"), post(b"{not json"), post(b"{not json!")
    assert (first.status_code, again["Idempotent-Replayed"]) == (201, "true")
    assert other.status_code == 422 and b"idempotency-key-reuse" in other.content
