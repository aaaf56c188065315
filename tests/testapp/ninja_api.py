"""Ninja operations the tests protect, each recording its executions as Execution rows."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI, Router, Schema
from ninja.errors import HttpError
from ninja.responses import Status
from ninja.security import APIKeyHeader, HttpBasicAuth

from django_idempotency import json_fingerprint
from django_idempotency.ninja import idempotent
from tests.testapp.models import Execution


class ApiKey(APIKeyHeader):
    param_name = "X-API-Key"

    def authenticate(self, request: HttpRequest, key: str | None) -> str | None:
        return key if key in ("key-one", "key-two") else None


class UserBasic(HttpBasicAuth):
    def authenticate(self, request: HttpRequest, username: str, password: str) -> User | None:
        user = User.objects.filter(username=username).first()
        return user if user is not None and user.check_password(password) else None


class ChargeIn(Schema):
    amount: int
    currency: str = "usd"


class ChargeOut(Schema):
    id: int
    amount: int
    currency: str
    executions: int


api = NinjaAPI(urls_namespace="ninja-tests", title="Ninja tests")


def _run(request: HttpRequest, label: str, sleep: float = 0) -> Execution:
    if sleep:
        time.sleep(sleep)
    return Execution.objects.create(label=label, payload=request.body.decode("latin-1"))


def _charge(execution: Execution, payload: ChargeIn) -> dict[str, Any]:
    count = Execution.objects.filter(label=execution.label).count()
    return {"id": execution.pk, **payload.dict(), "executions": count}


@api.post("/charges", response={201: ChargeOut})
@idempotent
def create_charge(request: HttpRequest, payload: ChargeIn, sleep: float = 0) -> dict[str, Any]:
    return _charge(_run(request, "ninja-charge", sleep), payload)


@api.post("/required", response={201: ChargeOut})
@idempotent(required=True, key_format="uuid", ttl=120)
def required(request: HttpRequest, payload: ChargeIn) -> dict[str, Any]:
    return _charge(_run(request, "ninja-required"), payload)


@api.post("/dict")
@idempotent
def as_dict(request: HttpRequest) -> dict[str, Any]:
    execution = _run(request, "ninja-dict")
    return {"id": execution.pk, "note": "caf\u00e9"}


@api.post("/status", response={202: ChargeOut, 400: dict[str, str]})
@idempotent
def as_status(request: HttpRequest, payload: ChargeIn) -> Status[Any]:
    execution = _run(request, "ninja-status")
    if payload.amount <= 0:
        return Status(400, {"error": "amount"})
    return Status(202, _charge(execution, payload))


@api.post("/tuple", response={201: dict[str, int]})
@idempotent
def as_tuple(request: HttpRequest) -> tuple[int, dict[str, int]]:
    return 201, {"id": _run(request, "ninja-tuple").pk}


@api.post("/http-response")
@idempotent
def as_http_response(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    execution = _run(request, "ninja-http")
    answer = HttpResponse(f"made {execution.pk}", status=201, content_type="text/plain")
    answer["Location"] = f"/things/{execution.pk}"
    return answer


@api.post("/temporal", response={201: dict[str, int]})
@idempotent
def temporal(request: HttpRequest, response: HttpResponse) -> dict[str, int]:
    execution = _run(request, "ninja-temporal")
    response["Location"] = f"/things/{execution.pk}"
    return {"id": execution.pk}


@api.put("/things/{thing_id}", response={200: dict[str, int]})
@idempotent
def put_thing(request: HttpRequest, thing_id: int) -> dict[str, int]:
    return {"id": thing_id, "execution": _run(request, "ninja-put").pk}


@api.delete("/things/{thing_id}", response={200: dict[str, int]})
@idempotent
def delete_thing(request: HttpRequest, thing_id: int) -> dict[str, int]:
    return {"id": thing_id, "execution": _run(request, "ninja-delete").pk}


@api.post("/status-code/{code}")
@idempotent
def status_code(request: HttpRequest, code: int) -> HttpResponse:
    _run(request, "ninja-status-code")
    return HttpResponse(b"answer", status=code)


@api.post("/explode")
@idempotent
def explode(request: HttpRequest) -> dict[str, int]:
    _run(request, "ninja-explode")
    raise RuntimeError("boom")


@api.post("/http-error")
@idempotent
def http_error(request: HttpRequest) -> dict[str, int]:
    _run(request, "ninja-http-error")
    raise HttpError(403, "Not yours.")


@api.post("/api-key", auth=ApiKey(), response={201: ChargeOut})
@idempotent
def with_api_key(request: HttpRequest, payload: ChargeIn) -> dict[str, Any]:
    return _charge(_run(request, "ninja-api-key"), payload)


@api.post("/basic", auth=UserBasic(), response={201: ChargeOut})
@idempotent
def with_user(request: HttpRequest, payload: ChargeIn) -> dict[str, Any]:
    return _charge(_run(request, "ninja-basic"), payload)


class _Opaque:
    """A principal without a ``__str__``."""


@api.post("/opaque-auth", auth=lambda request: _Opaque(), response={201: ChargeOut})
@idempotent
def opaque_auth(request: HttpRequest, payload: ChargeIn) -> dict[str, Any]:
    return _charge(_run(request, "ninja-opaque"), payload)


@api.post(
    "/constant-auth/{value}",
    auth=lambda request: _CONSTANTS[request.path.rsplit("/", 1)[1]],
    response={201: ChargeOut},
)
@idempotent
def constant_auth(request: HttpRequest, value: str, payload: ChargeIn) -> dict[str, Any]:
    return _charge(_run(request, "ninja-constant"), payload)


@api.post("/constant-auth-scoped/{value}", auth=lambda request: True, response={201: ChargeOut})
@idempotent(scope=lambda request: "user:" + request.headers.get("X-User", ""))
def constant_auth_scoped(request: HttpRequest, value: str, payload: ChargeIn) -> dict[str, Any]:
    return _charge(_run(request, "ninja-constant-scoped"), payload)


#: What an authenticate() that only says "allowed" returns (issue 48).
_CONSTANTS: dict[str, Any] = {"true": True, "one": 1, "float": 1.5, "ellipsis": Ellipsis}


def _tenant(request: HttpRequest) -> str:
    return "tenant:" + request.headers.get("X-Tenant", "none")


@api.post("/scoped", auth=ApiKey(), response={201: ChargeOut})
@idempotent(scope=_tenant)
def scoped(request: HttpRequest, payload: ChargeIn) -> dict[str, Any]:
    return _charge(_run(request, "ninja-scoped"), payload)


@api.post("/fingerprint", response={201: ChargeOut})
@idempotent(fingerprint=json_fingerprint(exclude=["/currency"]))
def fingerprinted(request: HttpRequest, payload: ChargeIn) -> dict[str, Any]:
    return _charge(_run(request, "ninja-fingerprint"), payload)


@api.post("/wait", response={201: ChargeOut})
@idempotent(in_progress="wait", wait_timeout=5)
def wait(request: HttpRequest, payload: ChargeIn, sleep: float = 0) -> dict[str, Any]:
    return _charge(_run(request, "ninja-wait", sleep), payload)


@api.post("/short-lock", response={201: ChargeOut})
@idempotent(lock_timeout=1, heartbeat=False)
def short_lock(request: HttpRequest, payload: ChargeIn, sleep: float = 0) -> dict[str, Any]:
    return _charge(_run(request, "ninja-short-lock", sleep), payload)


@api.post("/async", response={201: ChargeOut})
@idempotent
async def async_charge(request: HttpRequest, payload: ChargeIn, sleep: float = 0) -> Any:
    if sleep:
        await asyncio.sleep(sleep)
    execution = await sync_to_async(Execution.objects.create)(label="ninja-async")
    count = await sync_to_async(Execution.objects.filter(label="ninja-async").count)()
    return {"id": execution.pk, **payload.dict(), "executions": count}


@api.post("/atomic", response={201: ChargeOut})
@idempotent(atomic=True, wait_timeout=5)
def atomic(request: HttpRequest, payload: ChargeIn, sleep: float = 0) -> dict[str, Any]:
    return _charge(_run(request, "ninja-atomic", sleep), payload)


#: Events a test sets: ``entered[name]`` once the operation runs, ``release[name]`` to let it end.
ENTERED: dict[str, threading.Event] = {}
RELEASE: dict[str, threading.Event] = {}


@api.post("/gate", response={201: ChargeOut})
@idempotent
def gate(request: HttpRequest, payload: ChargeIn, name: str) -> dict[str, Any]:
    """Runs until the test releases it: a duplicate meets it in flight, whatever the load."""
    execution = _run(request, "ninja-gate")
    ENTERED[name].set()
    assert RELEASE[name].wait(timeout=30)
    return _charge(execution, payload)


@api.post("/recovery", response={201: dict[str, Any]})
@idempotent
def recovery(request: HttpRequest, payload: ChargeIn) -> dict[str, Any]:
    """Two steps with recovery points; ``X-Crash: 1`` dies after the first, like a killed
    worker (the record is left as it is)."""
    claim = request.idempotency  # type: ignore[attr-defined]
    if claim.recovery_point != "charged":
        Execution.objects.create(label="ninja-recovery-charge", payload=claim.derived_key())
        claim.set_recovery_point("charged")
        if request.headers.get("X-Crash") == "1":
            raise KeyboardInterrupt
    Execution.objects.create(label="ninja-recovery-ship")
    return {"attempt": claim.attempt, "key": claim.derived_key()}


@api.get("/things", response={200: dict[str, int]})
@idempotent
def list_things(request: HttpRequest) -> dict[str, int]:
    return {"count": Execution.objects.count()}


# Ninja's default ("operation") mode: every operation of the router is protected.
router = Router()
router.add_decorator(idempotent(in_progress="wait", wait_timeout=5))


@router.post("/charges", response={201: ChargeOut})
def router_charge(request: HttpRequest, payload: ChargeIn, sleep: float = 0) -> dict[str, Any]:
    return _charge(_run(request, "ninja-router", sleep), payload)


@router.post("/async", response={201: ChargeOut})
async def router_async(request: HttpRequest, payload: ChargeIn) -> Any:
    execution = await sync_to_async(Execution.objects.create)(label="ninja-router-async")
    return {"id": execution.pk, **payload.dict(), "executions": 1}


@router.patch("/patch", response={200: dict[str, int]})
def router_patch(request: HttpRequest) -> dict[str, int]:
    return {"id": _run(request, "ninja-router-patch").pk}


api.add_router("/router", router)
