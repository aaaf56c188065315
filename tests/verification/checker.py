"""The invariants, checked on a whole history (a list of events, as ``run.py`` records them).

Events (JSON objects, ``type`` first):

- ``invoke``: ``op``, ``t`` (seconds, the clients' clock), ``principal``, ``key``, ``entry``,
  ``body`` (a hash), ``auth`` (how the client proved its principal: ``token``, ``basic``,
  ``session``, ``api-key``, ``none``);
- ``complete``: ``op``, ``t``, ``status`` (``None``: no answer, ``error`` says why),
  ``response`` (a hash of the body's bytes), ``replayed``, ``execution`` and ``as`` (the
  execution and principal a 2xx answer names), ``first`` (a ``/steps/`` answer's first step);
- ``effect``: what a view ran (its ledger line): ``t``, ``entry``, ``principal``, ``key``,
  ``body``, ``execution``, ``pid``; an outbox view's also ``message`` (the id it staged) and
  ``fails`` (an attempt that answered ``503`` on purpose: it keeps nothing); an ``/export/``
  view's also ``operation`` (its operation's id, which its ``202``'s ``Location`` ends with;
  older histories lack it); a ``/steps/`` view's also ``step`` (1 or 2), ``attempt`` (the
  claim's) and, for the second step, ``first`` (the first step's execution it built on) and
  ``resumed`` (its attempt started from the recovery point); a takeover's also ``born``
  (its record's birth as the store gave it: a claim sent into a frozen store is made when
  the store thaws, later than its request);
- ``point``: a ``/steps/`` view's recovery point saved (``set_recovery_point`` returned):
  ``t``, ``principal``, ``key``, ``execution`` (the first step it names), ``attempt``;
- ``delivery``: a start of the consumer's Celery task (``message``, ``args``: the execution
  that staged it; ``retries``; an ``/export/`` message's ``operation``);
- ``consumed``: the consumer's effect for a message (``message``, ``execution``);
- ``undrained``: the outbox still held undelivered messages when the run stopped waiting;
- ``fault``: ``kind``, ``start``, ``end``, ``pid`` (a worker's, the relay's or the Celery
  worker's; a ``consumer-kill``'s also ``mid_task``), ``long`` (longer than the
  lock can outlive); a ``db-failover``'s also ``mode`` (``sync`` or ``async`` replication),
  ``promoted`` (when the standby was promoted and the proxy pointed at it), ``standby`` (when
  a new standby streamed) and ``behind`` (bytes of WAL the primary had flushed and the
  standby had not received);
- ``unsettled``: ``op``: a client with no final answer when the run's settling time was up;
- ``poll``: a GET of an operation's status URL (``operation``) that a ``202`` gave ``owner``,
  sent as ``principal`` (the owner or another): ``status``, the operation's ``state`` and the
  ``execution`` its final response names; ``final``: sent once every key had settled.

Invariant 9 is the recovery point's (docs/recovery.rst): an effect before a recovery point
that was saved never runs again in its record life (a later attempt resumes from the point),
every second step builds on a first step whose point was saved, and an answer names the steps
that ran together.

Each violation names its invariant (the issue's numbering), the key it is about and what was
seen; :func:`shrink` cuts a violation's history down to the fewest events that still show it.
A violation of invariant 1, 2 or 5 with a ``db-failover`` in its time carries that fault as
``failover``: with asynchronous replication, a write the primary acknowledged and its standby
never had (the violation stands; replication that does not wait cannot keep the promise).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any
from urllib.parse import unquote

Event = dict[str, Any]

#: Seconds of slack on a TTL's edge (the clients' clock and the servers' may differ by the
#: time a request takes to reach the view).
EDGE = 1.0
#: Faults of the workers a view's own process suffers; the others hit every owner at once
#: (the relay's death none: its messages are sent again once their lease passes; nor the
#: Celery worker's: its messages come back to the next one).
WORKER_FAULTS = {"worker-kill", "worker-stop", "worker-pause"}
#: A worker that did not run for a while: SIGSTOPped by the nemesis, or paused as its process
#: saw it (witness.py: the machine's load).
STOPS = frozenset({"worker-stop", "worker-pause"})
#: An owner's result it could not store (it logged so, SPEC 4a): a retry once its lock lapsed
#: runs the view again. Observed by the owner's process (witness.py), naming its executions.
UNSTORED = "result-unstored"
#: An owner that learnt its lock was taken once it had lapsed (its renewals failed past the
#: lock's end, witness.py): each execution of its request, before the loss or after, is a late
#: owner's. One taken from an owner that still held it is no window (``long`` false).
LOST = "lock-lost"
#: The server overloaded (a trivial request answered late, run.py's pulse): a request left
#: unanswered in its time is excused, no double run is.
OVERLOAD = "server-slow"
FAILOVER = "db-failover"
#: The invariants a lost write breaks: a claim lost runs the view again (1), a result lost
#: answers anew (2, 5), a recovery point lost runs its step again (9).
LOSSES = (1, 2, 5, 9)
#: Entry points whose operation a background task completes (``complete_operation``): once
#: every key has settled, each is ``succeeded``.
COMPLETED_BY_TASK = frozenset({"export"})
#: A store down: its owners renew nothing, from the fault's start to its end as measured (a
#: restart's start takes its time on a loaded machine: a 1 s ``redis-kill`` kept Redis away
#: 4.3 s, past the lock), and one fault followed at once by another is one outage.
OUTAGES = {"db-blackhole", "db-restart", "db-read-only", "redis-stop", "redis-kill"}
#: Seconds between two outages that leave an owner no time to renew.
ADJACENT = 0.1


@dataclass
class Limits:
    lock: float
    ttl: dict[str, float]
    #: Entry points whose effect commits with the result (atomic mode): never twice.
    atomic: frozenset[str] = frozenset({"atomic"})
    #: A stopped worker stops every owner (SQLite: it may hold the database's only write lock).
    worker_faults_global: bool = False


@dataclass
class Result:
    violations: list[dict[str, Any]] = field(default_factory=list)
    windows: list[dict[str, Any]] = field(default_factory=list)

    def violate(self, invariant: int, key: tuple[str, str], what: str, **seen: Any) -> None:
        self.violations.append(
            {"invariant": invariant, "principal": key[0], "key": key[1], "what": what, **seen}
        )


def _excuse(
    first: Event, second: Event, faults: list[Event], limits: Limits, acked: dict[str, float],
    proved: float = float("inf"),
) -> Event | None:  # fmt: skip
    """The fault that let ``second`` run again after ``first`` (SPEC 4a's window): the owner's
    worker killed, or a fault longer than its remaining lock (at least two thirds of the lock,
    renewed) between the two effects; a worker stopped so long is either effect's (the late
    owner's view may run before the taker's, or after it resumes). No fault that began once
    ``first``'s answer had reached a client (``acked``: when an answer first named each
    execution) is one, a failover's neither: the result was stored (durably: the servers
    fsync) before it was answered, and a promoted standby must have it. Once a replay had
    shown the life's result stored (``proved``), only ``second``'s own worker stopped since
    before it (a late owner's view) is one. An owner that said it could not store
    ``first``'s result (:data:`UNSTORED`) is one whenever nothing showed it stored: it
    answered, and left the record to a retry. An owner that lost its lapsed lock (:data:`LOST`)
    is one for either of its executions."""
    if first["entry"] in limits.atomic:
        return None
    for fault in faults:
        mine = fault["kind"] == LOST and fault["long"]
        if mine and {first["execution"], second["execution"]} & set(fault["executions"]):
            return fault
    if proved >= second["t"] - EDGE:
        for fault in faults:
            if fault["kind"] == UNSTORED and first["execution"] in fault["executions"]:
                return fault
    answered = acked.get(first["execution"], float("inf"))
    if proved < second["t"] - EDGE:
        faults = [
            fault
            for fault in faults
            if fault["kind"] in STOPS
            and fault.get("pid") == second["pid"]
            and fault["start"] <= proved
        ]
    for fault in faults:
        if fault["kind"] in (UNSTORED, OVERLOAD, LOST):  # the owner's own, above; no lock's
            continue
        if fault["start"] > second["t"] or fault["end"] < first["t"] - EDGE:
            continue
        if answered < fault["start"]:
            continue
        # A worker stopped between its claim and its view is a late owner too: its view runs
        # once it resumes, after a retry took the record over and ran it (``second``'s). Its
        # stop began by the first effect, and its view ran as it resumed; a stop that began
        # later found both owners holding the key at once.
        late = (
            fault["kind"] in STOPS
            and fault["start"] <= first["t"]
            and second["t"] <= fault["end"] + EDGE
        )
        owners = (first["pid"], second["pid"]) if late else (first["pid"],)
        if (
            fault["kind"] in WORKER_FAULTS
            and fault.get("pid") not in owners
            and not (limits.worker_faults_global and fault["kind"] in STOPS)
        ):
            continue
        if fault["kind"] == "worker-kill" and fault["start"] >= first["t"] - EDGE:
            return fault
        if fault.get("long") or _outage(fault, faults) >= limits.lock * 2 / 3:
            return fault
    return None


def _took_over(
    life: list[Event], run: Event, held: float, faults: list[Event], limits: Limits,
    acked: dict[str, float], replayed: dict[str, float],
) -> bool:  # fmt: skip
    """Whether ``run``, past its life's TTL as the life's first request bounds it, may be a
    takeover of the life's record instead of a new life's claim: its record lived until at
    least its first run's TTL (it was claimed before that run) or a taker's lock's end (a
    takeover holds the record past its lock: ``held``), and a fault let the life's last run
    lapse (:func:`_excuse`), and no replay had shown the life's result stored (a completed
    record is replayed until it expires, never taken over). A soak's ``/short-ttl/`` key:
    its owner's result unstored under a 5 s blackhole, a retry took its record over 6.0 s
    after the key's first request and ran it; a later request, once that taker's lock
    passed, began a new life, which the checker had counted in the taker's (a double run)."""
    proved = min((replayed.get(each["execution"], float("inf")) for each in life), default=0.0)
    return (
        bool(life)
        and run["body"] == life[-1]["body"]  # a takeover is of the same request
        and run["t"] < held + EDGE
        and proved >= run["t"] + EDGE  # a record shown completed is replayed, never taken over
        and _excuse(life[-1], run, faults, limits, acked, proved) is not None
    )


