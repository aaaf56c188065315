"""The tests docs/testing.rst shows, run as written (its literalinclude blocks are cut from this
file between the ``# docs:`` markers): a DRF viewset, a function view, a consumer, a django-ninja
operation, unittest."""

# docs: imports
import pytest
from django.test import Client, TestCase
from rest_framework.test import APIClient

from django_idempotency import IdempotencyInProgress
from django_idempotency.testing import (
    assert_replayed,
    concurrently,
    expire_key,
    hold_key,
    key_records,
    new_key,
    stale_key,
)
from tests.testapp.models import Order
from tests.testapp.shop import on_order_placed

# docs: end imports


# docs: viewset
ORDERS = "/api/shop/orders/"
ORDER = {"sku": "A1", "quantity": 2}


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice")


@pytest.fixture
def api(alice):
    client = APIClient()
    client.force_authenticate(alice)
    return client


@pytest.mark.django_db
def test_a_retry_is_replayed(api, idempotency_key):
    headers = {"Idempotency-Key": idempotency_key}
    first = api.post(ORDERS, ORDER, format="json", headers=headers)
    retry = api.post(ORDERS, ORDER, format="json", headers=headers)
    assert first.status_code == 201
    assert_replayed(retry, first)
    assert Order.objects.count() == 1


@pytest.mark.django_db
def test_a_retry_while_the_first_runs_is_409(api, alice, idempotency_key):
    hold_key(idempotency_key, "POST", ORDERS, ORDER, content_type="application/json", user=alice)
    response = api.post(ORDERS, ORDER, format="json", headers={"Idempotency-Key": idempotency_key})
    assert response.status_code == 409
    assert not Order.objects.exists()


@pytest.mark.django_db
def test_another_order_under_the_same_key_is_422(api, idempotency_key):
    headers = {"Idempotency-Key": idempotency_key}
    api.post(ORDERS, ORDER, format="json", headers=headers)
    response = api.post(ORDERS, {"sku": "B2", "quantity": 1}, format="json", headers=headers)
    assert response.status_code == 422
    assert key_records(idempotency_key).get().status == "completed"


@pytest.mark.django_db(transaction=True)  # each call has its own connection
def test_simultaneous_retries_create_one_order(alice, idempotency_key):
    def place_order():
        client = APIClient()  # one client per thread
        client.force_authenticate(alice)
        headers = {"Idempotency-Key": idempotency_key}
        return client.post(ORDERS, ORDER, format="json", headers=headers)

    responses = concurrently(place_order, 5)
    assert Order.objects.count() == 1
    assert {response.status_code for response in responses} <= {201, 409}


# docs: end viewset


# docs: view
CHECKOUT = "/shop/checkout/"
BASKET = {"sku": "A1", "quantity": 2}


@pytest.mark.django_db
def test_checkout_resumes_after_a_crash(client, idempotency_key):
    # The first attempt died after reserving the stock: its lock expired, its record stayed.
    stale_key(
        idempotency_key, "POST", CHECKOUT, BASKET,
        content_type="application/json", recovery_point="reserved",
    )  # fmt: skip
    headers = {"Idempotency-Key": idempotency_key}
    response = client.post(CHECKOUT, BASKET, content_type="application/json", headers=headers)
    assert response.json() == {"sku": "A1", "resumed": True}
    assert not Order.objects.exists()  # the stock was reserved once, by the first attempt


@pytest.mark.django_db
def test_checkout_runs_again_once_the_key_expired(client, idempotency_key):
    headers = {"Idempotency-Key": idempotency_key}
    client.post(CHECKOUT, BASKET, content_type="application/json", headers=headers)
    expire_key(idempotency_key, "POST", CHECKOUT, BASKET, content_type="application/json")
    again = client.post(CHECKOUT, BASKET, content_type="application/json", headers=headers)
    assert "Idempotent-Replayed" not in again
    assert Order.objects.count() == 2


