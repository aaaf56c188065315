"""Recovery points, derived keys, fencing of late owners, and the signals."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.dispatch import Signal
from django.http import HttpResponse
from django.test import RequestFactory
from django.utils import timezone

from django_idempotency import _http as protocol
from django_idempotency import _lifecycle as lifecycle
from django_idempotency import _store as store
from django_idempotency import signals
from django_idempotency._options import Options
from django_idempotency.claim import Claim
from django_idempotency.exceptions import LockLost
from django_idempotency.models import IdempotencyKey
from tests.conftest import executions

pytestmark = pytest.mark.django_db

Post = Callable[..., Any]
POLICY = Options.build(lock_timeout=60).resolve()


def claim_for(key: str, body: bytes = b"{}") -> tuple[Any, Claim]:
    request = RequestFactory().post(
        "/create/", body, content_type="application/json", headers={"Idempotency-Key": key}
    )
    adapter = protocol.HttpAdapter(request)
    decision = protocol.run_steps(lifecycle.begin(adapter, POLICY))
    assert isinstance(decision, Claim)
    return adapter.subject, decision


def expire_lock() -> None:
    IdempotencyKey.objects.update(unlock_at=timezone.now() - timedelta(seconds=1))


@pytest.fixture
def received() -> Iterator[dict[str, list[dict[str, Any]]]]:
    log: dict[str, list[dict[str, Any]]] = {}
    names = [name for name in dir(signals) if isinstance(getattr(signals, name), Signal)]

    def receiver_for(name: str) -> Callable[..., None]:
        def receive(sender: Any, **kwargs: Any) -> None:
            assert sender is IdempotencyKey
            log.setdefault(name, []).append(kwargs)

        return receive

    receivers = {name: receiver_for(name) for name in names}
    for name, receiver in receivers.items():
        getattr(signals, name).connect(receiver)
    yield log
    for name, receiver in receivers.items():
        getattr(signals, name).disconnect(receiver)


def test_recovery_point_is_committed_and_renews_the_lock(key: str) -> None:
    _, claim = claim_for(key)
    before = IdempotencyKey.objects.get().unlock_at
    claim.set_recovery_point("charged", {"charge": "ch_1"})
    row = IdempotencyKey.objects.get()
    assert (row.recovery_point, row.recovery_data) == ("charged", {"charge": "ch_1"})
    assert row.unlock_at is not None and before is not None and row.unlock_at >= before
    assert (claim.recovery_point, claim.recovery_data) == ("charged", {"charge": "ch_1"})


def test_takeover_sees_the_recovery_point_and_fences_the_old_owner(key: str) -> None:
    _, old = claim_for(key)
    old.set_recovery_point("reserved", {"n": 1})
    expire_lock()
    _, new = claim_for(key)
    assert new.attempt == 2 and new.is_takeover
    assert (new.recovery_point, new.recovery_data) == ("reserved", {"n": 1})
    assert new.lock_token != old.lock_token
    with pytest.raises(LockLost):
        old.set_recovery_point("charged")
    assert IdempotencyKey.objects.get().recovery_point == "reserved"


def test_late_owner_result_is_refused(key: str, received: dict[str, Any]) -> None:
    attempt, old = claim_for(key)
    expire_lock()
    new_attempt, new = claim_for(key)
    protocol.finish(new_attempt, new, HttpResponse(b"new owner", status=201), POLICY)
    late = protocol.finish(attempt, old, HttpResponse(b"late owner", status=201), POLICY)
    assert late.content == b"late owner"  # its own client still gets its answer
    row = IdempotencyKey.objects.get()
    assert bytes(row.response_body) == b"new owner"
    assert row.status == IdempotencyKey.Status.COMPLETED
    (refused,) = received["late_result_refused"]
    assert refused["claim"] is old
    assert received["key_taken_over"][0]["claim"] is new


def test_late_owner_cannot_release_the_new_owners_record(key: str) -> None:
    attempt, old = claim_for(key)
    expire_lock()
    claim_for(key)
    protocol.abort(attempt, old, POLICY, reason="exception")
    assert IdempotencyKey.objects.get().attempt == 2


def test_derived_key_is_stable_across_attempts_and_distinct_per_purpose(key: str) -> None:
    _, first = claim_for(key)
    expire_lock()
    _, second = claim_for(key)
    assert first.derived_key("charge") == second.derived_key("charge")
    assert first.derived_key("charge") != first.derived_key("refund")
    _, other = claim_for(key + "-other")
    assert other.derived_key("charge") != first.derived_key("charge")


def test_request_idempotency_is_the_claim_or_none(key: str) -> None:
    from tests.testapp.views import create

    unprotected = RequestFactory().post("/create/")
    create(unprotected)
    assert unprotected.idempotency is None  # type: ignore[attr-defined]
    protected = RequestFactory().post("/create/", headers={"Idempotency-Key": key})
    create(protected)
    assert isinstance(protected.idempotency, Claim)  # type: ignore[attr-defined]
    assert protected.idempotency.key == key  # type: ignore[attr-defined]


def test_signals(post: Post, key: str, received: dict[str, Any]) -> None:
    post("/create/", {"a": 1}, key=key)
    post("/create/", {"a": 1}, key=key)
    post("/create/", {"a": 2}, key=key)
    post("/status/500/", key="released")
    assert [len(received.get(name, [])) for name in ("key_claimed", "response_replayed")] == [
        2,
        1,
    ]
    assert received["fingerprint_mismatch"][0]["scope"] == "anonymous"
    assert received["key_released"][0]["reason"] == "status 500"
    assert executions() == 2


def test_the_store_prepares_its_values_as_the_fields_would() -> None:
    """The store's cut-short preparations (strings, datetimes) agree with ``get_db_prep_save``."""
    connection = connections["default"]

    now = timezone.now()
    samples: dict[str, list[Any]] = {
        "CharField": ["POST", ""],
        "TextField": ["/create/?a=1"],
        "DateTimeField": [now, now + timedelta(days=1)],
        "PositiveIntegerField": [1, 7],
        "PositiveSmallIntegerField": [201],
        "UUIDField": [uuid.uuid4()],
        "BigAutoField": [3],
    }
    checked = 0
    for field in IdempotencyKey._meta.concrete_fields:
        for value in samples.get(field.get_internal_type(), []):
            for sent in (value, None):
                expected = field.get_db_prep_save(sent, connection)
                assert store._prep(field.name, sent, connection) == expected, field.name
                checked += 1
    assert checked >= 30  # every column but the JSON and binary ones


