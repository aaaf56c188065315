"""``idempotent_function``: message handlers and tasks on the views' record and state machine.

Most cases run twice, on a sync and on an async function (``flavour``). Tests that are about
two-phase mode use ``transaction=True``: inside pytest-django's test transaction every call
runs as in atomic mode (the claim cannot commit on its own there), which is itself tested.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, transaction
from django.test import override_settings
from django.utils import timezone

from django_idempotency import (
    Claim,
    IdempotencyFailed,
    IdempotencyInProgress,
    IdempotencyKey,
    IdempotencyKeyMismatch,
    JSONSerializer,
    LockLost,
    idempotent_function,
    key_claimed,
)
from django_idempotency._store import sealing
from django_idempotency.testing import expire_key, stale_key
from tests.conftest import REDIS_STORE, executions, only_record, redis_records, stored
from tests.held import assert_held_off
from tests.testapp.models import Execution
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db

FLAVOURS = ["sync", "async"]


def protect(flavour: str, **options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``idempotent_function(**options)`` on ``work`` itself, or on an ``async def`` around it.

    The async version is driven with ``async_to_sync``, so both are called the same way.
    """

    def decorate(work: Callable[..., Any]) -> Callable[..., Any]:
        options.setdefault("name", f"{work.__module__}.{work.__qualname__}")
        if flavour == "sync":
            return idempotent_function(**options)(work)

        async def handler(*args: Any, **kwargs: Any) -> Any:
            return await sync_to_async(work)(*args, **kwargs)

        handler.__signature__ = inspect.signature(work)  # type: ignore[attr-defined]
        protected = async_to_sync(idempotent_function(**options)(handler))
        return functools.wraps(work)(lambda *args, **kwargs: protected(*args, **kwargs))

    return decorate


def record() -> IdempotencyKey:
    """The one record, on either store."""
    if REDIS_STORE:
        (found,) = redis_records()
        return found  # type: ignore[no-any-return]
    return only_record()


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_first_call_runs_and_stores_later_calls_return_it(flavour: str, key: str) -> None:
    @protect(flavour, key="message_id")
    def handle(message_id: str, amount: int) -> dict[str, Any]:
        execution = Execution.objects.create(label="handle", payload=str(amount))
        return {"id": execution.pk, "amount": amount}

    first = handle(key, 42)
    assert handle(key, 42) == first
    assert handle(message_id=key, amount=42) == first
    assert executions("handle") == 1
    row = record()
    assert row.status == IdempotencyKey.Status.COMPLETED
    assert (row.method, row.path) == ("CALL", f"{__name__}.{handle.__qualname__}")
    assert row.scope == row.path
    assert row.key_hash == key_hash(key)
    assert json.loads(bytes(row.response_body or b"")) == first
    # A result, not an HTTP response: no status, no headers (issue 40).
    assert (row.response_status, row.response_headers) == (None, [])
    assert row.unlock_at is None


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_result_stored_as_an_http_200_before_1_0_is_still_returned(
    flavour: str, key: str
) -> None:
    """Records of the former shape kept a function's result as a response: status 200 and
    the serializer's Content-Type. They are read as they are (issue 40)."""

    @protect(flavour, key="message_id")
    def handle(message_id: str) -> dict[str, Any]:
        execution = Execution.objects.create(label="handle")
        return {"id": execution.pk}

    handle(key)
    headers, body = sealing.seal(
        [["Content-Type", "application/json"]], b'{"stored": "before"}', None
    )
    IdempotencyKey.objects.update(response_status=200, response_headers=headers, response_body=body)

    assert handle(key) == {"stored": "before"}
    assert executions("handle") == 1


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_another_payload_under_a_used_key_raises_and_runs_nothing(flavour: str, key: str) -> None:
    @protect(flavour, key="message_id")
    def handle(message_id: str, amount: int) -> int:
        Execution.objects.create(label="handle")
        return amount

    assert handle(key, 1) == 1
    before = record()
    with pytest.raises(IdempotencyKeyMismatch, match="another payload"):
        handle(key, 2)
    assert executions("handle") == 1
    after = record()
    assert (after.request_hash, after.response_body, after.updated_at) == (
        before.request_hash,
        before.response_body,
        before.updated_at,
    )


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_exception_releases_the_key_and_propagates(flavour: str, key: str) -> None:
    fail = [True]

    @protect(flavour, key="message_id")
    def handle(message_id: str) -> str:
        Execution.objects.create(label="handle")
        if fail[0]:
            raise RuntimeError("downstream down")
        return "done"

    with pytest.raises(RuntimeError, match="downstream down"):
        handle(key)
    assert not bool(stored())
    fail[0] = False
    assert handle(key) == "done"
    assert handle(key) == "done"
    assert record().status == IdempotencyKey.Status.COMPLETED


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_two_phase_exception_keeps_effects_and_releases(flavour: str, key: str) -> None:
    @protect(flavour, key="message_id")
    def handle(message_id: str) -> None:
        Execution.objects.create(label="handle")
        raise RuntimeError("after the effect")

    for _ in range(2):
        with pytest.raises(RuntimeError):
            handle(key)
    assert executions("handle") == 2  # two-phase: the effect committed, the key was released
    assert not bool(stored())


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_call_while_in_flight_raises_in_progress(flavour: str, key: str) -> None:
    name = f"{__name__}.in-flight"
    seen: list[IdempotencyInProgress] = []

    @idempotent_function(key="message_id", name=name)
    def duplicate(message_id: str) -> str:
        raise AssertionError("a duplicate must not run")

    @protect(flavour, key="message_id", name=name, lock_timeout=60)
    def handle(message_id: str) -> str:
        # A redelivery while this call is in flight (sync: async_to_sync cannot nest).
        with pytest.raises(IdempotencyInProgress) as caught:
            duplicate(message_id)
        seen.append(caught.value)
        return "first"

    assert handle(key) == "first"
    assert seen[0].unlock_at is not None
    assert seen[0].unlock_at > timezone.now() + timedelta(seconds=50)
    assert duplicate(key) == "first"


