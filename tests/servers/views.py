"""Views the real servers serve. Each records its executions as ``Execution`` rows.

Headers steer them without changing the fingerprint (method, path, scope and body): ``X-Sleep``
(seconds), ``X-Kill`` (SIGKILL the worker after the side effect) and ``X-Kill-After`` (SIGKILL it
after that step of the three-step view), so a retry is the very same request minus the fault.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import override_settings

from django_idempotency import IdempotencyKey, idempotent, late_result_refused, lock_lost
from tests.testapp.models import Execution
from tests.vendors import BACKEND_ID

STEPS = ("reserve", "charge", "ship")


def _sleep(request: HttpRequest) -> None:
    time.sleep(float(request.headers.get("X-Sleep", 0)))


def _kill_worker() -> None:
    """Die as an OOM kill does: no exception, no cleanup, no response."""
    os.kill(os.getpid(), signal.SIGKILL)


def _record(label: str, payload: object = "") -> Execution:
    return Execution.objects.create(label=label, payload=str(payload))


def _answer(request: HttpRequest, label: str, status: int = 201, **extra: Any) -> JsonResponse:
    claim = request.idempotency  # type: ignore[attr-defined]
    execution = _record(label, claim.attempt if claim else "")
    return JsonResponse(
        {"id": execution.pk, "attempt": claim.attempt if claim else None, "pid": os.getpid()}
        | extra,
        status=status,
    )


def health(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@idempotent(lock_timeout=60)
def slow(request: HttpRequest) -> HttpResponse:
    _sleep(request)
    return _answer(request, "slow")


@idempotent(lock_timeout=60)
async def async_slow(request: HttpRequest) -> HttpResponse:
    await asyncio.sleep(float(request.headers.get("X-Sleep", 0)))
    execution = await Execution.objects.acreate(label="async-slow")
    return JsonResponse({"id": execution.pk, "pid": os.getpid()}, status=201)


@idempotent(lock_timeout=2)
def crash(request: HttpRequest) -> HttpResponse:
    response = _answer(request, "crash")
    if "X-Kill" in request.headers:
        _kill_worker()
    return response


@idempotent(lock_timeout=2)
def three_steps(request: HttpRequest) -> HttpResponse:
    """Reserve, charge, ship; a takeover resumes after the last step the dead attempt recorded."""
    claim = request.idempotency  # type: ignore[attr-defined]
    resumed_at, resumed_data = claim.recovery_point, claim.recovery_data
    start = STEPS.index(resumed_at) + 1 if resumed_at else 0
    for step in STEPS[start:]:
        _record(f"step-{step}", claim.derived_key(step))
        claim.set_recovery_point(step, {"step": step, "pid": os.getpid()})
        if request.headers.get("X-Kill-After") == step:
            _kill_worker()
    return JsonResponse(
        {
            "attempt": claim.attempt,
            "resumed_at": resumed_at,
            "resumed_data": resumed_data,
            "ran": list(STEPS[start:]),
        },
        status=201,
    )


@idempotent(lock_timeout=2)
def derived(request: HttpRequest) -> HttpResponse:
    """Hands the payment provider ``derived_key("payment")``; records what it handed."""
    claim = request.idempotency  # type: ignore[attr-defined]
    payment_key = claim.derived_key("payment")
    _record("derived", payment_key)
    if "X-Kill" in request.headers:
        _kill_worker()
    return JsonResponse({"attempt": claim.attempt, "payment_key": payment_key}, status=201)


@idempotent(lock_timeout=1, heartbeat=False)
def late(request: HttpRequest) -> HttpResponse:
    """Slower than its lock_timeout when asked (``X-Sleep``), and not renewed: its retry takes
    it over."""
    _sleep(request)
    return _answer(request, "late")


def _record_refusal(sender: type[IdempotencyKey], claim: Any, **kwargs: Any) -> None:
    _record("late-refused", claim.attempt)


late_result_refused.connect(_record_refusal, dispatch_uid="servers-late-refused")


@idempotent(in_progress="wait", wait_timeout=5, lock_timeout=60)
def wait(request: HttpRequest) -> HttpResponse:
    _sleep(request)
    return _answer(request, "wait")


@idempotent(in_progress="wait", wait_timeout=5, lock_timeout=60)
async def async_wait(request: HttpRequest) -> HttpResponse:
    """Its waiters sleep on the event loop, not in a thread."""
    await asyncio.sleep(float(request.headers.get("X-Sleep", 0)))
    execution = await Execution.objects.acreate(label="async-wait")
    return JsonResponse({"id": execution.pk}, status=201)


@idempotent(in_progress="wait", wait_timeout=0.5, lock_timeout=60)
def wait_short(request: HttpRequest) -> HttpResponse:
    _sleep(request)
    return _answer(request, "wait-short")


@idempotent(atomic=True, wait_timeout=5, lock_timeout=60)
def atomic(request: HttpRequest) -> HttpResponse:
    """Claim, side effect and result in one transaction; ``X-Kill`` dies inside it."""
    response = _answer(request, "atomic")
    _sleep(request)
    if "X-Kill" in request.headers:
        _kill_worker()
    return response


@idempotent(atomic=True, wait_timeout=0.3, lock_timeout=60)
def atomic_short(request: HttpRequest) -> HttpResponse:
    _sleep(request)
    return _answer(request, "atomic-short")


@idempotent
def _refusing(request: HttpRequest) -> HttpResponse:
    return _answer(request, "refusing")


def refusing(request: HttpRequest) -> HttpResponse:
    """The idempotency store is the alias whose server refuses connections; the view's own
    table is reachable, so a run of the view would show. (Sync workers serve one request at a
    time, so overriding the settings for it is safe.)"""
    with override_settings(IDEMPOTENCY={"DATABASE_ALIAS": "unreachable"}):
        return _refusing(request)


@idempotent(lock_timeout=3)
def lose_db(request: HttpRequest) -> HttpResponse:
    """Records its backend's pid, says so in the file of ``X-Started-File`` once its insert has
    returned, then sleeps: the test terminates that backend meanwhile. (The row is seen before
    the insert returns: the server commits, then replies; a kill in between failed the view's
    own insert, a 500.)"""
    claim = request.idempotency  # type: ignore[attr-defined]
    with connection.cursor() as cursor:
        cursor.execute(BACKEND_ID[connection.vendor])
        (backend,) = cursor.fetchone()
    _record("lose-db", f"{backend}:{claim.attempt}")
    if started := request.headers.get("X-Started-File"):
        Path(started).touch()
    _sleep(request)
    return JsonResponse({"attempt": claim.attempt}, status=201)


# Lock renewal (tests/test_servers_heartbeat_postgresql.py): lock_timeout is 1 s, renewed every
# third of a second while the view runs.


@idempotent(lock_timeout=1)
def renewed(request: HttpRequest) -> HttpResponse:
    """Records its worker's pid first (the test freezes or kills it), then sleeps; says whether
    it learned that its lock was lost meanwhile."""
    claim = request.idempotency  # type: ignore[attr-defined]
    _record("renewed-start", f"{os.getpid()}:{claim.attempt}")
    _sleep(request)
    return _answer(request, "renewed", lock_lost=claim.lock_lost)


@idempotent(lock_timeout=1, in_progress="wait", wait_timeout=10)
def renewed_wait(request: HttpRequest) -> HttpResponse:
    _sleep(request)
    return _answer(request, "renewed-wait")


@idempotent(lock_timeout=1)
async def renewed_async(request: HttpRequest) -> HttpResponse:
    await asyncio.sleep(float(request.headers.get("X-Sleep", 0)))
    execution = await Execution.objects.acreate(label="renewed-async")
    return JsonResponse({"id": execution.pk}, status=201)


def _record_lost(sender: type[IdempotencyKey], claim: Any, **kwargs: Any) -> None:
    _record("lock-lost", claim.attempt)


lock_lost.connect(_record_lost, dispatch_uid="servers-lock-lost")


def tenant_scope(request: HttpRequest) -> str:
    """A tenant's keys are its own: the tenant as the URL names it (``/t/acme%00x/`` names
    ``acme\x00x``, issue 48)."""
    assert request.resolver_match is not None
    return "tenant:" + request.resolver_match.kwargs["tenant"]


@idempotent(scope=tenant_scope, fingerprint=lambda request, scope: request.body.hex())
def tenant_order(request: HttpRequest, tenant: str) -> HttpResponse:
    """A fingerprint that leaves the scope out: only the record's scope parts two tenants."""
    _record("tenant-order", tenant)
    return JsonResponse({"tenant": tenant}, status=201)
