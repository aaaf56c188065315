"""Recovery points, derived keys, fencing of late owners, and the signals."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.dispatch import Signal
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory
from django.utils import timezone

import django_idempotency
import django_idempotency as signals
from django_idempotency import Claim, IdempotencyKey, LockLost, idempotent
from django_idempotency._store.rows import prep
from tests.conftest import executions

pytestmark = pytest.mark.django_db

Post = Callable[..., Any]
LOCK_TIMEOUT = timedelta(seconds=60)
View = Callable[[HttpRequest], HttpResponse]


def protected(body: Callable[[Claim], HttpResponse | None]) -> View:
    """A view protected as in production, running ``body`` with its claim (a 201 if it returns
    ``None``); called directly, as the test client would through the URLconf."""

    @idempotent(lock_timeout=LOCK_TIMEOUT)
    def view(request: HttpRequest) -> HttpResponse:
        return body(request.idempotency) or HttpResponse(status=201)  # type: ignore[attr-defined]

    return view


def send(view: View, key: str) -> HttpResponse:
    return view(
        RequestFactory().post(
            "/create/", b"{}", content_type="application/json", headers={"Idempotency-Key": key}
        )
    )


def crash(claims: list[Claim]) -> Callable[[Claim], None]:
    """A body that keeps its claim and dies (a killed worker): its record stays ``processing``."""

    def body(claim: Claim) -> None:
        claims.append(claim)
        raise KeyboardInterrupt

    return body


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
    def body(claim: Claim) -> None:
        before = IdempotencyKey.objects.get().unlock_at
        claim.set_recovery_point("charged", {"charge": "ch_1"})
        row = IdempotencyKey.objects.get()
        assert (row.recovery_point, row.recovery_data) == ("charged", {"charge": "ch_1"})
        assert row.unlock_at is not None and before is not None and row.unlock_at >= before
        assert (claim.recovery_point, claim.recovery_data) == ("charged", {"charge": "ch_1"})
        seen.append(claim)

    seen: list[Claim] = []
    assert send(protected(body), key).status_code == 201
    assert len(seen) == 1


def test_takeover_sees_the_recovery_point_and_fences_the_old_owner(key: str) -> None:
    claims: list[Claim] = []

    def body(claim: Claim) -> None:
        claims.append(claim)
        if len(claims) == 1:  # the first attempt: a retry takes over while it still runs
            claim.set_recovery_point("reserved", {"n": 1})
            expire_lock()
            send(view, key)
            with pytest.raises(LockLost):
                claim.set_recovery_point("charged")

    view = protected(body)
    send(view, key)
    old, new = claims
    assert new.attempt == 2 and new.is_takeover
    assert (new.recovery_point, new.recovery_data) == ("reserved", {"n": 1})
    assert new.lock_token != old.lock_token
    assert IdempotencyKey.objects.get().recovery_point == "reserved"


def refund(charges: list[str], fail: list[str]) -> View:
    """docs/recovery.rst's view: charge, record "charged", ship; each name in ``fail`` is a
    step that raises once, after the charge ("ship", a 503 answer: "answer")."""

    def body(claim: Claim) -> HttpResponse:
        if claim.recovery_point != "charged":
            charges.append(claim.derived_key("charge"))
            claim.set_recovery_point("charged", {"charge": len(charges)})
        if "ship" in fail:
            fail.remove("ship")
            raise RuntimeError("the shipping service failed")
        if "answer" in fail:
            fail.remove("answer")
            return HttpResponse(status=503)
        return HttpResponse(f"shipped charge {claim.recovery_data['charge']}", status=201)

    return protected(body)


@pytest.mark.parametrize("step", ["ship", "answer"])
def test_an_attempt_that_fails_after_a_recovery_point_leaves_it_to_the_retry(
    key: str, step: str, received: dict[str, Any]
) -> None:
    """It raised (or answered a 5xx) after its charge: the record is kept at the point,
    unlocked, and the retry takes it over at once and resumes there; the charge ran once
    (issue 39). Released with its point, the retry charged again."""
    charges: list[str] = []
    view = refund(charges, [step])
    if step == "ship":
        with pytest.raises(RuntimeError):
            send(view, key)
    else:
        assert send(view, key).status_code == 503
    row = IdempotencyKey.objects.get()
    assert (row.status, row.recovery_point) == (IdempotencyKey.Status.PROCESSING, "charged")
    assert row.unlock_at is not None and row.unlock_at <= timezone.now()
    assert [sent["reason"] for sent in received["key_released"]] == [
        "exception" if step == "ship" else "status 503"
    ]
    retry = send(view, key)
    assert (retry.status_code, retry.content) == (201, b"shipped charge 1")
    assert len(charges) == 1
    row = IdempotencyKey.objects.get()
    assert (row.attempt, row.status) == (2, IdempotencyKey.Status.COMPLETED)


def test_an_attempt_without_a_recovery_point_is_still_released(key: str) -> None:
    view = protected(lambda claim: HttpResponse(status=503))
    assert send(view, key).status_code == 503
    assert not IdempotencyKey.objects.exists()


def test_a_view_whose_recovery_point_finds_its_record_taken_over_answers_409(key: str) -> None:
    """``LockLost`` out of the view is the app's: the key belongs to another attempt, whose
    result the client's retry gets (issue 39); not a ``500``. Nothing is released."""
    claims: list[Claim] = []

    def body(claim: Claim) -> HttpResponse:
        claims.append(claim)
        if len(claims) == 1:
            expire_lock()
            send(view, key)  # a retry takes over and finishes
            claim.set_recovery_point("charged")
        return HttpResponse(b"new owner", status=201)

    view = protected(body)
    answer = send(view, key)
    assert answer.status_code == 409
    assert answer["Content-Type"] == "application/problem+json"
    assert answer["Retry-After"]
    row = IdempotencyKey.objects.get()
    assert (row.attempt, bytes(row.response_body)) == (2, b"new owner")