@dataclass
class Money:
    amount: Decimal
    currency: str


class MoneySerializer:
    content_type = "application/json"

    def dumps(self, value: Money) -> bytes:
        return json.dumps({"amount": str(value.amount), "currency": value.currency}).encode()

    def loads(self, data: bytes) -> Money:
        document = json.loads(data)
        return Money(Decimal(document["amount"]), document["currency"])


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_custom_serializer_round_trips_the_result(flavour: str, key: str) -> None:
    @protect(flavour, key="message_id", serializer=MoneySerializer())
    def refund(message_id: str) -> Money:
        Execution.objects.create(label="refund")
        return Money(Decimal("12.30"), "EUR")

    first = refund(key)
    assert first == Money(Decimal("12.30"), "EUR")
    assert refund(key) == first
    assert executions("refund") == 1
    assert json.loads(bytes(record().response_body or b"")) == {
        "amount": "12.30",
        "currency": "EUR",
    }


def test_first_call_returns_what_replays_return(key: str) -> None:
    @idempotent_function(key="message_id")
    def handle(message_id: str) -> dict[Any, Any]:
        return {1: (2, 3)}

    assert handle(key) == {"1": [2, 3]}
    assert handle(key) == {"1": [2, 3]}


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_unserialisable_result_raises_and_releases(flavour: str, key: str) -> None:
    @protect(flavour, key="message_id")
    def handle(message_id: str) -> object:
        return object()

    with pytest.raises(TypeError, match="not JSON-serialisable"):
        handle(key)
    assert not bool(stored())


def test_encoder_serializer_stores_more_types(key: str) -> None:
    from django.core.serializers.json import DjangoJSONEncoder

    @idempotent_function(key="message_id", serializer=JSONSerializer(DjangoJSONEncoder))
    def handle(message_id: str) -> dict[str, Any]:
        return {"amount": Decimal("1.50"), "id": uuid.UUID(int=7)}

    assert handle(key) == {"amount": "1.50", "id": str(uuid.UUID(int=7))}


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_key_from_a_callable(flavour: str) -> None:
    @protect(flavour, key=lambda topic, partition, offset, value: f"{topic}-{partition}-{offset}")
    def consume(topic: str, partition: int, offset: int, value: str) -> str:
        Execution.objects.create(label="consume")
        return value

    assert consume("orders", 0, 17, "a") == "a"
    assert consume("orders", 0, 17, "a") == "a"
    assert consume("orders", 1, 17, "a") == "a"
    assert executions("consume") == 2
    assert set(IdempotencyKey.objects.values_list("key_hash", flat=True)) == {
        key_hash("orders-0-17"),
        key_hash("orders-1-17"),
    }