def _expiry(
    source: Event, ran: Event, asked: Event, faults: list[Event], stored: float, limits: Limits
) -> float:
    """When ``source``'s record may expire (its TTL from its run, and the edge): later when a
    store outage, or a stop of an owner's worker (``source``'s, or ``ran``'s: the run the
    answer names), held an owner's renewals and result write, for a renewal that lands holds
    the record until its lock's end (SPEC 4a), and one may land as late as the result, stored
    before it was first answered (``stored``). A soak's Redis frozen 5.3 s under a 6 s TTL:
    the owner's renewal and result landed when it thawed, and the record lived 3 s on; a
    SQLite soak's owner stopped 5.2 s: the same as it resumed. An outage once the result was
    stored held nothing: the owner had no renewal left to send."""
    expiry = source["t"] + limits.ttl[asked["entry"]]
    held = any(
        (_holds_owner(fault, source, limits) or _holds_owner(fault, ran, limits))
        and fault["start"] <= stored
        and fault["end"] >= source["t"]
        for fault in faults
    )
    if held:
        expiry = max(expiry, stored + limits.lock)
    if ran is not source:  # a takeover holds the record past its lock's end (its claim's
        expiry = max(expiry, ran["t"] + limits.lock)  # bound: its run)
    return expiry + EDGE