def test_a_claim_writes_the_fields_defaults_for_a_new_or_an_expired_record(key: str) -> None:
    """The values every claim writes alike go as SQL literals: they must read back as the
    model's own defaults, on a new record and on an expired one taken over."""
    fresh = {"status": "processing", "response_headers": [], "recovery_point": "", "attempt": 1}
    for name, value in fresh.items():
        assert IdempotencyKey._meta.get_field(name).get_default() == value, name

    def stored() -> dict[str, Any]:
        return IdempotencyKey.objects.values(*fresh, "response_status", "recovery_data").get()

    request, claim = claim_for(key)
    assert stored() == {**fresh, "response_status": None, "recovery_data": None}

    claim.set_recovery_point("charged", {"charge": "ch_1"})
    protocol.finish(
        request, claim, HttpResponse(b"done", status=201, headers={"ETag": "1"}), POLICY
    )
    IdempotencyKey.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    row = stored()
    assert (row["status"], row["recovery_point"], row["response_status"]) == (
        "completed",
        "charged",
        201,
    )

    _, again = claim_for(key)
    assert again.attempt == 1
    assert stored() == {**fresh, "response_status": None, "recovery_data": None}


def test_a_record_leaves_processing_without_an_unlock_at(post: Post, key: str) -> None:
    """The stale scan's plain index on unlock_at (models.py) counts on it."""
    assert post("/create/", {"a": 1}, key=key).status_code == 201
    record = IdempotencyKey.objects.get()
    assert (record.status, record.unlock_at) == (IdempotencyKey.Status.COMPLETED, None)


def test_the_claims_times_keep_their_microseconds(key: str) -> None:
    """DATETIME(6) on MySQL: a time truncated to the second would fall before ``before``."""
    before = timezone.now()
    claim_for(key)
    after = timezone.now()
    record = IdempotencyKey.objects.get()
    assert before <= record.created_at <= after
    assert record.unlock_at == record.created_at + POLICY.lock_timeout