# docs: end view


# docs: consumer
@pytest.mark.django_db
def test_a_redelivered_event_places_one_order(idempotency):
    event = {"event_id": idempotency.new_key(on_order_placed), "sku": "A1", "quantity": 2}
    first = on_order_placed(**event)
    assert on_order_placed(**event) == first
    assert Order.objects.count() == 1


@pytest.mark.django_db
def test_an_event_in_flight_is_redelivered_later(idempotency):
    event = {"event_id": idempotency.new_key(on_order_placed), "sku": "A1", "quantity": 2}
    idempotency.hold_key(event["event_id"], on_order_placed, **event)
    with pytest.raises(IdempotencyInProgress):
        on_order_placed(**event)


@pytest.mark.django_db(transaction=True)
def test_simultaneous_deliveries_place_one_order(idempotency):
    event = {"event_id": idempotency.new_key(on_order_placed), "sku": "A1", "quantity": 2}
    results = concurrently(lambda: on_order_placed(**event), 3, return_exceptions=True)
    assert Order.objects.count() == 1
    assert sum(isinstance(result, IdempotencyInProgress) for result in results) <= 2


# docs: end consumer


# docs: ninja
NINJA_ORDERS = "/shop/ninja/orders"
ALICE = {"X-API-Key": "alice-key"}


@pytest.mark.django_db
def test_a_ninja_retry_is_replayed(client):
    key = new_key(NINJA_ORDERS)
    headers = {**ALICE, "Idempotency-Key": key}
    first = client.post(NINJA_ORDERS, ORDER, content_type="application/json", headers=headers)
    retry = client.post(NINJA_ORDERS, ORDER, content_type="application/json", headers=headers)
    assert first.status_code == 201
    assert_replayed(retry, first)


@pytest.mark.django_db
def test_a_ninja_retry_while_the_first_runs_is_409(client, idempotency_key):
    # The same headers as the request: ninja's authentication names whose key it is.
    hold_key(
        idempotency_key, "POST", NINJA_ORDERS, ORDER,
        content_type="application/json", headers=ALICE,
    )  # fmt: skip
    headers = {**ALICE, "Idempotency-Key": idempotency_key}
    response = client.post(NINJA_ORDERS, ORDER, content_type="application/json", headers=headers)
    assert response.status_code == 409
    bob = {"X-API-Key": "bob-key", "Idempotency-Key": idempotency_key}  # his own keys
    response = client.post(NINJA_ORDERS, ORDER, content_type="application/json", headers=bob)
    assert response.status_code == 201


@pytest.mark.django_db
def test_a_ninja_order_resumes_after_its_lock_expired(client, idempotency_key):
    stale_key(
        idempotency_key, "POST", NINJA_ORDERS, ORDER,
        content_type="application/json", headers=ALICE,
    )  # fmt: skip
    headers = {**ALICE, "Idempotency-Key": idempotency_key}
    response = client.post(NINJA_ORDERS, ORDER, content_type="application/json", headers=headers)
    assert response.status_code == 201
    assert key_records(idempotency_key).get().attempt == 2


# docs: end ninja


# docs: unittest
class CheckoutTests(TestCase):
    def test_a_retry_is_replayed(self):
        key = new_key(CHECKOUT)
        headers = {"Idempotency-Key": key}
        first = self.client.post(CHECKOUT, BASKET, content_type="application/json", headers=headers)
        retry = self.client.post(CHECKOUT, BASKET, content_type="application/json", headers=headers)
        assert_replayed(retry, first)

    def test_a_retry_while_the_first_runs_is_409(self):
        key = new_key(CHECKOUT)
        hold_key(key, "POST", CHECKOUT, BASKET, content_type="application/json")
        response = Client().post(
            CHECKOUT, BASKET, content_type="application/json", headers={"Idempotency-Key": key}
        )
        self.assertEqual(response.status_code, 409)


# docs: end unittest
