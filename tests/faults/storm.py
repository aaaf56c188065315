"""One fault under twenty keyed requests in flight, and what every key saw.

:func:`run` sends twenty keyed requests; once each view has run its side effect and waits at the
gate, the fault is injected; every key then gets a duplicate, three new keys are sent, replays of
keys finished before are sent when the fault is a read-only spell; the gate opens (the owners'
result writes meet the fault) and the fault ends. Every key is retried until it is answered with
its result or its deadline (the fault's end plus the lock plus 5 s) passes; new keys are sent
until one is served. :class:`Figures` holds the counts, and every broken promise in
``violations``:

The new keys sent during the fault come from a logged-in client (its scope is read from the
database); every other request is anonymous. A fault with a ``hold`` keeps the views waiting past
its end (renewal meets it, not the result write) while each key's duplicate keeps coming.

- a key whose effect ran other than once;
- an answer other than the result, its byte-identical replay, ``409`` or ``503`` (a ``500``),
  or none at all, or one later than the lock plus 5 s after the gate opened;
- a key not answered with its result by its deadline, or still ``processing`` after it;
- a new key answered ``409`` (nobody holds it), none served after the fault, a worker re-forked;
- a replay of a finished key not served during a read-only spell.

A fault that measures itself (``Fault.spell``: an outage that ends on its own clock, and the
moment a new connection got a statement through once it ended) is judged key by key: each
owner's lock is read on the server itself as the fault strikes, and a key may run twice only
when that lock ended less than ``Fault.lock_margin`` after the database answered again. What
ran twice beyond that had its lock taken while the database was there to renew it.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx

from django_idempotency._base.keys import hash_key
from django_idempotency._http.responses import REPLAYED_HEADER
from tests.faults.app import App
from tests.faults.views import ATOMIC_LABEL, LONG_LOCK, SHORT_LOCK

KEYS = 20
FRESH_DURING = 3
FINISHED_BEFORE = 3
#: Past the view's own lock, the slack the issue allows for settling.
SLACK = 5.0
FIGURES_VARIABLE = "IDEMPOTENCY_FAULT_FIGURES"
OPEN = "open"  # a gate that is always open
PESTER = 0.5  # seconds between a held key's duplicates (Fault.hold)


@dataclass
class Answer:
    key: str
    role: str  # owner, duplicate, retry, fresh, fresh-during, replay
    status: int | None  # None: no answer (the connection failed or timed out)
    body: bytes
    replayed: bool
    sent: float
    received: float
    error: str = ""
    retry_after: str = ""  # the answer's Retry-After header, if any

    @property
    def label(self) -> str:
        if self.status is None:
            return "no answer"
        return f"{self.status} replay" if self.replayed else str(self.status)


@dataclass(frozen=True)
class Spell:
    """What a fault measured of itself (``time.monotonic()``): when it began and ended, and when
    a new connection through the app's path to the database first got a statement through after
    it (a loaded machine takes that long to answer again: a pause, not the fault)."""

    began: float
    ended: float
    back: float


@dataclass
class Fault:
    """``inject`` runs once the views wait at the gate (before the keys are sent when
    ``early``); ``recover`` after it opened, and ends the fault (it sleeps for its length)."""

    name: str
    inject: Callable[[], None]
    recover: Callable[[], None] = lambda: None
    lock: int = SHORT_LOCK
    replays: bool = False
    #: Injected before the keys are sent (their views then run under the fault, no gate):
    #: for SQLite's atomic mode, whose one writer at a time cannot have twenty views in flight.
    early: bool = False
    #: How many times a key's effect may run: once, for every fault shorter than the lock.
    executions: frozenset[int] = frozenset({1})
    #: The new keys sent during the fault come from the logged-in client (its session read by
    #: Django's own statement first). Not under a blackhole on a pool: that read waits on a
    #: silenced pooled connection, which no bound of the app's reaches (docs/failure-modes.rst).
    logged_in: bool = True
    #: Renewal, not the result write, meets the fault (issue 39): the gate opens this long after
    #: the fault's end, and until then each key's duplicate is sent every :data:`PESTER` s, to
    #: take over any lock that lapsed while its owner still ran.
    hold: float = 0.0
    #: The view's path, when not the mode's own (``/two-phase/``).
    path: str = ""
    #: Every ``409`` and ``503`` must say when to retry (``Retry-After``): the Redis store's
    #: scenario (issue 44) asks it.
    retry_after: bool = False
    #: The fault's own measure of itself, called once it has ended (see the module's docstring).
    spell: Callable[[], Spell] | None = None
    #: With ``spell``: a key whose lock, as it was when the fault struck, outlasted the
    #: database's return by at least this many seconds must have run exactly once.
    lock_margin: float = 0.0


@dataclass
class Figures:
    database: str
    fault: str
    mode: str
    lock: int
    executions: dict[str, int] = field(default_factory=dict)  # "1": 20 keys ran once
    answers: dict[str, int] = field(default_factory=dict)  # by status ("201 replay", "503")
    slowest_answer: float = 0.0
    recovered_after: float | None = None  # the fault's end to the first new key served
    settled_after: float | None = None  # the fault's end to the last key answered its result
    fault_seconds: float = 0.0
    gathered: float = 0.0  # the first owner sent to the fault: how long the views waited
    violations: list[str] = field(default_factory=list)
    #: With ``Fault.spell``: how long the fault really lasted, how long after it a new
    #: connection got a statement through, and the owners' locks (seconds left when it struck).
    outage: float | None = None
    back_after: float | None = None
    locks_left: list[float] = field(default_factory=list)

    def line(self) -> str:
        executions = " ".join(f"{n}x:{count}" for n, count in sorted(self.executions.items()))
        answers = " ".join(f"{status}:{count}" for status, count in sorted(self.answers.items()))
        recovered = "never" if self.recovered_after is None else f"{self.recovered_after:.2f}s"
        settled = "never" if self.settled_after is None else f"{self.settled_after:.2f}s"
        return (
            f"FAULT {self.database:<10} {self.fault:<16} {self.mode:<9} lock {self.lock}s | "
            f"executions/key {executions} | answers {answers} | slowest {self.slowest_answer:.2f}s"
            f" | recovered {recovered} | settled {settled} | gathered {self.gathered:.1f}s"
            f"{self._spell()} | violations {len(self.violations)}"
        )

    def _spell(self) -> str:
        if self.outage is None or self.back_after is None or not self.locks_left:
            return ""
        return (
            f" | outage {self.outage:.2f}s back {self.back_after:.2f}s later, locks left "
            f"{min(self.locks_left):.2f}-{max(self.locks_left):.2f}s"
        )


class Store:
    """What the suite reads from the fault database: each key's executions and status."""

    def __init__(self, execute: Callable[..., list[tuple[Any, ...]]], marker: str = "%s"):
        self._execute = execute
        self._marker = marker

    def _sql(self, sql: str) -> str:
        return sql.replace("%s", self._marker)

    def atomic_executions(self, keys: list[str]) -> Counter[str]:
        rows = self._execute(
            self._sql("SELECT payload FROM testapp_execution WHERE label = %s"), [ATOMIC_LABEL]
        )
        wanted = set(keys)
        return Counter(key for (payload,) in rows if (key := payload.split()[0]) in wanted)

    def unlocks(self, keys: list[str]) -> dict[str, float]:
        """Each key's ``unlock_at`` (seconds since the epoch): read on the server itself, not
        through the app's path, so a fault of that path does not hide it."""
        return {key: _epoch(at) for key, at in self._column("unlock_at", keys) if at is not None}

    def statuses(self, keys: list[str]) -> dict[str, str]:
        return dict(self._column("status", keys))

    def _column(self, column: str, keys: list[str]) -> list[tuple[str, Any]]:
        """``column`` of each key's record, as (key, value)."""
        hashes = {hash_key(key): key for key in keys}
        marks = ", ".join(["%s"] * len(hashes))
        rows = self._execute(
            self._sql(
                f"SELECT key_hash, {column} FROM django_idempotency_idempotencykey "
                f"WHERE key_hash IN ({marks})"
            ),
            list(hashes),
        )
        return [(hashes[key_hash], value) for key_hash, value in rows]