def test_key_argument_by_default_and_int_and_uuid_keys() -> None:
    @idempotent_function(key="event_id")
    def handle(event_id: Any = 5) -> str:
        Execution.objects.create(label="handle")
        return "ok"

    handle()
    handle(5)
    with pytest.raises(IdempotencyKeyMismatch):
        handle("5")  # the same key as 5, but another payload
    handle(uuid.UUID(int=1))
    assert executions("handle") == 2
    hashes = set(IdempotencyKey.objects.values_list("key_hash", flat=True))
    assert hashes == {key_hash("5"), key_hash(str(uuid.UUID(int=1)))}


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (None, ValueError, "without an idempotency key"),
        ("", ValueError, "without an idempotency key"),
        (1.5, TypeError, "must be a str, int or UUID"),
        (True, TypeError, "must be a str, int or UUID"),
    ],
)
def test_bad_key_values_raise_before_running(value: Any, error: type, message: str) -> None:
    @idempotent_function(key="event_id")
    def handle(event_id: Any) -> None:
        Execution.objects.create(label="handle")

    with pytest.raises(error, match=message):
        handle(value)
    assert executions() == 0
    assert not bool(stored())


def test_wrong_arguments_fail_as_the_call_would(key: str) -> None:
    @idempotent_function(key="event_id")
    def handle(event_id: str) -> None: ...

    with pytest.raises(TypeError, match="unexpected keyword argument"):
        handle(key, other=1)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"key": "missing"}, "names no parameter"),
        ({"key": "rest"}, "names no parameter"),
        ({"key": 3}, "key must be a parameter name or a callable"),
        ({"key": "event_id", "scope": 3}, "scope must be a string or a callable"),
        ({"key": "event_id", "payload": "body"}, "payload must be a callable"),
        ({"key": "event_id", "serializer": json}, "serializer needs dumps"),
        ({"key": "event_id", "ttl": 0}, "ttl must be positive"),
        ({"key": "event_id", "lock_timeout": "60"}, "lock_timeout must be a timedelta"),
        ({"key": "event_id", "in_progress": "queue"}, "in_progress must be one of"),
    ],
)
def test_bad_options_fail_at_decoration(options: dict[str, Any], message: str) -> None:
    def handle(event_id: str, **rest: Any) -> None: ...

    with pytest.raises(ImproperlyConfigured, match=message):
        idempotent_function(**options)(handle)


def test_atomic_needs_a_sync_function() -> None:
    async def handle(event_id: str) -> None: ...

    with pytest.raises(ImproperlyConfigured, match="atomic=True needs a sync function"):
        idempotent_function(key="event_id", atomic=True)(handle)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_scope_partitions_keys(flavour: str, key: str) -> None:
    @protect(flavour, key="event_id", scope=lambda tenant, event_id: f"tenant:{tenant}")
    def handle(tenant: int, event_id: str) -> int:
        Execution.objects.create(label=f"tenant-{tenant}")
        return tenant

    assert [handle(1, key), handle(2, key), handle(1, key)] == [1, 2, 1]
    assert (executions("tenant-1"), executions("tenant-2")) == (1, 1)
    name = f"{__name__}.{handle.__qualname__}"
    assert set(IdempotencyKey.objects.values_list("scope", flat=True)) == {
        f"{name}:tenant:1",
        f"{name}:tenant:2",
    }


def test_keys_are_per_function_unless_they_share_a_name(key: str) -> None:
    @idempotent_function(key="event_id")
    def first(event_id: str) -> str:
        return "first"

    @idempotent_function(key="event_id")
    def second(event_id: str) -> str:
        return "second"

    @idempotent_function(key="event_id", name="shared")
    def third(event_id: str) -> str:
        return "third"

    @idempotent_function(key="event_id", name="shared")
    def fourth(event_id: str) -> str:
        return "fourth"

    assert (first(key), second(key), third(key), fourth(key)) == (
        "first",
        "second",
        "third",
        "third",
    )


