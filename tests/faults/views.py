"""The views the fault suite's app processes serve.

Each runs its side effect at once, then waits for the scenario's gate (``X-Gate``: a file of that
name in ``IDEMPOTENCY_FAULT_DIR``) so that the fault lands between the claim and the result
write. A view past its effect, about to wait, is a line in ``started``; a two-phase view's
effect is a line in ``effects``
(a file: it survives whatever the database does), an atomic view's an ``Execution`` row in its
own transaction (it happened only if that committed). ``X-Work`` (seconds, at most one) makes
the view work that long after its effect: an atomic view holds SQLite's one write lock while it
works. Headers are not in the fingerprint, so a retry is the same request. ``log_in`` gives a
client a session: its requests' scope is the user's, read from the database.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from pathlib import Path

from django.contrib.auth import get_user_model, login
from django.http import HttpRequest, HttpResponse, JsonResponse

from django_idempotency import idempotent
from tests.testapp.models import Execution

SHORT_LOCK = 10
LONG_LOCK = 30
#: The renewal scenarios' lock (issue 39): renewed every second, outlasted by their views.
RENEWED_LOCK = 3
GATE_TIMEOUT = 120.0
ATOMIC_LABEL = "fault-atomic"


def _dir() -> Path:
    return Path(os.environ["IDEMPOTENCY_FAULT_DIR"])


def _append(name: str, line: str) -> None:
    # One write(2) of a short line with O_APPEND: lines from many processes never interleave.
    fd = os.open(_dir() / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def _wait_gate(request: HttpRequest) -> None:
    name = request.headers.get("X-Gate", "")
    if not re.fullmatch(r"[a-z0-9-]{1,64}", name):
        return
    gate = _dir() / f"gate-{name}"
    deadline = time.monotonic() + GATE_TIMEOUT
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def _run(request: HttpRequest, effect: str) -> HttpResponse:
    key = request.headers.get("Idempotency-Key", "")
    execution = uuid.uuid4().hex
    if effect == "file":
        _append("effects", f"{key} {execution}")
    else:
        Execution.objects.create(label=ATOMIC_LABEL, payload=f"{key} {execution}")
    # Only now: a fault injected once every owner is here lands after the effects. Written
    # before the effect, a slow worker's atomic INSERT met a blackhole injected meanwhile, a
    # statement of the view's own that nothing bounds (CI: one key held for good).
    _append("started", f"{key} {execution}")
    _work(request)
    _wait_gate(request)
    return JsonResponse({"key": key, "execution": execution, "pid": os.getpid()}, status=201)


def _work(request: HttpRequest) -> None:
    try:
        seconds = float(request.headers.get("X-Work", "0"))
    except ValueError:
        return
    if 0 < seconds <= 1:
        time.sleep(seconds)


def health(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def warm(request: HttpRequest) -> HttpResponse:
    """Hold a thread for a moment after a query: sent to every thread at once, it leaves each
    with a connection of its own (kept when connections are persistent)."""
    Execution.objects.exists()
    time.sleep(0.5)
    return HttpResponse("warm")


def log_in(request: HttpRequest) -> HttpResponse:
    """A session for a user of the suite's own: a logged-in client's scope is read from the
    database (its session and user) on every request, so it meets the faults too."""
    user, _ = get_user_model().objects.get_or_create(username="fault-client")
    login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    return HttpResponse("logged in")


@idempotent(lock_timeout=SHORT_LOCK)
def two_phase(request: HttpRequest) -> HttpResponse:
    return _run(request, "file")


@idempotent(lock_timeout=LONG_LOCK)
def two_phase_long(request: HttpRequest) -> HttpResponse:
    return _run(request, "file")


@idempotent(atomic=True, lock_timeout=SHORT_LOCK, store="database")
def atomic(request: HttpRequest) -> HttpResponse:
    return _run(request, "table")


@idempotent(atomic=True, lock_timeout=LONG_LOCK, store="database")
def atomic_long(request: HttpRequest) -> HttpResponse:
    return _run(request, "table")


@idempotent(lock_timeout=RENEWED_LOCK)
def two_phase_renewed(request: HttpRequest) -> HttpResponse:
    return _run(request, "file")


@idempotent(lock_timeout=SHORT_LOCK)
def recovery(request: HttpRequest) -> HttpResponse:
    """The recovery-point view of docs/recovery.rst (issue 39): reserve, charge (its effect,
    counted as the others'), record ``"charged"`` and ship. It waits at the gate between the
    charge and that recovery point, so the fault lands on the point's write; a retry that
    takes the record over at ``"charged"`` ships without charging again."""
    claim = request.idempotency  # type: ignore[attr-defined]
    key = request.headers.get("Idempotency-Key", "")
    if claim.recovery_point == "":
        claim.set_recovery_point("reserved", {"reservation": key})
    if claim.recovery_point == "reserved":
        charge = uuid.uuid4().hex
        _append("effects", f"{key} {charge}")
        _append("started", f"{key} {charge}")
        _wait_gate(request)
        claim.set_recovery_point("charged", {"charge": charge})
    return JsonResponse({"key": key, "shipped": claim.recovery_data["charge"]}, status=201)