def _holds_owner(fault: Event, source: Event, limits: Limits) -> bool:
    """Whether ``fault`` holds the writes of ``source``'s owner while it lasts: a store outage,
    or a stop of its worker (of any worker, with ``worker_faults_global``)."""
    if fault["kind"] in OUTAGES:
        return True
    owner = fault.get("pid") == source["pid"] or limits.worker_faults_global
    return fault["kind"] in STOPS and owner


def _outage(fault: Event, faults: list[Event]) -> float:
    """Seconds of the store outage ``fault`` is part of, as measured: it and the outages
    adjacent to it (``faults`` in order of start); ``0`` for a fault that is no outage."""
    if fault["kind"] not in OUTAGES:
        return 0.0
    start, end = fault["start"], fault["end"]
    grown = True
    while grown:  # a chain grows both ways, one adjacent outage at a time
        grown = False
        for other in faults:
            if other["kind"] not in OUTAGES or other["start"] > end + ADJACENT:
                continue
            if other["end"] >= start - ADJACENT and (other["start"] < start or other["end"] > end):
                start, end = min(start, other["start"]), max(end, other["end"])
                grown = True
    return float(end - start)


def check(history: Iterable[Event], limits: Limits) -> Result:
    events = list(history)
    result = Result()
    invokes = {e["op"]: e for e in events if e["type"] == "invoke"}
    completes = {e["op"]: e for e in events if e["type"] == "complete" and e["op"] in invokes}
    faults = sorted((e for e in events if e["type"] == "fault"), key=lambda e: e["start"])
    acked: dict[str, float] = {}
    for done in completes.values():
        status = done["status"]
        if status is not None and 200 <= status < 300 and status != 202 and done.get("execution"):
            acked[done["execution"]] = min(done["t"], acked.get(done["execution"], done["t"]))
    effects: dict[tuple[str, str], list[Event]] = defaultdict(list)
    for effect in events:
        # An attempt that failed on purpose released its record: a retry runs anew.
        if effect["type"] == "effect" and not effect.get("fails"):
            effects[effect["principal"], effect["key"]].append(effect)

    # Record lives: a key's effects, a new life once the TTL of the record of the life's first
    # effect may have passed. That record was claimed at the earliest by the first request
    # for the key sent since the life before began (a claim may wait long under a fault), and
    # not before the life before's record could expire: a request of that life (a retry an
    # hour before) is no bound, and taken for one it split a life that began at the TTL's end
    # in two (an hour's soak: a second step parted from its first, a double run unseen).
    asked_at: dict[tuple[str, str], list[float]] = defaultdict(list)
    for asked in invokes.values():
        asked_at[asked["principal"], asked["key"]].append(asked["t"])
    life_of: dict[str, tuple[tuple[str, str], int]] = {}
    lives: dict[tuple[tuple[str, str], int], list[Event]] = {}
    replayed: dict[str, float] = {}  # when a replay first named each execution
    for done in completes.values():
        if done.get("replayed") and done.get("execution"):
            replayed[done["execution"]] = min(done["t"], replayed.get(done["execution"], done["t"]))
    for key, runs in effects.items():
        runs.sort(key=lambda e: e["t"])

        def claimed(after: float, run: Event, key: tuple[str, str] = key) -> float:
            return min([t for t in asked_at[key] if after < t <= run["t"]], default=run["t"])

        number, previous = 0, float("-inf")
        start = claimed(previous, runs[0])
        held = runs[0]["t"] + limits.ttl[runs[0]["entry"]]
        for run in runs:
            ttl = limits.ttl[run["entry"]]
            life = lives.get((key, number), [])
            if run["t"] - start >= ttl - EDGE and not _took_over(
                life, run, held, faults, limits, acked, replayed
            ):
                number, previous = number + 1, start
                start = max(claimed(previous, run), previous + ttl - EDGE)
                if run.get("born", 0) > run["t"] - ttl:  # a takeover of a record still alive:
                    start = min(start, run["born"])  # born when it was, maybe in a fault
                held = run["t"] + ttl
            held = max(held, run["t"] + limits.lock)
            lives.setdefault((key, number), []).append(run)
            life_of[run["execution"]] = (key, number)

    # 1 and 4: one effect per life (per step: a /steps/ view has two), of one body; 9: none
    # before a saved recovery point again.
    saved = {e["execution"]: e for e in events if e["type"] == "point"}
    late: set[str] = set()  # executions run again in a window: their answers are excused
    proved: dict[tuple[tuple[str, str], int], float] = {}  # a life's first replay
    for done in completes.values():
        life = life_of.get(done.get("execution") or "")
        if done.get("replayed") and life is not None:
            proved[life] = min(proved.get(life, done["t"]), done["t"])
    for (key, number), runs in lives.items():
        steps: dict[Any, list[Event]] = defaultdict(list)
        for run in runs:
            steps[run.get("step")].append(run)
        # Each run again is excused, or not, by a fault since the run before it: one window
        # (the life's first owner killed) excuses no run long after it.
        pairs = [
            (group[0], before, again)
            for group in steps.values()
            for before, again in pairwise(group)
        ]
        for first, before, again in pairs:
            if again["body"] != first["body"]:
                result.violate(
                    4, key, "a changed body ran under a used key", effects=[first, again]
                )
                continue
            point = _point_before(steps[again.get("step")], again, saved)
            if point is not None:
                result.violate(9, key, "an effect before a saved recovery point ran again "
                               "in its record life", effects=[first, again],
                               points=[point])  # fmt: skip
                continue
            fault = _excuse(
                before, again, faults, limits, acked, proved.get((key, number), float("inf"))
            )
            if fault is None:
                result.violate(
                    1, key, "a view ran twice in one record life", effects=[before, again]
                )
            else:
                late.update((before["execution"], again["execution"]))
                result.windows.append(
                    {"principal": key[0], "key": key[1], "life": number, "fault": fault,
                     "executions": [before["execution"], again["execution"]]}
                )  # fmt: skip

    _check_steps(lives, result)

    by_execution = {run["execution"]: run for runs in lives.values() for run in runs}
    asked_at_bodies: dict[tuple[str, str], list[tuple[float, str]]] = defaultdict(list)
    for asked in invokes.values():
        asked_at_bodies[asked["principal"], asked["key"]].append((asked["t"], asked["body"]))
    # Answers, in the order they came.
    answered: dict[tuple[str, str], list[tuple[Event, Event]]] = defaultdict(list)
    for op, done in sorted(completes.items(), key=lambda item: item[1]["t"]):
        asked = invokes[op]
        key = (asked["principal"], asked["key"])
        status = done["status"]
        if status is not None and status >= 500 and status != 503:
            result.violate(8, key, f"answered {status}", op=[asked, done])
        _check_refusal(asked, done, asked_at_bodies[key], faults, result)
        if status is None or not 200 <= status < 300 or status == 202:
            continue  # a 202 is "still running" (its operation is invariant 7's), not an answer
        if done.get("as") != asked["principal"]:  # 3
            result.violate(3, key, f"{done.get('as')}'s answer reached {asked['principal']}",
                           op=[asked, done])  # fmt: skip
            continue
        found = life_of.get(done.get("execution") or "")
        if found is None or found[0] != key:
            result.violate(2, key, "an answer no effect of this key made", op=[asked, done])
            continue
        source = lives[found][0]
        if asked["body"] != source["body"]:  # 4
            result.violate(4, key, "a changed body was answered 2xx, not 422", op=[asked, done])
            continue
        ran = by_execution.get(done["execution"], {})
        if ran.get("step") == 2 and done.get("first") != ran.get("first"):  # 9
            result.violate(9, key, "an answer names steps that did not run together",
                           op=[asked, done], effects=[ran])  # fmt: skip
            continue
        stored = acked.get(done["execution"], asked["t"])  # its result, by its first answer
        expiry = _expiry(source, ran or source, asked, faults, stored, limits)
        if done.get("replayed") and asked["t"] > expiry:
            result.violate(5, key, "an expired record was replayed", op=[asked, done])
            continue
        answered[key].append((asked, done))

    for key, answers in answered.items():
        first_of_life: dict[tuple[tuple[str, str], int], tuple[Event, Event]] = {}
        replay_of_life: dict[tuple[tuple[str, str], int], tuple[Event, Event]] = {}
        for asked, done in answers:
            life = life_of[done["execution"]]
            if done.get("replayed"):
                # 2, always: every replay is the one stored answer (a window's too: the late
                # owner's result is fenced off, whatever its own client was given).
                stored = replay_of_life.setdefault(life, (asked, done))
                if _answer(done) != _answer(stored[1]):
                    result.violate(2, key, "two replays differ", op=[*stored, asked, done])
                    continue
            if life not in first_of_life:
                first_of_life[life] = (asked, done)
                continue
            first_asked, first_done = first_of_life[life]
            # In a window, the late owner's client gets the view's own answer (SPEC 4a).
            excused = done["execution"] in late or first_done["execution"] in late
            if _answer(done) != _answer(first_done) and not excused:  # 2
                result.violate(2, key, "a later answer differs from the first",
                               op=[first_asked, first_done, asked, done])  # fmt: skip
            elif (
                asked["t"] > first_done["t"]
                and asked["t"] < first_done["t"] + limits.ttl[asked["entry"]] - EDGE
                and not done.get("replayed")
                and not excused
            ):  # 5: a result acknowledged, then run again as if lost
                result.violate(5, key, "a retry after a final answer was not a replay",
                               op=[first_asked, first_done, asked, done])  # fmt: skip

    _check_outbox(events, answered, life_of, result)
    _check_operations(events, answered, effects, limits, result)

    for event in events:  # 8: a key that never settled
        if event["type"] == "unsettled" and event["op"] in invokes:
            asked = invokes[event["op"]]
            result.violate(8, (asked["principal"], asked["key"]), "no final answer after healing",
                           op=[asked])  # fmt: skip
    _attribute_failovers(result, [fault for fault in faults if fault["kind"] == FAILOVER])
    return result


