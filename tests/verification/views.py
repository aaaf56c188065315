"""The entry points the workload drives, each with the same effect.

A two-phase view's effect is a line in a ledger of its worker's own (a file per process,
appended and fsynced before the view answers): the nemesis never touches it, so it is the truth
of how many times a view ran. An atomic view's effect is an ``Execution`` row written in the
view's transaction: it happened only if that committed (``/atomic-effects/`` lists them).
The body may ask the view to work ``work`` seconds after its effect (longer than the lock: only
renewal keeps it). Every answer carries the execution and the principal it was made for.

The outbox's views stage one message for the consumer (:mod:`.consumer`), naming their
execution; a body with ``"fail": 1`` makes the first attempt of its key answer ``503`` after
staging (an attempt that keeps nothing: its record released, its message never to be sent).
Their ledger lines carry the message's id, and ``"fails"`` for such an attempt.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model, login
from django.http import HttpRequest, HttpResponse, JsonResponse
from rest_framework.authtoken.models import Token
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import idempotent
from django_idempotency.models import OutboxMessage
from django_idempotency.rest_framework import IdempotencyMixin
from tests.testapp.models import Execution
from tests.verification.consumer import CONSUMER_LABEL, deliver
from tests.verification.limits import LOCK, SHORT_TTL, TTL

ATOMIC_LABEL = "verify-atomic"


def _principal(request: Any) -> str:
    user = getattr(request, "user", None)
    return str(user.username) if user is not None and user.is_authenticated else "anonymous"


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


def _effect(
    request: Any, entry: str, raw: bytes, *, atomic: bool = False, stage: bool = False
) -> dict[str, Any]:
    body = json.loads(raw or b"{}")
    line: dict[str, Any] = {
        "t": time.time(),
        "entry": entry,
        "principal": _principal(request),
        "key": request.headers.get("Idempotency-Key", ""),
        "body": hashlib.sha256(raw).hexdigest()[:16],
        "execution": uuid.uuid4().hex,
        "pid": os.getpid(),
        "work": float(body.get("work") or 0),
    }
    if stage:
        line["message"] = request.idempotency.enqueue(deliver, line["execution"])
        if body.get("fail") and _fails_once(line):
            line["fails"] = True
    if atomic:
        Execution.objects.create(label=ATOMIC_LABEL, payload=json.dumps(line))
    else:
        path = _ledger() / f"effects-{os.getpid()}.jsonl"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
    if body.get("work"):
        time.sleep(float(body["work"]))
    answer = {"execution": line["execution"], "principal": line["principal"], "n": body.get("n")}
    if "message" in line:
        answer["message"] = line["message"]
    if line.get("fails"):
        answer["fails"] = True
    return answer


def health(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def setup(request: HttpRequest) -> HttpResponse:
    """``?user=NAME``: the user (made once), its DRF token, and a session for it (a cookie)."""
    user, _ = get_user_model().objects.get_or_create(username=request.GET["user"])
    token, _ = Token.objects.get_or_create(user=user)
    login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    return JsonResponse({"token": token.key})


def _rows(label: str) -> list[dict[str, Any]]:
    rows = Execution.objects.filter(label=label).values_list("payload", flat=True)
    return [json.loads(row) for row in rows]


def atomic_effects(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"effects": _rows(ATOMIC_LABEL)})


def outbox_state(request: HttpRequest) -> HttpResponse:
    """The outbox's undelivered messages (by state) and the consumer's effects: the run waits
    for the first to be none and the second to have caught up before it checks."""
    left = OutboxMessage.objects.exclude(state=OutboxMessage.State.SENT)
    counts = {state: left.filter(state=state).count() for state in ("pending", "failed")}
    return JsonResponse({"undelivered": counts, "consumed": _rows(CONSUMER_LABEL)})


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


@idempotent(lock_timeout=LOCK, ttl=SHORT_TTL)
def short_ttl(request: HttpRequest) -> HttpResponse:
    return JsonResponse(_effect(request, "short-ttl", request.body), status=201)


@idempotent(atomic=True, lock_timeout=LOCK, ttl=TTL)
def atomic(request: HttpRequest) -> HttpResponse:
    return JsonResponse(
        _effect(request, "atomic", request.body, atomic=True, stage=True), status=201
    )


@idempotent(lock_timeout=LOCK, ttl=TTL)
def outbox(request: HttpRequest) -> HttpResponse:
    answer = _effect(request, "outbox", request.body, stage=True)
    return JsonResponse(answer, status=503 if answer.get("fails") else 201)