def test_long_scope_is_hashed(key: str) -> None:
    @idempotent_function(key="event_id", scope="t" * 300)
    def handle(event_id: str) -> None: ...

    handle(key)
    assert record().scope.startswith("sha256:") and len(record().scope) == 71


def test_scope_callable_must_return_a_string(key: str) -> None:
    @idempotent_function(key="event_id", scope=lambda event_id: 42)
    def handle(event_id: str) -> None: ...

    with pytest.raises(TypeError, match="scope\\(\\) must return a str"):
        handle(key)


def test_payload_callable_decides_what_must_match(key: str) -> None:
    @idempotent_function(key="message_id", payload=lambda message_id, body, receipt: body)
    def handle(message_id: str, body: dict[str, Any], receipt: str) -> int:
        Execution.objects.create(label="handle")
        return int(body["n"])

    assert handle(key, {"n": 1, "m": 2}, receipt="r1") == 1
    # Another receipt handle (as SQS gives each delivery) and another key order: the same call.
    assert handle(key, {"m": 2, "n": 1}, receipt="r2") == 1
    with pytest.raises(IdempotencyKeyMismatch):
        handle(key, {"n": 2}, receipt="r3")
    assert executions("handle") == 1


def test_unserialisable_arguments_need_a_payload(key: str) -> None:
    @idempotent_function(key="message_id")
    def handle(message_id: str, connection: object) -> None:
        Execution.objects.create(label="handle")

    with pytest.raises(TypeError, match="payload= a callable"):
        handle(key, object())
    assert executions() == 0


def test_method_payload_leaves_out_self(key: str) -> None:
    class Consumer:
        def __init__(self) -> None:
            self.seen = 0

        @idempotent_function(key="message_id", name="consumer.handle")
        def handle(self, message_id: str, body: str) -> str:
            self.seen += 1
            return body.upper()

    one, other = Consumer(), Consumer()
    assert one.handle(key, "hi") == "HI"
    assert other.handle(key, "hi") == "HI"
    assert (one.seen, other.seen) == (1, 0)


def test_ttl_and_lock_timeout_set_the_record_times(key: str) -> None:
    unlock_at: list[Any] = []

    @idempotent_function(key="event_id", ttl=timedelta(hours=2), lock_timeout=90)
    def handle(event_id: str) -> None:
        unlock_at.append(record().unlock_at)

    before = timezone.now()
    handle(key)
    after = timezone.now()
    row = record()
    assert before + timedelta(hours=2) <= row.expires_at <= after + timedelta(hours=2)
    assert before + timedelta(seconds=90) <= unlock_at[0] <= after + timedelta(seconds=90)


def test_an_expired_record_is_treated_as_absent(key: str) -> None:
    @idempotent_function(key="event_id", ttl=60)
    def handle(event_id: str) -> int:
        return Execution.objects.create(label="handle").pk

    first = handle(key)
    expire_key(key, handle, key)
    assert handle(key) != first
    assert executions("handle") == 2


def test_settings_give_the_defaults(key: str) -> None:
    @idempotent_function(key="event_id")
    def handle(event_id: str) -> None: ...

    with override_settings(IDEMPOTENCY={"TTL": 600}):
        before = timezone.now()
        handle(key)
    assert record().expires_at <= timezone.now() + timedelta(seconds=600)
    assert record().expires_at >= before + timedelta(seconds=600)


class Crash(BaseException):
    """Like a killed worker: not an ``Exception``, so the wrapper leaves the record as it is.

    Not ``KeyboardInterrupt``, which asyncio re-raises out of the event loop.
    """


def crash() -> None:
    raise Crash


