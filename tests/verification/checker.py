"""The invariants, checked on a whole history (a list of events, as ``run.py`` records them).

Events (JSON objects, ``type`` first):

- ``invoke``: ``op``, ``t`` (seconds, the clients' clock), ``principal``, ``key``, ``entry``,
  ``body`` (a hash);
- ``complete``: ``op``, ``t``, ``status`` (``None``: no answer, ``error`` says why),
  ``response`` (a hash of the body's bytes), ``replayed``, ``execution`` and ``as`` (the
  execution and principal a 2xx answer names);
- ``effect``: what a view ran (its ledger line): ``t``, ``entry``, ``principal``, ``key``,
  ``body``, ``execution``, ``pid``; an outbox view's also ``message`` (the id it staged) and
  ``fails`` (an attempt that answered ``503`` on purpose: it keeps nothing);
- ``delivery``: a message the broker took (``message``, ``args``: the execution that staged it);
- ``consumed``: the consumer's effect for a message (``message``, ``execution``);
- ``undrained``: the outbox still held undelivered messages when the run stopped waiting;
- ``fault``: ``kind``, ``start``, ``end``, ``pid`` (a worker's), ``long`` (longer than the
  lock can outlive);
- ``unsettled``: ``op``: a client with no final answer when the run's settling time was up;
- ``poll``: a GET of an operation's status URL (``operation``) that a ``202`` gave ``owner``,
  sent as ``principal`` (the owner or another): ``status``, the operation's ``state`` and the
  ``execution`` its final response names; ``final``: sent once every key had settled.

Each violation names its invariant (the issue's numbering), the key it is about and what was
seen; :func:`shrink` cuts a violation's history down to the fewest events that still show it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

Event = dict[str, Any]

#: Seconds of slack on a TTL's edge (the clients' clock and the servers' may differ by the
#: time a request takes to reach the view).
EDGE = 1.0
#: Faults of the workers a view's own process suffers; the others hit every owner at once
#: (the relay's death none: its messages are sent again once their lease passes).
WORKER_FAULTS = {"worker-kill", "worker-stop"}
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


def _excuse(first: Event, second: Event, faults: list[Event], limits: Limits) -> Event | None:
    """The fault that let ``second`` run again after ``first`` (SPEC 4a's window): the owner's
    worker killed, or a fault longer than its remaining lock (at least two thirds of the lock,
    renewed) between the two effects."""
    if first["entry"] in limits.atomic:
        return None
    for fault in faults:
        if fault["start"] > second["t"] or fault["end"] < first["t"] - EDGE:
            continue
        if (
            fault["kind"] in WORKER_FAULTS
            and fault.get("pid") != first["pid"]
            and not (limits.worker_faults_global and fault["kind"] == "worker-stop")
        ):
            continue
        if fault["kind"] == "worker-kill" and fault["start"] >= first["t"] - EDGE:
            return fault
        if fault.get("long") or _outage(fault, faults) >= limits.lock * 2 / 3:
            return fault
    return None


def _expiry(
    source: Event, asked: Event, faults: list[Event], replayed_at: dict[str, float],
    limits: Limits,
) -> float:  # fmt: skip
    """When ``source``'s record may expire (its TTL from its run, and the edge): later when a
    store outage held its owner's renewals and result write, for a renewal that lands holds the
    record until its lock's end (SPEC 4a), and one may land as late as the result, stored
    before its first replay. A soak's Redis frozen 5.3 s under a 6 s TTL: the owner's renewal
    and result landed when it thawed, and the record lived 3 s on."""
    expiry = source["t"] + limits.ttl[asked["entry"]]
    stored = replayed_at.get(source["execution"], asked["t"])
    held = any(
        fault["kind"] in OUTAGES and fault["start"] <= stored and fault["end"] >= source["t"]
        for fault in faults
    )
    if held:
        expiry = max(expiry, stored + limits.lock)
    return expiry + EDGE


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
    effects: dict[tuple[str, str], list[Event]] = defaultdict(list)
    for effect in events:
        # An attempt that failed on purpose released its record: a retry runs anew.
        if effect["type"] == "effect" and not effect.get("fails"):
            effects[effect["principal"], effect["key"]].append(effect)

    # Record lives: a key's effects, a new life once the TTL of the record of the life's first
    # effect may have passed. That record was claimed at the earliest by the first request
    # for the key sent since the life before began (a claim may wait long under a fault).
    asked_at: dict[tuple[str, str], list[float]] = defaultdict(list)
    for asked in invokes.values():
        asked_at[asked["principal"], asked["key"]].append(asked["t"])
    life_of: dict[str, tuple[tuple[str, str], int]] = {}
    lives: dict[tuple[tuple[str, str], int], list[Event]] = {}
    for key, runs in effects.items():
        runs.sort(key=lambda e: e["t"])

        def claimed(after: float, run: Event, key: tuple[str, str] = key) -> float:
            return min([t for t in asked_at[key] if after < t <= run["t"]], default=run["t"])

        number, previous = 0, float("-inf")
        start = claimed(previous, runs[0])
        for run in runs:
            if run["t"] - start >= limits.ttl[run["entry"]] - EDGE:
                number, previous = number + 1, start
                start = claimed(previous, run)
            lives.setdefault((key, number), []).append(run)
            life_of[run["execution"]] = (key, number)

    # 1 and 4: one effect per life, of one body.
    late: set[str] = set()  # executions run again in a window: their answers are excused
    for (key, number), runs in lives.items():
        first = runs[0]
        for again in runs[1:]:
            if again["body"] != first["body"]:
                result.violate(
                    4, key, "a changed body ran under a used key", effects=[first, again]
                )
                continue
            fault = _excuse(first, again, faults, limits)
            if fault is None:
                result.violate(
                    1, key, "a view ran twice in one record life", effects=[first, again]
                )
            else:
                late.update((first["execution"], again["execution"]))
                result.windows.append(
                    {"principal": key[0], "key": key[1], "life": number, "fault": fault,
                     "executions": [first["execution"], again["execution"]]}
                )  # fmt: skip

    replayed_at: dict[str, float] = {}  # when a replay first named each execution
    for done in completes.values():
        if done.get("replayed") and done.get("execution"):
            execution = done["execution"]
            replayed_at[execution] = min(replayed_at.get(execution, done["t"]), done["t"])

    # Answers, in the order they came.
    answered: dict[tuple[str, str], list[tuple[Event, Event]]] = defaultdict(list)
    for op, done in sorted(completes.items(), key=lambda item: item[1]["t"]):
        asked = invokes[op]
        key = (asked["principal"], asked["key"])
        status = done["status"]
        if status is not None and status >= 500 and status != 503:
            result.violate(8, key, f"answered {status}", op=[asked, done])
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
        expiry = _expiry(source, asked, faults, replayed_at, limits)
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
                if done["response"] != stored[1]["response"]:
                    result.violate(2, key, "two replays differ", op=[*stored, asked, done])
                    continue
            if life not in first_of_life:
                first_of_life[life] = (asked, done)
                continue
            first_asked, first_done = first_of_life[life]
            # In a window, the late owner's client gets the view's own answer (SPEC 4a).
            excused = done["execution"] in late or first_done["execution"] in late
            if done["response"] != first_done["response"] and not excused:  # 2
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

    _check_outbox(events, answered, result)
    _check_operations(events, answered, result)

    for event in events:  # 8: a key that never settled
        if event["type"] == "unsettled" and event["op"] in invokes:
            asked = invokes[event["op"]]
            result.violate(8, (asked["principal"], asked["key"]), "no final answer after healing",
                           op=[asked])  # fmt: skip
    return result


def _check_operations(
    events: list[Event], answered: dict[tuple[str, str], list[tuple[Event, Event]]],
    result: Result,
) -> None:  # fmt: skip
    """7: only an operation's principal reads it (anyone else gets ``404``, or ``503`` under a
    fault), and once every key has settled it is ``succeeded`` or ``failed`` (or ``stalled``,
    its owner gone), its response the one its key's replays give; or ``404``, a record
    released and claimed anew (a new operation)."""
    kept: dict[tuple[str, str], str] = {}
    for key, answers in answered.items():
        for _, done in answers:
            if done.get("replayed"):
                kept[key] = done["execution"]
    keys = {e["op"]: (e["principal"], e["key"]) for e in events if e["type"] == "invoke"}
    owners: dict[str, tuple[str, str]] = {}
    for done in events:
        if done["type"] == "complete" and done.get("location") and done["op"] in keys:
            owners[done["location"]] = keys[done["op"]]
    for poll in (e for e in events if e["type"] == "poll"):
        key = owners.get(poll["operation"], (poll["owner"], "?"))
        if poll["principal"] != poll["owner"]:
            if poll["status"] not in (404, 503, None):
                result.violate(7, key, f"{poll['principal']} read {poll['owner']}'s operation "
                               f"({poll['status']})", polls=[poll])  # fmt: skip
            continue
        if not poll["final"] or poll["status"] in (404, None):
            continue
        if poll["status"] != 200 or poll.get("state") not in ("succeeded", "failed", "stalled"):
            result.violate(7, key, f"an operation {poll.get('state') or poll['status']} after "
                           "every key settled", polls=[poll])  # fmt: skip
        elif poll.get("state") == "succeeded" and poll.get("execution") != kept.get(key):
            result.violate(7, key, "an operation's response is not its key's stored answer",
                           polls=[poll], stored=kept.get(key))  # fmt: skip


def _check_outbox(
    events: list[Event], answered: dict[tuple[str, str], list[tuple[Event, Event]]],
    result: Result,
) -> None:  # fmt: skip
    """6: every message of a kept result is delivered and has one effect at the consumer; no
    message of an attempt that kept nothing is ever delivered. A kept result is one a replay
    named (every request is sent once more when the run has settled)."""
    kept = {
        done["execution"]
        for answers in answered.values()
        for _, done in answers
        if done.get("replayed")
    }
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

    for copies in delivered.values():
        for execution in {copy["args"][0] for copy in copies}:
            if execution not in kept:
                effect = staged.get(execution)
                why = "failed on purpose" if effect and effect.get("fails") else "kept nothing"
                result.violate(6, key(execution), f"a message of an attempt that {why} was "
                               "delivered", effects=[e for e in [effect] if e],
                               deliveries=copies)  # fmt: skip
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
    """The fewest events of ``history`` that still show ``violation``'s invariant on its key:
    its key's events and the faults of their time, then each operation or effect dropped while
    the violation still shows."""
    key = (violation["principal"], violation["key"])

    def shows(events: list[Event]) -> bool:
        found = check(events, limits).violations
        return any(v["invariant"] == violation["invariant"] and
                   (v["principal"], v["key"]) == key for v in found)  # fmt: skip

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
        if (e["type"] == "effect" and (e["principal"], e["key"]) == key)
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