#: The faults that touch no web request: the relay's and the consumer's processes.
BACKGROUND = ("relay-kill", "consumer-kill")

#: The answers other than ``2xx`` the workload's requests may get: ``409`` (in progress),
#: ``422`` (another body), ``503`` (a fault, or a failure on purpose).
REFUSALS = (409, 422, 503)


def _check_refusal(
    asked: Event, done: Event, bodies: list[tuple[float, str]], faults: list[Event],
    result: Result,
) -> None:  # fmt: skip
    """4 and 8 for an answer that is not a success: a changed body under a used key answered
    anything but ``422`` or a transient refusal (``400`` say) is 4; any other ``4xx`` is 8;
    and a request left unanswered (its connection dropped) when no fault touched its time
    (a worker crashed, or hung until gunicorn's timeout) is 8."""
    key = (asked["principal"], asked["key"])
    status = done["status"]
    if status is None:
        if not any(f["start"] <= done["t"] and asked["t"] <= f.get("end", f["start"]) + EDGE
                   for f in faults if f["kind"] not in BACKGROUND):  # fmt: skip
            result.violate(8, key, "left unanswered with no fault", op=[asked, done])
        return
    if not 400 <= status < 500 or status in REFUSALS:
        return
    changed = any(t < asked["t"] and body != asked["body"] for t, body in bodies)
    result.violate(4 if changed else 8, key, f"answered {status}", op=[asked, done])


