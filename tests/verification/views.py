"""The entry points the workload drives, each with the same effect.

A two-phase view's effect is a line in a ledger of its worker's own (a file per process,
appended and fsynced before the view answers): the nemesis never touches it, so it is the truth
of how many times a view ran. An atomic view's effect is an ``Execution`` row written in the
view's transaction: it happened only if that committed (``/atomic-effects/`` lists them).
The body may ask the view to work ``work`` seconds after its effect (longer than the lock: only
renewal keeps it). Every answer carries the execution and the principal it was made for.

The outbox's views stage one message for the consumer, a Celery task (:mod:`.consumer`),
naming their execution; a body with ``"fail": 1`` makes the first attempt of its key answer
``503`` after staging (an attempt that keeps nothing: its record released, its message never
to be sent).
Their ledger lines carry the message's id, and ``"fails"`` for such an attempt; an
``/export/`` view's also its operation's id (``operation``: what its ``202``'s ``Location``
names, the link from an operation polled to the attempts that ran under it).

``/steps/`` runs two effects with a recovery point between them (docs/recovery.rst): its
ledger lines carry the ``step``, the ``attempt`` and, for the second, the first step's
execution it builds on (``first``) and whether the attempt resumed from the point
(``resumed``); each point saved is a line of ``points-<pid>.jsonl``, appended once
``set_recovery_point`` returned. ``/export/`` answers ``202`` and leaves its operation to the
consumer's task, which completes it with ``complete_operation`` (docs/operations.rst).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model, login
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from ninja import NinjaAPI
from ninja.security import APIKeyHeader
from rest_framework.authentication import BasicAuthentication, TokenAuthentication
from rest_framework.authtoken.models import Token
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import (
    IdempotencyInProgress,
    IdempotencyKeyMismatch,
    StoreUnavailable,
    idempotent,
    idempotent_function,
)
from django_idempotency import ninja as idempotent_ninja
from django_idempotency.models import OutboxMessage
from django_idempotency.rest_framework import IdempotencyMixin
from tests.testapp.models import Execution
from tests.verification import witness
from tests.verification.consumer import CONSUMER_LABEL, deliver
from tests.verification.ledger import append_line
from tests.verification.limits import LOCK, SHORT_TTL, TTL, password

ATOMIC_LABEL = "verify-atomic"


def _principal(request: Any) -> str:
    name = _name(getattr(request, "user", None))
    return _name(getattr(request, "auth", None)) if name == "anonymous" else name  # ninja's


def _name(user: Any) -> str:
    return str(user.username) if getattr(user, "is_authenticated", False) else "anonymous"


def _fails_once(line: dict[str, Any]) -> bool:
    """Whether this is the first attempt of its principal's key (a marker file made once)."""
    name = hashlib.sha256(f"{line['principal']}\0{line['key']}".encode()).hexdigest()[:16]
    try:
        os.close(os.open(_ledger() / f"fail-{name}", os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


def _ledger() -> Path:
    return Path(os.environ["IDEMPOTENCY_VERIFY_LEDGER"])


def _born(request: Any) -> dict[str, float]:
    """A takeover's record's birth (``born``: seconds since the epoch, the store's clock): a
    record claimed under a store outage is born when the store answers, later than any
    request the history holds for it, and the checker bounds the record's life by it."""
    claim = getattr(request, "idempotency", None)
    if claim is None or getattr(claim, "attempt", 1) < 2:
        return {}
    try:
        return {"born": claim.life / 1_000_000}
    except Exception:  # the record gone (a lost lock): the checker bounds it as before
        return {}


def _effect(
    request: Any,
    entry: str,
    raw: bytes,
    *,
    atomic: bool = False,
    stage: bool = False,
    principal: str | None = None,
    work: bool = True,
    step: dict[str, Any] | None = None,
    operation: bool = False,
) -> dict[str, Any]:
    """Record the effect (``step``: a ``/steps/`` view's, its fields on the line; ``stage``:
    with a message for the consumer, which completes the attempt's operation with the answer
    when ``operation``); then work (``work``: here, else the caller's own)."""
    body = json.loads(raw or b"{}")
    line: dict[str, Any] = {
        "t": time.time(),
        "entry": entry,
        "principal": _principal(request) if principal is None else principal,
        "key": request.headers.get("Idempotency-Key", ""),
        "body": hashlib.sha256(raw).hexdigest()[:16],
        "execution": uuid.uuid4().hex,
        "pid": os.getpid(),
        "work": float(body.get("work") or 0),
        **(step or {}),
        **_born(request),
    }
    answer = {"execution": line["execution"], "principal": line["principal"], "n": body.get("n")}
    if stage:
        # An operation's message carries its id and the answer its completion stores.
        args = (request.idempotency.operation_id, dict(answer)) if operation else ()
        if operation:  # the operation this attempt's answer completes: its 202's Location
            line["operation"] = args[0]
        line["message"] = request.idempotency.enqueue(deliver, line["execution"], *args)
        if body.get("fail") and _fails_once(line):
            line["fails"] = True
    if atomic:
        Execution.objects.create(label=ATOMIC_LABEL, payload=json.dumps(line))
    else:
        append_line(_ledger() / f"effects-{os.getpid()}.jsonl", line)
        witness.ran(line["execution"])
    if work and body.get("work"):
        time.sleep(float(body["work"]))
    if "message" in line:
        answer["message"] = line["message"]
    if line.get("fails"):
        answer["fails"] = True
    return answer


def health(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def setup(request: HttpRequest) -> HttpResponse:
    """``?user=NAME``: the user (made once, its password :func:`.limits.password`'s, for
    Basic authentication), its DRF token, and a session for it (a cookie)."""
    user, _ = get_user_model().objects.get_or_create(username=request.GET["user"])
    user.set_password(password(user.username))  # MD5 in these settings: Basic costs no PBKDF2
    user.save(update_fields=["password"])
    token, _ = Token.objects.get_or_create(user=user)
    login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    return JsonResponse({"token": token.key})


def _rows(label: str) -> list[dict[str, Any]]:
    rows = Execution.objects.filter(label=label).values_list("payload", flat=True)
    return [json.loads(row) for row in rows]


def atomic_effects(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"effects": _rows(ATOMIC_LABEL)})


def outbox_state(request: HttpRequest) -> HttpResponse:
    """The outbox's undelivered messages (by state), the ids of those sent, and the consumer's
    effects, from the store in use: the run waits for the first to be none and the last to
    have caught up with the others before it checks."""
    url = os.environ.get("IDEMPOTENCY_VERIFY_REDIS_URL")
    if url:
        counts, sent = _redis_outbox(url)
    else:
        left = OutboxMessage.objects.exclude(state=OutboxMessage.State.SENT)
        counts = {state: left.filter(state=state).count() for state in ("pending", "failed")}
        done = OutboxMessage.objects.filter(state=OutboxMessage.State.SENT)
        sent = list(done.values_list("message_id", flat=True))
    return JsonResponse({"undelivered": counts, "consumed": _rows(CONSUMER_LABEL),
                         "sent": sent})  # fmt: skip


def _redis_outbox(url: str) -> tuple[dict[str, int], list[str]]:
    """The Redis store's backlog (its own figures: ``backlog()``, as ``idempotency_stats``
    reads them) and the ids of its messages marked sent: each message's hash
    (``P o:m:{tag}:<id>``, redis/outbox.py) is kept, ``st`` ``sent``, until its record
    expires, and the views' records outlive the run (limits.TTL)."""
    from django_idempotency._store import using
    from django_idempotency._store.redis.outbox import due_key

    store: Any = using(url)
    backlog = store.backlog()
    client = store.client
    pattern = due_key(store.prefix).removesuffix("due") + "m:*"
    sent = []
    for key in client.scan_iter(match=pattern, count=1000):
        message, state = (
            value.decode() if isinstance(value, bytes) else value
            for value in client.hmget(key, "id", "st")
        )
        if state == "sent" and message is not None:
            sent.append(str(message))
    return {"pending": backlog.pending, "failed": backlog.failed}, sent


class MixinView(IdempotencyMixin, APIView):
    idempotency_lock_timeout = LOCK
    idempotency_ttl = TTL

    def post(self, request: Request) -> Response:
        return Response(_effect(request, "mixin", request.body), status=201)


@api_view(["POST"])
@idempotent(lock_timeout=LOCK, ttl=TTL)
def function(request: Request) -> Response:
    return Response(_effect(request, "function", request.body), status=201)


@idempotent(lock_timeout=LOCK, ttl=TTL)
def plain(request: HttpRequest) -> HttpResponse:
    return JsonResponse(_effect(request, "plain", request.body), status=201)


@idempotent(in_progress="accepted", lock_timeout=LOCK, ttl=TTL)
def accepted(request: HttpRequest) -> HttpResponse:
    """A duplicate of a request still running gets ``202`` and the operation's status URL."""
    return JsonResponse(_effect(request, "accepted", request.body), status=201)


@idempotent(lock_timeout=LOCK, ttl=SHORT_TTL)
def short_ttl(request: HttpRequest) -> HttpResponse:
    return JsonResponse(_effect(request, "short-ttl", request.body), status=201)


@idempotent(lock_timeout=LOCK, ttl=TTL)
def steps(request: HttpRequest) -> HttpResponse:
    """Two effects with a recovery point between them (docs/recovery.rst's shape): the first
    step, ``set_recovery_point("first")`` naming it, the body's work, the second step. An
    attempt that takes the record over at the point (its owner killed, stopped or cut off
    past its lock, or its first attempt failed after the point) runs the second step only,
    building on the first step the point names. A body with ``"fail": 1`` makes the first
    attempt of its key answer ``503`` once its point is saved: the record is kept at the point
    and its retry resumes from it (:ref:`recovery-after-failure`). ``LockLost`` and
    ``StoreUnavailable`` from the point propagate: ``409`` and ``503``."""
    claim = request.idempotency
    raw = request.body
    body = json.loads(raw or b"{}")
    work = float(body.get("work") or 0)
    resumed = claim.recovery_point == "first"
    if resumed:
        first = str(claim.recovery_data["execution"])
    else:
        step = {"step": 1, "attempt": claim.attempt}
        done = _effect(request, "steps", raw, work=False, step=step)
        first = done["execution"]
        claim.set_recovery_point("first", {"execution": first})
        point = {"t": time.time(), "entry": "steps", "principal": done["principal"],
                 "key": request.headers.get("Idempotency-Key", ""), "execution": first,
                 "attempt": claim.attempt, "pid": os.getpid()}  # fmt: skip
        if body.get("fail") and _fails_once(point):
            point["fails"] = True
        append_line(_ledger() / f"points-{os.getpid()}.jsonl", point)
        if point.get("fails"):
            return JsonResponse({"title": "failed after its recovery point"}, status=503)
    time.sleep(work)  # a worker killed or stopped here leaves the record at its point
    # Nothing works after the second step (``work``: what the nemesis reads as still running).
    step = {"step": 2, "attempt": claim.attempt, "first": first, "resumed": resumed, "work": 0}
    answer = _effect(request, "steps", raw, work=False, step=step)
    return JsonResponse({**answer, "first": first}, status=201)


@idempotent(in_progress="accepted", lock_timeout=LOCK, ttl=TTL)
def export(request: HttpRequest) -> HttpResponse:
    """The recipe of docs/operations.rst: the view's effect, then its operation's work staged
    for the consumer's task (``enqueue``: sent once this ``202`` is stored), which completes
    the operation with the answer the view would have given (``complete_operation``). A retry
    gets this ``202`` replayed until then, and the final response after."""
    claim = request.idempotency
    answer = _effect(request, "export", request.body, work=False, stage=True, operation=True)
    return JsonResponse(
        {"operation": claim.operation_id, "principal": answer["principal"]},
        status=202,
        headers={"Location": claim.operation_url},
    )


# store="database": on a Redis STORE the module still imports (atomic mode is refused at
# decoration there); the view is routed on the database run only.
@idempotent(atomic=True, lock_timeout=LOCK, ttl=TTL, store="database")
def atomic(request: HttpRequest) -> HttpResponse:
    return JsonResponse(
        _effect(request, "atomic", request.body, atomic=True, stage=True), status=201
    )


@idempotent(lock_timeout=LOCK, ttl=TTL)
def outbox(request: HttpRequest) -> HttpResponse:
    answer = _effect(request, "outbox", request.body, stage=True)
    return JsonResponse(answer, status=503 if answer.get("fails") else 201)


@api_view(["POST"])
@authentication_classes([TokenAuthentication, BasicAuthentication])
@permission_classes([AllowAny])
@idempotent(lock_timeout=LOCK, ttl=TTL)
def function_policy(request: Request) -> Response:
    """The other order DRF's function views allow: its policy decorators between."""
    return Response(_effect(request, "function-policy", request.body), status=201)


@idempotent(lock_timeout=LOCK, ttl=TTL)
async def async_view(request: HttpRequest) -> HttpResponse:
    """The session's user read with ``auser()``: a query of the view's own (the app read the
    user for its scope with ``request.user``, whose cache ``auser()`` does not share), so a
    database fault meets it as it would any view's own query, and the view answers ``503``
    (its record released) rather than Django's ``500``."""
    try:
        principal = _name(await request.auser())
    except DatabaseError:
        return JsonResponse({"title": "unavailable"}, status=503)
    raw = request.body
    answer = await sync_to_async(_effect)(request, "async", raw, principal=principal, work=False)
    await asyncio.sleep(float(json.loads(raw).get("work") or 0))
    return JsonResponse(answer, status=201)


class ApiKey(APIKeyHeader):
    """django-ninja's API key: a DRF token's key in ``X-API-Key``."""

    param_name = "X-API-Key"

    def authenticate(self, request: HttpRequest, key: str | None) -> Any:
        found = Token.objects.select_related("user").filter(key=key).first()
        return None if found is None else found.user


api = NinjaAPI(urls_namespace="verification", title="Verification")
# A database fault in the API key's authentication is a 503, not Django's 500 (docs/ninja.rst).
api.add_exception_handler(DatabaseError, idempotent_ninja.exception_handler)


@api.post("/", auth=ApiKey(), response={201: dict[str, Any]})
@idempotent_ninja.idempotent(lock_timeout=LOCK, ttl=TTL)
def ninja_operation(request: HttpRequest) -> tuple[int, dict[str, Any]]:
    return 201, _effect(request, "ninja", request.body)


_ran = threading.local()


@idempotent_function(key="key", scope=lambda raw, key, principal: principal, lock_timeout=LOCK,
                     ttl=TTL)  # fmt: skip
def _called(raw: str, key: str, principal: str) -> dict[str, Any]:
    _ran.now = True
    return _effect(_Call(key), "call", raw.encode(), principal=principal)


class _Call:
    """What ``_effect`` reads of a request, for a call."""

    def __init__(self, key: str) -> None:
        self.headers = {"Idempotency-Key": key}


@csrf_exempt
def call(request: HttpRequest) -> HttpResponse:
    """``idempotent_function`` behind an unprotected view: the key from the header, the
    principal its scope; what it raises is the answer a view would give."""
    _ran.now = False
    try:
        principal = _principal(request)  # the session's user: a database read
        answer = _called(request.body.decode(), request.headers["Idempotency-Key"], principal)
    except IdempotencyInProgress:
        return JsonResponse({"title": "in progress"}, status=409)
    except IdempotencyKeyMismatch:
        return JsonResponse({"title": "key reused"}, status=422)
    except (StoreUnavailable, DatabaseError):
        return JsonResponse({"title": "unavailable"}, status=503)
    response = HttpResponse(json.dumps(answer, sort_keys=True), status=201,
                            content_type="application/json")  # fmt: skip
    if not _ran.now:
        response["Idempotent-Replayed"] = "true"
    return response