def _epoch(at: datetime) -> float:
    """A time the app wrote: MariaDB gives it back naive, in UTC."""
    return (at if at.tzinfo else at.replace(tzinfo=timezone.utc)).timestamp()


def file_executions(folder: Path, keys: list[str]) -> Counter[str]:
    wanted = set(keys)
    return Counter(key for key in _lines(folder / "effects") if key in wanted)


def _last_server_error(log: str) -> str:
    """The app log's last ``500`` with its traceback: in the failure's own message, which CI
    shows whole where the log printed before it is cut (a 500 before the fault, once)."""
    at = log.rfind("ERROR django.request: Internal Server Error")
    if at < 0:
        return ""
    return "\nthe last 500 in the app's log:\n" + log[at:][:6000]


def _lines(path: Path) -> list[str]:
    try:
        return [line.split()[0] for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


class Scenario:
    """One run of one fault on one app (see the module's docstring)."""

    def __init__(self, app: App, store: Store, database: str, fault: Fault, mode: str) -> None:
        assert mode in ("two-phase", "atomic")
        self.app, self.store, self.fault, self.mode = app, store, fault, mode
        suffix = "-long" if fault.lock == LONG_LOCK else ""
        self.path = fault.path or f"/{mode}{suffix}/"
        self.bound = fault.lock + SLACK
        self.gate = uuid.uuid4().hex[:16]
        self.gate_opened: float | None = None
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        self.figures = Figures(database, fault.name, mode, fault.lock)
        #: With ``Fault.spell``: each owner's lock when the fault struck (its ``unlock_at``, and
        #: the wall clock then), and when it was read (it must be before the fault ended).
        self.locks: dict[str, float] = {}
        self.struck = 0.0
        self.locks_read = 0.0
        (app.folder / f"gate-{OPEN}").touch()

    def send(self, key: str, role: str, gate: str | None = None) -> Answer:
        """POST ``key``; the new keys sent during the fault come from a logged-in client."""
        sent = time.monotonic()
        cookies = self.app.session if role == "fresh-during" and self.fault.logged_in else None
        try:
            response = httpx.post(
                self.app.url + self.path,
                json={"amount": 4200},
                headers={"Idempotency-Key": key, "X-Gate": gate or self.gate},
                cookies=cookies,
                timeout=self.bound + 60,
            )
        except httpx.HTTPError as exc:
            answer = Answer(key, role, None, b"", False, sent, time.monotonic(), repr(exc))
        else:
            answer = Answer(
                key,
                role,
                response.status_code,
                response.content,
                response.headers.get(REPLAYED_HEADER) == "true",
                sent,
                time.monotonic(),
                retry_after=response.headers.get("Retry-After", ""),
            )
        with self._lock:
            self.answers.append(answer)
        return answer

    def run(self) -> Figures:
        fault, figures = self.fault, self.figures
        finished = [str(uuid.uuid4()) for _ in range(FINISHED_BEFORE if fault.replays else 0)]
        originals = {key: self.send(key, "before", OPEN) for key in finished}
        keys = [str(uuid.uuid4()) for _ in range(KEYS)]
        booted = self.app.booted()
        with ThreadPoolExecutor(max_workers=4 * KEYS) as pool:
            if fault.early:
                fault_started = time.monotonic()
                fault.inject()
                self._open_gate()
            sent = time.monotonic()
            owners = {key: pool.submit(self.send, key, "owner") for key in keys}
            if not fault.early:
                self._wait_started(keys, owners)
                fault_started = time.monotonic()
                figures.gathered = round(fault_started - sent, 2)
                self.struck = time.time()
                fault.inject()
                if fault.spell is not None:
                    self.locks = self.store.unlocks(keys)
                    self.locks_read = time.monotonic()
            for key in keys:
                pool.submit(self.send, key, "duplicate")
            for _ in range(FRESH_DURING):
                pool.submit(self.send, str(uuid.uuid4()), "fresh-during", OPEN)
            replays = [(key, self.send(key, "replay", OPEN)) for key in finished]
            pestering = threading.Event()
            if fault.hold:
                for key in keys:
                    pool.submit(self._pester, key, pestering)
            elif not fault.early:
                self._open_gate()
            fault.recover()
            fault_end = time.monotonic()
            if fault.hold:
                pool.submit(self._open_gate_at, fault_end + fault.hold, pestering)
            figures.fault_seconds = round(fault_end - fault_started, 2)
            deadline = fault_end + fault.lock + SLACK
            settling = {key: pool.submit(self._settle, key, owners[key], deadline) for key in keys}
            figures.recovered_after = self._first_served(fault_end, deadline)
            settled = {key: future.result() for key, future in settling.items()}
        self._judge(keys, settled, fault_end, replays, originals, booted)
        self._record()
        return figures

    def _open_gate(self) -> None:
        (self.app.folder / f"gate-{self.gate}").touch()
        self.gate_opened = time.monotonic()

    def _pester(self, key: str, stop: threading.Event) -> None:
        while not stop.wait(PESTER):
            self.send(key, "duplicate")

    def _open_gate_at(self, when: float, pestering: threading.Event) -> None:
        time.sleep(max(0.0, when - time.monotonic()))
        pestering.set()
        self._open_gate()

    def _wait_started(self, keys: list[str], owners: dict[str, Future[Answer]]) -> None:
        """Until every owner runs its view (past its effect) and waits at the gate."""
        deadline = time.monotonic() + 60
        while not set(keys) <= set(_lines(self.app.folder / "started")):
            early = [f.result() for f in owners.values() if f.done()]
            if early or time.monotonic() > deadline:
                (self.app.folder / f"gate-{self.gate}").touch()  # release the rest
                started = set(keys) & set(_lines(self.app.folder / "started"))
                try:
                    health = str(httpx.get(f"{self.app.url}/health/", timeout=5).status_code)
                except httpx.HTTPError as exc:
                    health = repr(exc)
                raise AssertionError(
                    f"(the app's /health/: {health}) "
                    f"{len(started)} of the {KEYS} owners reached the gate before the fault; "
                    f"answered early: {[(a.status, a.body[:200]) for a in early]}"
                    f"{_last_server_error(self.app.log())}"
                )
            time.sleep(0.02)

    def _settle(self, key: str, owner: Future[Answer], deadline: float) -> float | None:
        """Retry ``key`` until a retry is answered with its result (the owner's own answer
        does not say the result was stored): when, or ``None``."""
        answer = owner.result()
        while True:
            if answer.role == "retry" and answer.status is not None and 200 <= answer.status < 300:
                return answer.received
            if time.monotonic() > deadline:
                return None
            time.sleep(0.2)
            answer = self.send(key, "retry")

    def _first_served(self, since: float, deadline: float) -> float | None:
        while time.monotonic() < deadline:
            answer = self.send(str(uuid.uuid4()), "fresh", OPEN)
            if answer.status is not None and 200 <= answer.status < 300:
                return round(answer.received - since, 2)
            time.sleep(0.05)
        return None

    def _judge(
        self,
        keys: list[str],
        settled: dict[str, float | None],
        fault_end: float,
        replays: list[tuple[str, Answer]],
        originals: dict[str, Answer],
        booted: set[int],
    ) -> None:
        figures, violations = self.figures, self.figures.violations
        if self.mode == "atomic":
            executions = self.store.atomic_executions(keys)
        else:
            executions = file_executions(self.app.folder, keys)
        figures.executions = dict(Counter(str(executions[key]) for key in keys))
        lapsed, locks = self._lapsed(keys)
        for key in keys:
            if executions[key] in self.fault.executions or (key in lapsed and executions[key] == 2):
                continue
            violations.append(f"{key}: its effect ran {executions[key]} times{locks.get(key, '')}")
        figures.answers = dict(Counter(answer.label for answer in self.answers))
        assert self.gate_opened is not None
        results: dict[str, set[bytes]] = {}
        for answer in self.answers:
            if answer.status is None:
                violations.append(f"{answer.key} ({answer.role}): no answer: {answer.error}")
                continue
            took = answer.received - max(answer.sent, self.gate_opened)
            figures.slowest_answer = max(figures.slowest_answer, round(took, 2))
            if took > self.bound:
                violations.append(f"{answer.key} ({answer.role}): answered after {took:.1f} s")
            if answer.status not in (200, 201, 409, 503):
                violations.append(
                    f"{answer.key} ({answer.role}): {answer.status} {answer.body[:300]!r}"
                )
            if self.fault.retry_after and answer.status in (409, 503) and not answer.retry_after:
                violations.append(f"{answer.key} ({answer.role}): {answer.status} without "
                                  "Retry-After")  # fmt: skip
            if answer.status == 409 and answer.role.startswith("fresh"):
                violations.append(f"{answer.key} ({answer.role}): 409 for a key nobody holds")
            if answer.role in ("owner", "duplicate", "retry") and 200 <= answer.status < 300:
                results.setdefault(answer.key, set()).add(answer.body)
        for key, bodies in results.items():
            if executions[key] > 1:  # allowed by the fault: each run answered its own result
                bodies = {a.body for a in self.answers if a.key == key and a.replayed}
            if len(bodies) > 1:
                violations.append(f"{key}: {len(bodies)} different results: {sorted(bodies)}")
        unsettled = [key for key, when in settled.items() if when is None]
        for key in unsettled:
            violations.append(f"{key}: not answered with its result by the fault's end + "
                              f"{self.fault.lock + SLACK:.0f} s")  # fmt: skip
        if not unsettled:
            figures.settled_after = round(max(w for w in settled.values() if w) - fault_end, 2)
        statuses = self.store.statuses(keys)
        for key in keys:
            if statuses.get(key) == "processing":
                violations.append(f"{key}: still processing after its deadline")
        if figures.recovered_after is None:
            violations.append("no new key was served after the fault")
        if reforked := self.app.booted() - booted:
            violations.append(f"workers re-forked during the fault: {sorted(reforked)}")
        for key, replay in replays:
            original = originals[key]
            if replay.status != original.status or replay.body != original.body:
                violations.append(
                    f"{key}: replay of a finished key during the spell: {replay.status} "
                    f"{replay.body[:200]!r} (stored {original.status})"
                )

    def _lapsed(self, keys: list[str]) -> tuple[set[str], dict[str, str]]:
        """With ``Fault.spell``: the keys whose lock ended before the database answered again
        plus ``Fault.lock_margin`` (each may run twice), and what each key's lock had left."""
        if self.fault.spell is None:
            return set(), {}
        spell, figures = self.fault.spell(), self.figures
        figures.outage = round(spell.ended - spell.began, 2)
        figures.back_after = round(spell.back - spell.ended, 2)
        if self.locks_read > spell.ended:
            figures.violations.append("the owners' locks were read after the fault ended")
        said: dict[str, str] = {}
        lapsed: set[str] = set()
        for key in keys:
            if key not in self.locks:
                figures.violations.append(f"{key}: no lock to read when the fault struck")
                continue
            left = self.locks[key] - self.struck
            figures.locks_left.append(round(left, 2))
            spare = left - (spell.back - spell.began)
            said[key] = (
                f" (its lock had {left:.2f}s left when the fault struck; the database answered "
                f"again {spell.back - spell.began:.2f}s after it began)"
            )
            if spare < self.fault.lock_margin:
                lapsed.add(key)
        return lapsed, said

    def _record(self) -> None:
        print(f"\n{self.figures.line()}")
        if path := os.environ.get(FIGURES_VARIABLE):
            with open(path, "a") as out:
                out.write(json.dumps(asdict(self.figures)) + "\n")


def run(app: App, store: Store, database: str, fault: Fault, mode: str) -> Figures:
    return Scenario(app, store, database, fault, mode).run()


def check(figures: Figures, app: App) -> None:
    """Fail with every violation, and the app's log when there is one."""
    if figures.violations:
        listed = "\n".join(figures.violations[:40])
        more = len(figures.violations) - 40
        raise AssertionError(
            f"{figures.line()}\n{listed}" + (f"\n... and {more} more" if more > 0 else "")
            + f"\n----- app log (end) -----\n{app.log()[-6000:]}"
        )  # fmt: skip


__all__ = ["LONG_LOCK", "SHORT_LOCK", "Fault", "Figures", "Spell", "Store", "check", "run"]