@pytest.mark.django_db(transaction=True)  # two-phase: a crash leaves the record behind
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_takeover_resumes_from_the_recovery_point(flavour: str, key: str) -> None:
    claims: list[Claim] = []
    starts: list[tuple[str, Any]] = []

    @protect(flavour, key="order_id", lock_timeout=30)
    def fulfil(order_id: str, *, crash_after: str = "", idempotency: Claim) -> dict[str, Any]:
        claims.append(idempotency)
        starts.append((idempotency.recovery_point, idempotency.recovery_data))
        steps = ["reserve", "charge", "ship"]
        point = idempotency.recovery_point
        for step in steps[steps.index(point) + 1 if point else 0 :]:
            Execution.objects.create(label=f"step-{step}", payload=idempotency.derived_key(step))
            idempotency.set_recovery_point(step, {"step": step})
            if step == crash_after:
                crash()
        return {"attempt": idempotency.attempt, "charge_key": idempotency.derived_key("charge")}

    with pytest.raises(Crash):
        fulfil(key, crash_after="charge")
    assert record().status == IdempotencyKey.Status.PROCESSING
    assert record().recovery_point == "charge"
    with pytest.raises(IdempotencyInProgress):
        fulfil(key, crash_after="charge")  # the lock has not expired: the owner may be alive
    IdempotencyKey.objects.update(unlock_at=timezone.now() - timedelta(seconds=1))
    result = fulfil(key, crash_after="charge")
    assert result["attempt"] == 2
    assert claims[1].is_takeover
    assert starts == [("", None), ("charge", {"step": "charge"})]
    assert [executions(f"step-{step}") for step in ("reserve", "charge", "ship")] == [1, 1, 1]
    assert result["charge_key"] == claims[0].derived_key("charge")
    assert Execution.objects.get(label="step-charge").payload == result["charge_key"]
    with pytest.raises(LockLost):
        claims[0].set_recovery_point("ship")
    assert fulfil(key, crash_after="charge") == result


@pytest.mark.django_db(transaction=True)  # two-phase: a crash leaves the record behind
@pytest.mark.parametrize("crash_at", ["in its transaction", "after its transaction"])
def test_an_effect_and_its_recovery_point_commit_together(crash_at: str, key: str) -> None:
    """docs/consumers.rst's opening example: the invoice and the recovery point saying it exists
    commit in one transaction. A worker dying inside it leaves neither, one dying after it
    leaves both; either way the takeover invoices once (without the recovery point, a death
    after the invoice committed made a second one)."""
    crashes = [crash_at]

    @idempotent_function(key="order_id")
    def invoice_order(order_id: str, *, idempotency: Claim) -> dict[str, Any]:
        crashing = crashes.pop() if crashes else ""
        if idempotency.recovery_point == "":
            with transaction.atomic():
                invoice = Execution.objects.create(label="invoice")
                idempotency.set_recovery_point("invoiced", {"invoice": invoice.pk})
                if crashing == "in its transaction":
                    crash()
        if crashing == "after its transaction":
            crash()
        Execution.objects.create(label="email", payload=idempotency.derived_key("email"))
        return {"invoice": idempotency.recovery_data["invoice"]}

    with pytest.raises(Crash):
        invoice_order(key)
    left = record()
    committed = crash_at == "after its transaction"
    assert left.status == IdempotencyKey.Status.PROCESSING
    assert (left.recovery_point, executions("invoice")) == (
        ("invoiced", 1) if committed else ("", 0)
    )

    IdempotencyKey.objects.update(unlock_at=timezone.now() - timedelta(seconds=1))
    result = invoice_order(key)
    assert (executions("invoice"), executions("email")) == (1, 1)
    assert result == {"invoice": Execution.objects.get(label="invoice").pk}
    assert (record().attempt, record().status) == (2, IdempotencyKey.Status.COMPLETED)


def test_the_claim_parameter_is_hidden_from_callers(key: str) -> None:
    @idempotent_function(key="event_id")
    def handle(event_id: str, idempotency: Claim | None = None) -> str:
        assert idempotency is not None
        return idempotency.key

    assert list(inspect.signature(handle).parameters) == ["event_id"]
    assert handle(key) == key
    with pytest.raises(TypeError):
        handle(key, None)