def late_owner(key: str, claims: list[Claim]) -> View:
    """A view whose first attempt is taken over, and finished, by a retry before it returns:
    its result comes late."""

    def body(claim: Claim) -> HttpResponse:
        claims.append(claim)
        if len(claims) == 1:
            expire_lock()
            send(view, key)
            return HttpResponse(b"late owner", status=201)
        return HttpResponse(b"new owner", status=201)

    view = protected(body)
    return view


def test_late_owner_result_is_refused(key: str, received: dict[str, Any]) -> None:
    claims: list[Claim] = []
    late = send(late_owner(key, claims), key)
    assert late.content == b"late owner"  # its own client still gets its answer
    row = IdempotencyKey.objects.get()
    assert bytes(row.response_body) == b"new owner"
    assert row.status == IdempotencyKey.Status.COMPLETED
    old, new = claims
    (refused,) = received["late_result_refused"]
    assert refused["claim"] is old
    assert received["key_taken_over"][0]["claim"] is new


def test_late_owner_cannot_release_the_new_owners_record(key: str) -> None:
    claims: list[Claim] = []

    def body(claim: Claim) -> None:
        claims.append(claim)
        if len(claims) == 1:  # a retry takes over and dies: its record stays processing
            expire_lock()
            with pytest.raises(KeyboardInterrupt):
                send(view, key)
            raise RuntimeError("the first attempt fails after all")
        raise KeyboardInterrupt

    view = protected(body)
    with pytest.raises(RuntimeError):
        send(view, key)
    record = IdempotencyKey.objects.get()
    assert (record.attempt, record.status) == (2, IdempotencyKey.Status.PROCESSING)
    assert record.lock_token == claims[1].lock_token


def test_derived_key_is_stable_across_attempts_and_distinct_per_purpose(key: str) -> None:
    claims: list[Claim] = []
    view = protected(crash(claims))
    for sent in (key, key, key + "-other"):
        with pytest.raises(KeyboardInterrupt):
            send(view, sent)
        expire_lock()
    first, second, other = claims
    assert second.is_takeover
    assert first.derived_key("charge") == second.derived_key("charge")
    assert first.derived_key("charge") != first.derived_key("refund")
    assert other.derived_key("charge") != first.derived_key("charge")


def test_the_claim_imports_without_settings_or_models() -> None:
    """``from django_idempotency import Claim`` (a type hint's import) works before Django is
    set up, as the package's other names do: the claim reaches the store and the models only
    when it records progress."""
    code = (
        "import json, sys\n"
        "from django_idempotency import Claim\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith("
        "('django_idempotency.', 'django.db')))))\n"
    )
    env = {"PATH": "", "PYTHONPATH": str(Path(django_idempotency.__file__).parent.parent)}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [
        "django_idempotency._base",
        "django_idempotency._base.durations",
        "django_idempotency._base.errors",
        "django_idempotency._call",
        "django_idempotency._call.claim",
    ]


def test_request_idempotency_is_the_claim_or_falsy(key: str) -> None:
    from tests.testapp.views import create

    unprotected = RequestFactory().post("/create/")
    create(unprotected)
    assert not unprotected.idempotency  # type: ignore[attr-defined]
    assert not isinstance(unprotected.idempotency, Claim)  # type: ignore[attr-defined]
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
                assert prep(field.name, sent, connection) == expected, field.name
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

    seen: list[dict[str, Any]] = []

    def body(claim: Claim) -> HttpResponse:
        seen.append(stored())
        if len(seen) == 1:  # the first record's progress, gone when it expires
            claim.set_recovery_point("charged", {"charge": "ch_1"})
        return HttpResponse(b"done", status=201, headers={"ETag": "1"})

    view = protected(body)
    send(view, key)
    IdempotencyKey.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    row = stored()
    assert (row["status"], row["recovery_point"], row["response_status"]) == (
        "completed",
        "charged",
        201,
    )
    send(view, key)
    assert seen == [{**fresh, "response_status": None, "recovery_data": None}] * 2
    assert IdempotencyKey.objects.get().attempt == 1


def test_a_record_leaves_processing_without_an_unlock_at(post: Post, key: str) -> None:
    """The stale scan's plain index on unlock_at (models.py) counts on it."""
    assert post("/create/", {"a": 1}, key=key).status_code == 201
    record = IdempotencyKey.objects.get()
    assert (record.status, record.unlock_at) == (IdempotencyKey.Status.COMPLETED, None)


def test_the_claims_times_keep_their_microseconds(key: str) -> None:
    """DATETIME(6) on MySQL: a time truncated to the second would fall before ``before``."""
    records: list[IdempotencyKey] = []
    before = timezone.now()
    send(protected(lambda claim: records.append(IdempotencyKey.objects.get())), key)
    (record,) = records
    assert before <= record.created_at <= timezone.now()
    assert record.unlock_at == record.created_at + LOCK_TIMEOUT
