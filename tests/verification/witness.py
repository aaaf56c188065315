"""What a server process sees of its own faults, the ones no nemesis scheduled: a result the
app could not store (its "Could not store the result" error, SPEC 4a: the owner answers, and
a retry once the lock lapses runs the view again), and a pause of the whole process (the
machine's load, a swap) long enough for its lock to lapse, and a lock an owner lost once it had
lapsed (its renewals failed past the lock's end: a view still running is a late owner). Each is
a line of the run's ledgers (``unstored-<pid>.jsonl``, ``pauses-<pid>.jsonl``,
``lost-<pid>.jsonl``), which ``run.py`` adds to the history as observed faults: without them
the checker took such a window for a double run.

A request's executions are gathered in a list the middleware makes for it (a context
variable: the async view's coroutine and the decorator's write see the same list)."""

from __future__ import annotations

import contextvars
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.verification.ledger import append_line, read_lines
from tests.verification.limits import LOCK

#: The executions of the request being served (``_effect`` appends to it).
executions: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "verification_executions", default=None
)
#: A gap this long (seconds) between a watcher's ticks is a pause of its process.
PAUSE = 1.0
TICK = 0.1
#: The message of ``_call/writing.py``'s ``_not_stored``.
UNSTORED = "Could not store the result of idempotency record"
_watching = {"pid": 0}
#: A claim's request's executions (set as it is claimed), and the lost locks waiting for their
#: request's end by the id of that list (the late owner's effects come after the loss).
GATHERED = "verification_executions"
_lost: dict[int, dict[str, Any]] = {}


def _ledger() -> Path:
    return Path(os.environ["IDEMPOTENCY_VERIFY_LEDGER"])


def attempts(get_response: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The middleware: a fresh list of executions for each request, and this process's pause
    watcher started (once per process: gunicorn forks its workers after loading the app)."""

    def middleware(request: Any) -> Any:
        _watch()
        gathered: list[str] = []
        executions.set(gathered)
        try:
            return get_response(request)
        finally:
            line = _lost.pop(id(gathered), None)
            if line is not None:
                _write_lost(line, gathered)

    return middleware


def ran(execution: str) -> None:
    """An effect of the request being served (outside one: nothing to gather)."""
    gathered = executions.get()
    if gathered is not None:
        gathered.append(execution)


class Unstored(logging.Handler):
    """Each result the app could not store, with the executions of its request."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)

    def emit(self, record: logging.LogRecord) -> None:
        if not str(record.msg).startswith(UNSTORED) or not os.environ.get(
            "IDEMPOTENCY_VERIFY_LEDGER"
        ):
            return
        line = {
            "t": record.created,
            "pid": os.getpid(),
            "record": str(record.args[0]) if isinstance(record.args, tuple) else None,
            "executions": list(executions.get() or ()),
        }
        append_line(_ledger() / f"unstored-{os.getpid()}.jsonl", line)


def claimed(claim: Any, **_: Any) -> None:
    """The ``key_claimed`` and ``key_taken_over`` receiver (the attempt's own thread, inside
    its request): the claim keeps its request's executions, for a loss announced elsewhere."""
    gathered = executions.get()
    if gathered is not None:
        claim.__dict__[GATHERED] = gathered


def lost(claim: Any, **_: Any) -> None:
    """The ``lock_lost`` receiver (the renewer's thread): how long the owner's lock had lapsed
    as it learnt so (``lapsed``: seconds past the end its last renewal held it to; negative, a
    lock taken from an owner still holding it: no window, a bug). Written at the end of the
    claim's request, with every execution of it (a view's, or an ``idempotent_function``'s
    called in it); at once outside one (a Celery task)."""
    line = {
        "t": time.time(), "pid": os.getpid(), "record": str(claim.pk),
        "lapsed": time.monotonic() - claim.held_until,
    }  # fmt: skip
    gathered = claim.__dict__.get(GATHERED)
    if gathered is None:
        _write_lost(line, [])
    else:
        _lost[id(gathered)] = line


def _write_lost(line: dict[str, Any], gathered: list[str]) -> None:
    if os.environ.get("IDEMPOTENCY_VERIFY_LEDGER"):
        append_line(_ledger() / f"lost-{os.getpid()}.jsonl", {**line, "executions": gathered})


def _watch() -> None:
    if _watching["pid"] == os.getpid() or not os.environ.get("IDEMPOTENCY_VERIFY_LEDGER"):
        return
    _watching["pid"] = os.getpid()
    threading.Thread(target=_watcher, name="verification-pauses", daemon=True).start()


def _watcher() -> None:
    """Ticks every :data:`TICK`; a tick late by :data:`PAUSE` or more is a pause: the process
    (every thread of it, the lock's renewer too) did not run."""
    path = _ledger() / f"pauses-{os.getpid()}.jsonl"
    last, wall = time.monotonic(), time.time()
    while True:
        time.sleep(TICK)
        now, now_wall = time.monotonic(), time.time()
        if now - last - TICK >= PAUSE:
            append_line(path, {"start": wall, "end": now_wall, "pid": os.getpid()})
        last, wall = now, now_wall


def observed(folder: Path, effects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The faults the run's server processes saw of their own, as the history's ``fault``
    events (``observed``: no nemesis scheduled them): ``result-unstored``, from the first
    effect of its request to the error, naming the request's ``executions``; and
    ``worker-pause``, ``long`` when its lock could lapse in it (two thirds of it: renewed
    every third); and ``lock-lost``, from the first effect of its request to the loss, naming
    its ``executions``, ``long`` when the lock had lapsed before it was lost."""
    when = {effect["execution"]: effect["t"] for effect in effects}
    faults = []
    for line in read_lines(folder, "unstored-*.jsonl"):
        ran = [when[execution] for execution in line["executions"] if execution in when]
        faults.append({
            "type": "fault", "kind": "result-unstored", "observed": True, "long": True,
            "pid": line["pid"], "start": min(ran, default=line["t"]), "end": line["t"],
            "executions": line["executions"], "record": line["record"],
        })  # fmt: skip
    for line in read_lines(folder, "lost-*.jsonl"):
        ran = [when[execution] for execution in line["executions"] if execution in when]
        faults.append({
            "type": "fault", "kind": "lock-lost", "observed": True, "long": line["lapsed"] > 0,
            "pid": line["pid"], "start": min(ran, default=line["t"]), "end": line["t"],
            "executions": line["executions"], "record": line["record"], "lapsed": line["lapsed"],
        })  # fmt: skip
    for line in read_lines(folder, "pauses-*.jsonl"):
        faults.append({
            "type": "fault", "kind": "worker-pause", "observed": True, **line,
            "duration": line["end"] - line["start"],
            "long": line["end"] - line["start"] >= LOCK * 2 / 3,
        })  # fmt: skip
    return faults