def _answer(done: Event) -> tuple[Any, Any]:
    """What a client got, as far as the history holds it: the status and the body's hash (a
    replay is the stored answer in both, ``201`` answered ``200`` is not it)."""
    return done["status"], done["response"]


def _point_before(group: list[Event], again: Event, saved: dict[str, Event]) -> Event | None:
    """The recovery point saved after an earlier effect of ``again``'s step (``group``: the
    step's effects in its record life, in time order) by an attempt before ``again``'s:
    ``again``'s attempt claimed the record at that point (a takeover comes after the point's
    write, which the owner's lock token fences), and must have resumed from it. ``None``:
    none (a late owner, whose point the fence then refuses, is an older attempt)."""
    attempt = again.get("attempt")
    if attempt is None:
        return None
    for earlier in group:
        if earlier is again:
            return None
        point = saved.get(earlier["execution"])
        if point is not None and point.get("attempt", attempt) < attempt:
            return point
    return None


def _check_steps(lives: dict[tuple[tuple[str, str], int], list[Event]], result: Result) -> None:
    """9: every second step builds on a first step that ran in its record life: its own
    attempt's, or, resumed, the one its recovery point names (saved: a worker killed between
    the point's write and its line in the ledger leaves the point without its line)."""
    for (key, _), runs in lives.items():
        firsts = {run["execution"]: run for run in runs if run.get("step") == 1}
        for run in runs:
            if run.get("step") != 2:
                continue
            first = firsts.get(run.get("first") or "")
            if first is None:
                result.violate(9, key, "a second step built on no first step of its record "
                               "life", effects=[run])  # fmt: skip
            elif not run.get("resumed") and first.get("attempt") != run.get("attempt"):
                result.violate(9, key, "a second step built on another attempt's first step "
                               "without resuming from its point", effects=[first, run])  # fmt: skip


