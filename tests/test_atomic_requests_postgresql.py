"""Two-phase mode under ATOMIC_REQUESTS: the claim commits on its own alias before the view."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections
from django.db.models.signals import post_save
from django.test import Client, override_settings

from django_idempotency import IdempotencyKey
from django_idempotency._base.keys import hash_key
from tests.conftest import executions
from tests.testapp.models import Execution

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
            "/create/",
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
    """The view has written its row, in ATOMIC_REQUESTS' transaction, and is held there (a
    ``post_save`` receiver in its thread) until the duplicate has answered: the claim, committed
    on its own alias, is seen, and the view's row is not. With the view sleeping a fixed 1 s
    before its write, the row was not written yet when counted, and a duplicate a loaded
    machine sent later than 1 s replayed (or waited for the commit, unnoticed)."""
    key = str(uuid.uuid4())
    results: list[Any] = []
    written, answered = threading.Event(), threading.Event()

    def hold(**kwargs: Any) -> None:
        written.set()
        assert answered.wait(30), "the duplicate never answered"

    post_save.connect(hold, sender=Execution, dispatch_uid="held-view-transaction", weak=False)
    first = threading.Thread(target=post, args=(key, results))
    try:
        first.start()
        assert written.wait(30), "the view never wrote its row"
        claimed = IdempotencyKey.objects.using("idempotency").filter(key_hash=hash_key(key))
        assert claimed.exists(), "the claim is not committed"
        assert executions() == 0  # the view's own work is still uncommitted in its transaction
        started = time.monotonic()
        duplicate = post(key)
        elapsed = time.monotonic() - started
    finally:
        answered.set()
        first.join(timeout=30)
        post_save.disconnect(sender=Execution, dispatch_uid="held-view-transaction")
    assert duplicate.status_code == 409
    assert elapsed < 0.9  # answered at once, not after the first commits
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


@pytest.mark.redis
@pytest.mark.urls("tests.outbox_urls")
def test_a_redis_stores_message_leaves_once_the_views_own_transaction_commits(
    atomic_requests: None,
) -> None:
    """On the Redis store the result and its message are written by one script while the
    view's order is still in ATOMIC_REQUESTS' transaction: the fast path waits for that
    transaction's commit too, as on the database."""
    from django_idempotency._call import outbox
    from tests.conftest import flush_redis
    from tests.testapp.outbox_tasks import probe

    flush_redis()
    probe.reset()
    try:
        with override_settings(IDEMPOTENCY={"DATABASE_ALIAS": "idempotency", "STORE": "redis"}):
            response = post_to("/probed/", str(uuid.uuid4()))
        assert response.status_code == 201
        assert outbox.sender.settle()
        assert probe.committed == [True]
    finally:
        probe.reset()