def test_the_claim_parameter_must_not_take_positional_arguments() -> None:
    def handle(idempotency: Claim, event_id: str) -> None: ...

    with pytest.raises(ImproperlyConfigured, match="keyword-only"):
        idempotent_function(key="event_id")(handle)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_disabled_runs_every_call_with_no_claim(flavour: str, key: str) -> None:
    @protect(flavour, key="event_id")
    def handle(event_id: str, *, idempotency: Claim | None = None) -> bool:
        Execution.objects.create(label="handle")
        return idempotency is None

    with override_settings(IDEMPOTENCY={"ENABLED": False}):
        assert handle(key) and handle(key)
    assert executions("handle") == 2
    assert not bool(stored())


@pytest.mark.django_db(transaction=True)
def test_a_record_marked_failed_is_final(key: str) -> None:
    @idempotent_function(key="event_id", lock_timeout=30)
    def handle(event_id: str) -> None:
        crash()

    with pytest.raises(Crash):
        handle(key)
    IdempotencyKey.objects.update(
        status=IdempotencyKey.Status.FAILED, response_status=500, response_body=b"{}"
    )
    with pytest.raises(IdempotencyFailed, match="marked failed"):
        handle(key)


# Transactions and modes -----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True, databases=["default", "idempotency"])
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_two_phase_claim_commits_before_the_function_runs(flavour: str, key: str) -> None:
    seen: list[str] = []

    @protect(flavour, key="event_id")
    def handle(event_id: str) -> None:
        # Another connection to the same database sees the claim: it was committed.
        row = IdempotencyKey.objects.using("idempotency").get()
        seen.append(row.status)

    handle(key)
    assert seen == [IdempotencyKey.Status.PROCESSING]
    assert record().status == IdempotencyKey.Status.COMPLETED


@pytest.mark.django_db(transaction=True)
def test_atomic_mode_rolls_back_the_function_and_the_claim(key: str) -> None:
    fail = [True]

    @idempotent_function(key="event_id", atomic=True)
    def handle(event_id: str) -> int:
        pk = Execution.objects.create(label="handle").pk
        if fail[0]:
            raise RuntimeError("rolled back")
        return pk

    with pytest.raises(RuntimeError):
        handle(key)
    assert executions() == 0
    assert not bool(stored())
    fail[0] = False
    first = handle(key)
    assert handle(key) == first
    assert executions("handle") == 1
    assert record().status == IdempotencyKey.Status.COMPLETED


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("atomic", [False, True])
def test_inside_a_transaction_the_record_commits_with_it(atomic: bool, key: str) -> None:
    @idempotent_function(key="event_id", atomic=atomic)
    def handle(event_id: str) -> int:
        return Execution.objects.create(label="handle").pk

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        handle(key)
        assert bool(stored())
        raise Rollback
    assert not bool(stored())  # no "completed" for work that rolled back
    assert executions() == 0
    with transaction.atomic():
        first = handle(key)
    assert handle(key) == first
    assert executions("handle") == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("atomic", [False, True])
def test_inside_a_transaction_an_exception_rolls_back_to_a_savepoint(
    atomic: bool, key: str
) -> None:
    @idempotent_function(key="event_id", atomic=atomic)
    def handle(event_id: str) -> None:
        Execution.objects.create(label="handle")
        raise RuntimeError("failed")

    with transaction.atomic():
        Execution.objects.create(label="caller")
        with pytest.raises(RuntimeError):
            handle(key)
        # The caller's transaction is still usable, and the key is free again.
        assert not bool(stored())
        Execution.objects.create(label="caller")
    assert (executions("caller"), executions("handle")) == (2, 0)


@pytest.mark.django_db(transaction=True, databases=["default", "idempotency"])
def test_two_phase_inside_a_transaction_on_another_alias(key: str) -> None:
    """With DATABASE_ALIAS on its own connection, two-phase holds inside a transaction."""
    seen: list[bool] = []

    @idempotent_function(key="event_id")
    def handle(event_id: str) -> None:
        seen.append(connections["idempotency"].in_atomic_block)
        raise RuntimeError("after the claim")

    with override_settings(IDEMPOTENCY={"DATABASE_ALIAS": "idempotency"}):
        with pytest.raises(RuntimeError), transaction.atomic():
            handle(key)
        assert seen == [False]  # the claim was not in the caller's transaction
        assert not IdempotencyKey.objects.using("idempotency").exists()  # released on its own