def _attribute_failovers(result: Result, failovers: list[Event]) -> None:
    """Each violation of a lost write's kind gets the failover that began within its time
    (from its first event, less :data:`EDGE`, to its last) as ``failover``."""
    if not failovers:
        return
    for violation in result.violations:
        if violation["invariant"] not in LOSSES:
            continue
        times = [e["t"] for e in violation.get("effects", []) + violation.get("op", []) if "t" in e]
        if not times:
            continue
        for fault in failovers:
            if min(times) - EDGE <= fault["start"] <= max(times):
                violation["failover"] = fault
                break


def _check_operations(
    events: list[Event], answered: dict[tuple[str, str], list[tuple[Event, Event]]],
    effects: dict[tuple[str, str], list[Event]], limits: Limits, result: Result,
) -> None:  # fmt: skip
    """7: only an operation's principal reads it (anyone else gets ``404``, or ``503`` under a
    fault); once every key has settled it is ``succeeded`` or ``failed`` (or ``stalled``), its
    response its key's stored answer; or ``404``, a record released and claimed anew, unless
    its key kept an attempt that ran under it (:func:`_kept_operations`). One a background
    task completes (:data:`COMPLETED_BY_TASK`) is ``succeeded``: neither ``running`` (its
    completion lost, or never sent) nor ``stalled`` nor ``failed`` is its end."""
    kept = _stored(answered, effects)
    held = _kept_operations(events, answered, effects, kept, limits)
    keys = {e["op"]: (e["principal"], e["key"]) for e in events if e["type"] == "invoke"}
    entries = {e["op"]: e["entry"] for e in events if e["type"] == "invoke"}
    owners: dict[str, tuple[str, str]] = {}
    completed_by_task: set[str] = set()
    for done in events:
        if done["type"] == "complete" and done.get("location") and done["op"] in keys:
            owners[done["location"]] = keys[done["op"]]
            if entries[done["op"]] in COMPLETED_BY_TASK:
                completed_by_task.add(done["location"])
    for poll in (e for e in events if e["type"] == "poll"):
        key = owners.get(poll["operation"], (poll["owner"], "?"))
        if poll["principal"] != poll["owner"]:
            if poll["status"] not in (404, 503, None):
                result.violate(7, key, f"{poll['principal']} read {poll['owner']}'s operation "
                               f"({poll['status']})", polls=[poll])  # fmt: skip
            continue
        if not poll["final"] or poll["status"] is None:
            continue
        if poll["status"] == 404:
            shown = held.get(_operation_id(poll["operation"]))
            if shown is not None and poll["t"] < shown[1]:
                result.violate(7, key, "an operation whose result its key kept is gone (404) "
                               "after every key settled", polls=[poll],
                               stored=[shown[0]])  # fmt: skip
            continue
        if poll["operation"] in completed_by_task and (
            poll["status"] != 200 or poll.get("state") != "succeeded"
        ):  # its task completes it (complete_operation), and every key has settled
            result.violate(7, key, "an operation its task completes is "
                           f"{poll.get('state') or poll['status']} after every key settled",
                           polls=[poll])  # fmt: skip
            continue
        if poll["status"] != 200 or poll.get("state") not in ("succeeded", "failed", "stalled"):
            result.violate(7, key, f"an operation {poll.get('state') or poll['status']} after "
                           "every key settled", polls=[poll])  # fmt: skip
        elif poll.get("state") == "succeeded" and poll.get("execution") not in kept.get(key, ()):
            result.violate(7, key, "an operation's response is not its key's stored answer",
                           polls=[poll], stored=sorted(kept.get(key, ())))  # fmt: skip


