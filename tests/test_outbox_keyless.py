"""A view that stages a message with ``request.idempotency.enqueue()`` and is sent no key (the
key optional), or runs unprotected otherwise (a method it does not protect, the app off):
``request.idempotency`` is falsy and its ``enqueue()`` sends after the view answered, never a
``500`` (issue 49: it was ``None``, and such a view answered ``500`` after creating the order).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client, override_settings
from django.urls import path
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import idempotent
from django_idempotency.models import OutboxMessage
from django_idempotency.rest_framework import IdempotencyMixin
from django_idempotency.testing import outbox_sent
from tests.testapp.models import Execution
from tests.testapp.outbox_tasks import receipt
from tests.testapp.shop import checkout

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(transaction=True)]


def _place(request: HttpRequest, status: int = 201) -> HttpResponse:
    order = Execution.objects.create(label="order")
    message = request.idempotency.enqueue(receipt, order.pk)  # type: ignore[attr-defined]
    return JsonResponse({"order": order.pk, "message": message}, status=status)


@idempotent(methods=["POST", "PUT"])
def place(request: HttpRequest) -> HttpResponse:
    if request.method == "PUT":
        return _place(request, status=int(request.headers.get("X-Status", "201")))
    if request.headers.get("X-Raise"):
        request.idempotency.enqueue(receipt, 0)  # type: ignore[attr-defined]
        raise RuntimeError("the view failed")
    return _place(request, status=int(request.headers.get("X-Status", "201")))


@idempotent
async def async_place(request: HttpRequest) -> HttpResponse:
    from asgiref.sync import sync_to_async

    return await sync_to_async(_place)(request)


@idempotent
def atomic_requests_place(request: HttpRequest) -> HttpResponse:
    with transaction.atomic():  # as ATOMIC_REQUESTS wraps a view: sent once it commits
        response = _place(request)
        assert receipt.sent == []
    return response


@idempotent
def truthiness(request: HttpRequest) -> HttpResponse:
    claim = request.idempotency  # type: ignore[attr-defined]
    try:
        getattr(claim, "operation_id")  # noqa: B009
    except AttributeError as exc:
        refusal = str(exc)
    else:
        refusal = ""
    return JsonResponse({"protected": bool(claim), "refusal": refusal})


class DrfPlace(IdempotencyMixin, APIView):
    def post(self, request: Request) -> Response:
        order = Execution.objects.create(label="order")
        return Response({"message": request.idempotency.enqueue(receipt, order.pk)}, status=201)  # type: ignore[attr-defined]


urlpatterns = [
    path("checkout/", checkout),
    path("place/", place),
    path("async/", async_place),
    path("atomic/", atomic_requests_place),
    path("truthiness/", truthiness),
    path("drf/", DrfPlace.as_view()),
]


@pytest.fixture(autouse=True)
def _fresh_recorder() -> Iterator[None]:
    receipt.reset()
    yield
    receipt.reset()


def sent() -> list[tuple[str, list[Any], dict[str, Any]]]:
    outbox_sent()  # the outbox's sender thread sends them, after the response
    return list(receipt.sent)


@pytest.mark.parametrize("url", ["/place/", "/async/", "/atomic/", "/drf/"])
def test_a_keyless_request_to_a_view_that_enqueues_sends_its_message(
    client: Client, url: str
) -> None:
    response = client.post(url)
    assert response.status_code == 201, response.content
    order = Execution.objects.get(label="order").pk
    assert sent() == [(response.json()["message"], [order], {})]
    assert OutboxMessage.objects.count() == 0  # no record to tie it to: sent, not kept


@pytest.mark.parametrize("store", ["database", pytest.param("redis", marks=pytest.mark.redis)])
def test_a_keyless_request_sends_at_once_whatever_the_fast_path_and_the_store(
    client: Client, store: str
) -> None:
    """``OUTBOX_FAST_PATH: False`` leaves a keyed request's messages to the relay; a request
    without a key has no record nor outbox row, so its message goes on the sender thread
    after the response all the same, on either store (docs: ``OUTBOX_FAST_PATH``)."""
    with override_settings(IDEMPOTENCY={"STORE": store, "OUTBOX_FAST_PATH": False}):
        response = client.post("/place/")
    assert response.status_code == 201, response.content
    assert sent() == [(response.json()["message"], [Execution.objects.get().pk], {})]
    assert OutboxMessage.objects.count() == 0


@pytest.mark.parametrize("status", [500, 503, 429, 408])
def test_a_keyless_request_answered_as_a_claim_would_be_released_sends_nothing(
    client: Client, status: int
) -> None:
    response = client.post("/place/", headers={"X-Status": str(status)})
    assert response.status_code == status
    assert sent() == []


def test_a_keyless_request_whose_view_raises_sends_nothing() -> None:
    client = Client(raise_request_exception=False)
    assert client.post("/place/", headers={"X-Raise": "1"}).status_code == 500
    assert sent() == []


def test_a_deterministic_4xx_without_a_key_sends_like_a_stored_one(client: Client) -> None:
    assert client.post("/place/", headers={"X-Status": "422"}).status_code == 422
    assert len(sent()) == 1


def test_unprotected_methods_and_the_app_off_send_too(client: Client) -> None:
    with override_settings(IDEMPOTENCY={"METHODS": ["PATCH"]}):
        assert client.put("/place/").status_code == 201
    with override_settings(IDEMPOTENCY={"ENABLED": False}):
        assert client.post("/place/", headers={"Idempotency-Key": "k" * 16}).status_code == 201
    assert len(sent()) == 2


def test_a_keyed_request_still_goes_through_the_outbox(client: Client) -> None:
    response = client.post("/place/", headers={"Idempotency-Key": "a-key-of-its-own"})
    assert response.status_code == 201
    assert OutboxMessage.objects.get().message_id == response.json()["message"]


def test_request_idempotency_is_falsy_and_says_what_it_lacks(client: Client) -> None:
    answer = client.post("/truthiness/").json()
    assert answer["protected"] is False
    assert "this request is not protected" in answer["refusal"]
    assert "exist only with a key" in answer["refusal"]
    keyed = client.post("/truthiness/", headers={"Idempotency-Key": "another-key-1234"}).json()
    assert keyed == {"protected": True, "refusal": ""}


def test_a_broker_that_refuses_loses_the_message_with_a_log_line_not_a_500(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    receipt.failing = 1
    response = client.post("/place/")
    assert response.status_code == 201
    assert sent() == []
    assert "could not be sent (ConnectionError: broker unreachable); it is lost" in caplog.text


def test_an_async_keyless_view_sends_off_the_event_loop() -> None:
    from django.test import AsyncClient

    async def post() -> int:
        response = await AsyncClient().post("/async/")
        return response.status_code

    assert asyncio.run(post()) == 201
    assert len(sent()) == 1


def test_a_view_written_for_its_claim_runs_unchanged_without_a_key(client: Client) -> None:
    """docs/testing.rst's ``checkout`` reads the recovery point, sets it and asks whether it
    resumed, as the ``is None`` checks of earlier docs would not stop it doing."""
    from tests.testapp.models import Order

    response = client.post(
        "/checkout/", {"sku": "x", "quantity": 1}, content_type="application/json"
    )
    assert response.status_code == 201
    assert response.json() == {"sku": "x", "resumed": False}
    assert Order.objects.count() == 1


@idempotent
def derived(request: HttpRequest) -> HttpResponse:
    claim = request.idempotency  # type: ignore[attr-defined]
    claim.set_recovery_point("charged", {"charge": 1})
    return JsonResponse(
        {
            "same": claim.derived_key("charge") == claim.derived_key("charge"),
            "key": claim.derived_key("charge"),
            "point": [claim.recovery_point, claim.recovery_data],
            "takeover": claim.is_takeover,
        }
    )


urlpatterns.append(path("derived/", derived))


def test_recovery_points_and_derived_keys_without_a_key(client: Client) -> None:
    first, second = (client.post("/derived/").json() for _ in range(2))
    assert first["same"] and first["point"] == ["charged", {"charge": 1}]
    assert first["takeover"] is False
    assert first["key"] != second["key"]  # no retry of a keyless request can be recognised