@pytest.mark.django_db(transaction=True)
def test_atomic_mode_crash_leaves_no_record(key: str) -> None:
    @idempotent_function(key="event_id", atomic=True)
    def handle(event_id: str, *, fail: bool = False) -> int:
        Execution.objects.create(label="handle")
        if fail:
            crash()
        return 1

    with pytest.raises(Crash):
        handle(key, fail=True)
    assert not bool(stored())
    assert executions() == 0
    assert handle(key) == 1  # at once: no stale lock to wait for


@pytest.mark.django_db(transaction=True)
def test_late_result_of_an_overtaken_call_is_refused(key: str) -> None:
    name = f"{__name__}.late"

    @idempotent_function(key="event_id", name=name)
    def new_owner(event_id: str) -> str:
        return "new"

    @idempotent_function(key="event_id", name=name, lock_timeout=30)
    def slow_owner(event_id: str) -> str:
        IdempotencyKey.objects.update(unlock_at=timezone.now() - timedelta(seconds=1))
        assert new_owner(event_id) == "new"  # took the stale record over and stored its result
        return "old"

    assert slow_owner(key) == "old"  # the call ran, so it returns; its result is not stored
    row = record()
    assert (row.attempt, json.loads(bytes(row.response_body or b""))) == (2, "new")
    assert new_owner(key) == slow_owner(key) == "new"


def test_signals_fire_as_for_views_without_a_request(key: str) -> None:
    import django_idempotency as signals

    received: list[tuple[str, dict[str, Any]]] = []

    def on(name: str) -> Callable[..., None]:
        def receive(sender: Any, **kwargs: Any) -> None:
            received.append((name, kwargs))

        return receive

    receivers = {
        name: on(name) for name in ("key_claimed", "response_replayed", "fingerprint_mismatch")
    }
    for name, receiver in receivers.items():
        getattr(signals, name).connect(receiver)
    try:

        @idempotent_function(key="event_id")
        def handle(event_id: str, n: int) -> int:
            return n

        handle(key, 1)
        handle(key, 1)
        with pytest.raises(IdempotencyKeyMismatch):
            handle(key, 2)
    finally:
        for name, receiver in receivers.items():
            getattr(signals, name).disconnect(receiver)
    assert [name for name, _ in received] == list(receivers)
    assert all(kwargs["request"] is None for _, kwargs in received)
    assert all(kwargs["key_hash"] == key_hash(key) for _, kwargs in received)


# Renewal ---------------------------------------------------------------------------------------

#: The stalled owner's lock: its reply is held 3.4 s of it, so the first renewal, counted from
#: the reply, would come 0.4 s after the lock lapsed; counted from the claim, it is due at once
#: and has 1.1 s to land, room for a loaded CI machine's thread and store.
STALLED_LOCK = 4.5
HELD_REPLY = 3.4


@pytest.mark.django_db(transaction=True)  # two-phase: renewal is for committed claims
def test_the_first_renewal_counts_from_the_claim_not_from_its_reply(key: str) -> None:
    """The owner learns of its claim 3.4 s after sending it under a 4.5 s lock (a
    ``key_claimed`` receiver holds it, as a reply held by a slow network or an fsync would): its
    first renewal is due an interval after the claim was sent, so at once, not an interval after
    the reply. Duplicates sent every 0.1 s from 0.9 lock timeouts after the claim until the owner
    returns find the key held; with the first renewal counted from the reply (3.4 + 1.5 s, past
    the lock's 4.5 s) one took the key over and ran the function a second time. The renewal
    engine is one for sync and async calls: the sync one is enough."""
    held: list[float] = []

    def hold_the_reply(sender: Any, claim: Claim, **kwargs: Any) -> None:
        if claim.key == key and not held:
            held.append(time.monotonic())
            time.sleep(HELD_REPLY)

    @idempotent_function(
        key="event_id",
        payload=lambda event_id, *_, **__: event_id,
        lock_timeout=STALLED_LOCK,
    )
    def handle(event_id: str, seconds: float = 0.0) -> int:
        time.sleep(seconds)
        Execution.objects.create(label="handle")
        return 1

    key_claimed.connect(hold_the_reply, dispatch_uid="test-held-reply")
    try:
        duplicates = _duplicates_while(
            lambda: handle(key, 2.0), lambda: handle(key), after=0.9 * STALLED_LOCK
        )
    finally:
        key_claimed.disconnect(dispatch_uid="test-held-reply")
    assert duplicates[0] == 1
    assert_held_off(duplicates[1:], duplicates[0])
    assert executions("handle") == 1