def _stored(
    answered: dict[tuple[str, str], list[tuple[Event, Event]]],
    effects: dict[tuple[str, str], list[Event]],
) -> dict[tuple[str, str], set[str]]:
    """Each answered key's stored answer: the execution its last replay names, unless the
    view ran again after that replay's answer (or the key was never replayed): the run's last
    request ran it anew (its record expired, or left ``processing`` by a result write a fault
    lost, then taken over) and nothing was asked after it. Its answer is then one of the
    executions that ran since (the last of them, or a late owner's fenced off before it): any
    of them. A key never answered but ``202`` (its clients gave up while the server was slow)
    kept any of its runs."""
    kept: dict[tuple[str, str], set[str]] = {}
    for key, answers in answered.items():
        replays = [done for _, done in answers if done.get("replayed")]
        since = replays[-1]["t"] if replays else float("-inf")
        kept[key] = {run["execution"] for run in effects.get(key, []) if run["t"] > since}
        if replays:
            kept[key].add(replays[-1]["execution"])
    for key, runs in effects.items():  # never answered but 202 (its clients gave up): any run
        kept.setdefault(key, {run["execution"] for run in runs})
    return kept


def _kept_operations(
    events: list[Event], answered: dict[tuple[str, str], list[tuple[Event, Event]]],
    effects: dict[tuple[str, str], list[Event]], kept: dict[tuple[str, str], set[str]],
    limits: Limits,
) -> dict[str, tuple[str, float]]:  # fmt: skip
    """The operations (by id) whose record holds a result its key kept, each with that result's
    execution and the time until which its record outlives any TTL (from the key's first
    request, less :data:`EDGE`): a ``404`` for one is an operation lost.

    The attempts that ran under an operation are the effect lines naming its id (an
    ``/export/`` view's ``operation``; in a history recorded before that field, its message's
    deliveries, which name it too). Its record kept a result when every execution its key may
    have settled on (:func:`_stored`; with no ``2xx`` answer, every effect of the key) ran
    under it, and one of them was named by a replay or had its message delivered (sent only
    once its answer was stored). An attempt released, or a record claimed anew, leaves its
    operation's id naming nothing: its key settles on an attempt of another operation."""
    ran: dict[str, set[str]] = defaultdict(set)
    for event in events:
        if event["type"] == "effect" and event.get("operation") and not event.get("fails"):
            ran[event["operation"]].add(event["execution"])
        elif event["type"] == "delivery" and event.get("operation"):
            ran[event["operation"]].add(event["args"][0])
    asked: dict[tuple[str, str], float] = {}
    for event in (e for e in events if e["type"] == "invoke"):
        at = (event["principal"], event["key"])
        asked[at] = min(event["t"], asked.get(at, event["t"]))
    shown = {e["args"][0] for e in events if e["type"] == "delivery"}
    shown |= {done["execution"] for answers in answered.values() for _, done in answers
              if done.get("replayed")}  # fmt: skip
    runs = {run["execution"]: (key, run) for key, group in effects.items() for run in group}
    held: dict[str, tuple[str, float]] = {}
    for operation, executions in ran.items():
        for execution in sorted(executions & shown & runs.keys()):
            key, run = runs[execution]
            settled = kept.get(key) or {each["execution"] for each in effects[key]}
            if settled <= executions:  # its record claimed no earlier than the key's first ask
                since = min(asked.get(key, run["t"]), run["t"])
                held[operation] = (execution, since + limits.ttl[run["entry"]] - EDGE)
    return held


def _operation_id(location: str) -> str:
    """The operation id a status URL names (``.../operations/<id>``: its last segment)."""
    return unquote(location.rstrip("/").rpartition("/")[2])


