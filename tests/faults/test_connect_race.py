"""The renewer's race to connect (:mod:`django_idempotency._store.connecting`) under a blackhole.

``test_a_short_lock_beside_does_not_cost_a_long_one_its_lock``: one process holds two keys, one
under a 30 s lock and one under a 3 s lock, renewed by the same thread; the alias gives no
``connect_timeout`` (the docs recommend one; nothing requires it). A blackhole of every
connection, new ones too, strikes just after a renewal of the short lock and lasts 8 s: far
less than the 30 s lock has left. The renewal bound of the short lock's group (a share of the
time the short lock has left, well under a second) spaced the race's attempts, so its eight
attempts were all under way, silent, within 4 s; no attempt started after the network healed,
and the renewer waited for the silent ones, each for psycopg's default connect timeout (130 s):
the 30 s lock was never renewed again, and a duplicate took the long key over.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import OperationalError, connections

from django_idempotency import Claim, IdempotencyInProgress, idempotent_function
from django_idempotency._store import connecting
from tests.faults.conftest import PROXIED
from tests.faults.proxied import proxied_server  # noqa: F401 (the fixture ``server``)
from tests.faults.proxy import FaultProxy

pytestmark = pytest.mark.faults

LONG = 30.0
SHORT = 3.0
#: The blackhole, far shorter than what the long lock has left when it strikes.
BLACKHOLE = 8.0
#: By when after the blackhole ends the long lock must have been renewed (seconds): the
#: renewal retried, its attempts to connect bounded.
RENEWED_WITHIN = 12.0

EFFECTS: Counter[str] = Counter()
HELD: dict[str, Claim] = {}
GO = threading.Event()


@idempotent_function(key="message_id", lock_timeout=LONG)
def hold_long(message_id: str, *, idempotency: Claim) -> str:
    return _hold(message_id, idempotency)


@idempotent_function(key="message_id", lock_timeout=SHORT)
def hold_short(message_id: str, *, idempotency: Claim) -> str:
    return _hold(message_id, idempotency)


def _hold(message_id: str, claim: Claim) -> str:
    EFFECTS[message_id] += 1
    if EFFECTS[message_id] == 1:
        HELD[message_id] = claim
        GO.wait(90)
    return f"ran {message_id}"


@pytest.fixture
def raced(proxied_store: FaultProxy) -> Iterator[FaultProxy]:
    EFFECTS.clear()
    HELD.clear()
    GO.clear()
    options = connections.settings[PROXIED].setdefault("OPTIONS", {})
    timeout = options.pop("connect_timeout", None)
    try:
        yield proxied_store
    finally:
        GO.set()
        if timeout is not None:
            options["connect_timeout"] = timeout


def _owner(function: Any, key: str, results: list[str]) -> None:
    try:
        results.append(function(key))
    finally:
        connections.close_all()  # this thread's


def _renewed(claim: Claim, deadline: float) -> float:
    """The claim's lock's end once a renewal has just moved it."""
    first = claim.held_until
    while claim.held_until == first and time.monotonic() < deadline:
        time.sleep(0.005)
    assert claim.held_until > first, "no renewal"
    return claim.held_until


def test_a_short_lock_beside_does_not_cost_a_long_one_its_lock(raced: FaultProxy) -> None:
    long_key, short_key = str(uuid.uuid4()), str(uuid.uuid4())
    results: list[str] = []
    owners = [
        threading.Thread(target=_owner, args=(hold_long, long_key, results)),
        threading.Thread(target=_owner, args=(hold_short, short_key, results)),
    ]
    for owner in owners:
        owner.start()
    try:
        deadline = time.monotonic() + 30
        while len(HELD) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(HELD) == 2, "the functions did not start"
        long_claim = HELD[long_key]
        _renewed(HELD[short_key], deadline)
        end = long_claim.held_until
        raced.blackhole(new=True)
        time.sleep(BLACKHOLE)
        raced.restore()
        healed = time.monotonic()
        assert end - healed > RENEWED_WITHIN + 2, "the long lock is too near its end"
        connections[PROXIED].close()  # this thread's, silenced for good
        while long_claim.held_until == end and time.monotonic() < healed + RENEWED_WITHIN:
            time.sleep(0.05)
        assert long_claim.held_until > end, (
            f"the 30 s lock was not renewed within {RENEWED_WITHIN} s of an {BLACKHOLE} s "
            "blackhole's end"
        )
        with pytest.raises(IdempotencyInProgress):
            hold_long(long_key)
    finally:
        GO.set()
        for owner in owners:
            owner.join(150)
    assert EFFECTS[long_key] == 1


class _CountedCondition(threading.Condition):
    """A condition that counts its waits (the race's, here: how often its caller woke)."""

    waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        type(self).waits += 1
        return super().wait(timeout)


#: The race's spacing of its attempts, and their driver's connect timeout (libpq's least).
SPACING = 0.5
TIMEOUT = 2


def test_the_race_waits_for_its_last_attempts_without_spinning(
    raced: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once an attempt has failed no new one starts, and the caller waits for those under way:
    it woke only when one ended. Its wait was the time to the next start, long past, so it
    spun (a busy loop of the renewer's thread, thousands of wake-ups, for as long as the last
    attempts took: seconds, on a machine the fault has loaded already)."""
    monkeypatch.setattr(connecting.threading, "Condition", _CountedCondition)
    _CountedCondition.waits = 0
    connection = connections[PROXIED].copy()
    connection.settings_dict.setdefault("OPTIONS", {})["connect_timeout"] = TIMEOUT
    raced.blackhole(new=True)
    started = time.monotonic()
    try:
        with pytest.raises(OperationalError):
            connecting.connected(connection, SPACING)
    finally:
        raced.restore()
    took = time.monotonic() - started
    assert took >= TIMEOUT + SPACING  # attempts were still under way after the first failed
    assert _CountedCondition.waits <= 4 * connecting.ATTEMPTS