def _closing(call: Callable[[], Any]) -> Any:
    try:
        return call()
    finally:
        connections.close_all()


@pytest.mark.django_db(transaction=True)
def test_a_run_renewed_past_its_ttl_is_neither_expired_nor_taken_over(key: str) -> None:
    """A 5 s run under a 3 s TTL and a 3 s lock, renewed every second: duplicates sent every
    0.1 s find it held, and a retry after it returned gets its result. With renewal moving the
    lock alone, the record expired at 3 s under its live owner (the database store took it over
    as expired, Redis deleted it), and the function ran twice. A renewal may come 2 s late
    before the lock lapses (the documented window): room for a loaded machine."""

    @idempotent_function(
        key="event_id",
        payload=lambda event_id, *_, **__: event_id,
        ttl=3.0,
        lock_timeout=3.0,
    )
    def handle(event_id: str, seconds: float = 0.0) -> int:
        time.sleep(seconds)
        return Execution.objects.create(label="handle").pk

    duplicates = _duplicates_while(lambda: handle(key, 5.0), lambda: handle(key), after=0.3)
    assert_held_off(duplicates[1:], duplicates[0])
    assert handle(key) == duplicates[0]  # the owner's result, kept past the TTL it outran
    assert executions("handle") == 1


@pytest.mark.django_db(transaction=True)
def test_a_stale_record_taken_over_near_its_expiry_lives_until_the_new_lock_ends(
    key: str,
) -> None:
    """A dead attempt's record, 1.8 s into its 2.5 s TTL, is taken over with a 2 s lock (not
    renewed) by a 1 s run: the record lives until that lock ends, so duplicates find it held.
    Keeping the stale record's own expiry, it expired 0.7 s into the new owner's run, and the
    next claim took it over as expired."""

    @idempotent_function(
        key="event_id",
        payload=lambda event_id, *_, **__: event_id,
        ttl=2.5,
        lock_timeout=2.0,
        heartbeat=False,
    )
    def handle(event_id: str, seconds: float = 0.0) -> int:
        time.sleep(seconds)
        return Execution.objects.create(label="handle").pk

    stale_key(key, handle, key)
    time.sleep(1.8)  # the stale record ages to near its expiry
    duplicates = _duplicates_while(lambda: handle(key, 1.0), lambda: handle(key), after=0.1)
    assert_held_off(duplicates[1:], duplicates[0])
    assert executions("handle") == 1


def _duplicates_while(
    owner: Callable[[], Any], duplicate: Callable[[], Any], after: float
) -> list[Any]:
    """Run ``owner`` in a thread and, once it has claimed (a record locked now, on either
    store), ``duplicate`` every 0.1 s from ``after`` seconds on until it returns: the owner's
    result, then each duplicate's (or its ``IdempotencyInProgress``). Counted from the owner's
    start instead, a claim later than ``after`` (a loaded machine) let a duplicate claim
    first, and the owner replayed it: the test passed having held nothing off."""

    def claimed() -> bool:
        now = timezone.now()
        return any(each.status == "processing" and each.unlock_at > now for each in stored())

    pool = ThreadPoolExecutor(max_workers=1)
    try:
        running = pool.submit(lambda: _closing(owner))
        wait_for(claimed, "the owner's claim")
        started = time.monotonic()
        seen: list[Any] = []
        while not running.done():
            if time.monotonic() >= started + after:
                try:
                    seen.append(duplicate())
                except IdempotencyInProgress as exc:
                    seen.append(exc)
            time.sleep(0.1)
        return [running.result(), *seen]
    finally:
        pool.shutdown()