def _check_outbox(
    events: list[Event], answered: dict[tuple[str, str], list[tuple[Event, Event]]],
    life_of: dict[str, tuple[tuple[str, str], int]], result: Result,
) -> None:  # fmt: skip
    """6: every message of a kept result is delivered and has one effect at the consumer; no
    message of an attempt that kept nothing is ever delivered, and every message delivered
    has one effect at the consumer.

    A kept result is one a replay named (every request is sent once more when the run has
    settled). An attempt kept nothing when it failed on purpose, or when its record life's
    replays name another attempt (its result fenced off, or never written). An attempt whose
    life no replay followed is neither: the run's last request ran it anew (its record
    expired, or was left ``processing`` by a result write a fault lost, and was taken over),
    and nothing was asked after it."""
    kept: set[str] = set()
    replayed_lives: dict[tuple[tuple[str, str], int], set[str]] = defaultdict(set)
    for answers in answered.values():
        for _, done in answers:
            if done.get("replayed"):
                kept.add(done["execution"])
                replayed_lives[life_of[done["execution"]]].add(done["execution"])
    staged = {e["execution"]: e for e in events if e["type"] == "effect" and "message" in e}
    delivered: dict[str, list[Event]] = defaultdict(list)
    for delivery in (e for e in events if e["type"] == "delivery"):
        delivered[delivery["message"]].append(delivery)
    consumed: dict[str, list[Event]] = defaultdict(list)
    for effect in (e for e in events if e["type"] == "consumed"):
        consumed[effect["message"]].append(effect)

    def key(execution: str) -> tuple[str, str]:
        effect = staged.get(execution)
        return ("?", "?") if effect is None else (effect["principal"], effect["key"])

    def kept_nothing(execution: str) -> bool:
        effect = staged.get(execution)
        if effect is None or effect.get("fails"):
            return True
        life = life_of.get(execution)
        return execution not in kept and life is not None and bool(replayed_lives[life])

    _check_copies(delivered, staged, result)
    for message, copies in delivered.items():
        for execution in {copy["args"][0] for copy in copies}:
            if kept_nothing(execution):
                effect = staged.get(execution)
                why = "failed on purpose" if effect and effect.get("fails") else "kept nothing"
                result.violate(6, key(execution), f"a message of an attempt that {why} was "
                               "delivered", effects=[e for e in [effect] if e],
                               deliveries=copies)  # fmt: skip
            elif execution not in kept and len(consumed[message]) != 1:
                result.violate(
                    6,
                    key(execution),
                    f"a message had {len(consumed[message])} effects at the consumer",
                    effects=[staged[execution], *consumed[message]],
                )
    for execution in sorted(kept & set(staged)):
        message = staged[execution]["message"]
        if message not in delivered:
            result.violate(6, key(execution), "a kept result's message was never delivered",
                           effects=[staged[execution]])  # fmt: skip
        elif len(consumed[message]) != 1:
            result.violate(
                6,
                key(execution),
                f"a message had {len(consumed[message])} effects at the consumer",
                effects=[staged[execution], *consumed[message]],
            )
    for event in events:
        if event["type"] == "undrained":
            result.violate(6, ("?", "?"), "messages still undelivered after the run's wait",
                           undelivered=event["undelivered"])  # fmt: skip


def _check_copies(
    delivered: dict[str, list[Event]], staged: dict[str, Event], result: Result
) -> None:
    """6: a message delivered is the one its attempt staged: a copy of it under another id
    (consumed once, as its own message) is a second effect of one attempt."""
    for message, copies in delivered.items():
        for execution in sorted({copy["args"][0] for copy in copies}):
            effect = staged.get(execution)
            if effect is not None and effect["message"] != message:
                result.violate(6, (effect["principal"], effect["key"]), "a message its attempt "
                               "never staged was delivered", effects=[effect],
                               deliveries=copies)  # fmt: skip


def _units(events: list[Event]) -> list[list[Event]]:
    """What shrinking drops together: an operation (its invocation, completion and
    ``unsettled``), an effect, a fault."""
    ops: dict[str, list[Event]] = defaultdict(list)
    units: list[list[Event]] = []
    for event in events:
        if "op" in event:
            ops[event["op"]].append(event)
        else:
            units.append([event])
    return [*ops.values(), *units]


def shrink(history: list[Event], violation: dict[str, Any], limits: Limits) -> list[Event]:
    """The fewest events of ``history`` that still show ``violation`` (its invariant and what was
    seen) on its key: its key's events and the faults of their time, then each operation or
    effect dropped while the violation still shows. Not another violation of the invariant: a
    later answer that differs from the first became, its effects dropped, an answer no effect
    made."""
    key = (violation["principal"], violation["key"])

    def shows(events: list[Event]) -> bool:
        found = check(events, limits).violations
        return any(v["invariant"] == violation["invariant"] and v["what"] == violation["what"]
                   and (v["principal"], v["key"]) == key for v in found)  # fmt: skip

    ops = {e["op"] for e in history if e["type"] == "invoke" and (e["principal"], e["key"]) == key}
    messages = {
        e.get("message")
        for e in history
        if e["type"] == "effect" and (e["principal"], e["key"]) == key
    }
    locations = {e["location"] for e in history if e.get("op") in ops and e.get("location")}
    mine = [
        e
        for e in history
        if (e["type"] in ("effect", "point") and (e["principal"], e["key"]) == key)
        or e.get("op") in ops
        or (e["type"] in ("delivery", "consumed") and e["message"] in messages)
        or (e["type"] == "poll" and e["operation"] in locations)
    ]
    times = [e["t"] for e in mine if "t" in e]
    # The faults of the key's time are kept whole: dropping one never hides a violation, and
    # they say what the nemesis was doing meanwhile.
    faults = [
        e
        for e in history
        if e["type"] == "fault" and times and e["start"] <= max(times) and e["end"] >= min(times)
    ]
    units = _units(mine)

    def joined(units: list[list[Event]]) -> list[Event]:
        return faults + [e for unit in units for e in unit]

    if not shows(joined(units)):
        return sorted(joined(units), key=_time)
    index = 0
    while index < len(units):
        trial = units[:index] + units[index + 1 :]
        if shows(joined(trial)):
            units = trial
        else:
            index += 1
    return sorted(joined(units), key=_time)


def _time(event: Event) -> float:
    return float(event.get("t", event.get("start", 0.0)))
