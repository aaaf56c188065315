"""Two-phase mode under ATOMIC_REQUESTS: the claim commits on its own alias before the view."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections
from django.test import Client, override_settings

from django_idempotency import IdempotencyKey
from django_idempotency._base.keys import hash_key
from tests.conftest import executions

pytestmark = [
    pytest.mark.server_db,
    pytest.mark.django_db(transaction=True, databases=["default", "idempotency"]),
]


@pytest.fixture
def atomic_requests() -> Iterator[None]:
    settings_dict = connections["default"].settings_dict
    settings_dict["ATOMIC_REQUESTS"] = True
    try:
        with override_settings(IDEMPOTENCY={"DATABASE_ALIAS": "idempotency"}):
            yield
    finally:
        settings_dict["ATOMIC_REQUESTS"] = False


def post_to(path: str, key: str) -> Any:
    return Client().post(
        path, {}, content_type="application/json", headers={"Idempotency-Key": key}
    )


def post(key: str, results: list[Any] | None = None) -> Any:
    try:
        response = Client().post(
            "/create/?sleep=1",
            {},
            content_type="application/json",
            headers={"Idempotency-Key": key},
        )
        if results is not None:
            results.append(response)
        return response
    finally:
        if results is not None:
            connections.close_all()


def test_claim_is_visible_while_the_view_transaction_is_open(atomic_requests: None) -> None:
    key = str(uuid.uuid4())
    results: list[Any] = []
    first = threading.Thread(target=post, args=(key, results))
    first.start()
    deadline = time.monotonic() + 5
    while not IdempotencyKey.objects.using("idempotency").filter(key_hash=hash_key(key)).exists():
        assert time.monotonic() < deadline, "the claim was never committed"
        time.sleep(0.02)
    assert executions() == 0  # the view's own work is still uncommitted in its transaction
    started = time.monotonic()
    duplicate = post(key)
    assert duplicate.status_code == 409
    assert time.monotonic() - started < 0.9  # answered at once, not after the first commits
    first.join(timeout=10)
    assert results[0].status_code == 201
    assert executions() == 1
    assert post(key)["Idempotent-Replayed"] == "true"


@pytest.mark.urls("tests.outbox_urls")
def test_a_message_leaves_once_the_views_own_transaction_commits(atomic_requests: None) -> None:
    """The result and its message commit on the records' alias while the view's order is
    still in ATOMIC_REQUESTS' transaction: handed to the broker then, a consumer looked for
    an order not committed yet (and failed, its message acknowledged: lost)."""
    from django_idempotency._call import outbox
    from tests.testapp.outbox_tasks import probe

    probe.reset()
    try:
        response = post_to("/probed/", str(uuid.uuid4()))
        assert response.status_code == 201
        assert outbox.sender.settle()
        assert probe.committed == [True]
    finally:
        probe.reset()
