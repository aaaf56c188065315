"""What duplicates sent while an owner holds a key may see, and a duplicate sent once the owner
has claimed."""

from __future__ import annotations

import threading
import time
import types
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest
from django.db import connections

from django_idempotency import IdempotencyInProgress, key_claimed
from django_idempotency._call import lifecycle
from tests.waiting import wait_for

T = TypeVar("T")


def assert_held_off(duplicates: list[Any], result: Any) -> None:
    """Every duplicate found the key held, except those sent after the owner stored its result
    and before its thread ended, which replay it: none ran the function again."""
    assert duplicates, "no duplicate was sent"
    replayed = [each for each in duplicates if not isinstance(each, IdempotencyInProgress)]
    assert len(replayed) < len(duplicates), duplicates
    assert all(each == result for each in replayed), duplicates
    # A replay is the last thing a duplicate can see: none after it was held off again.
    first = next((i for i, each in enumerate(duplicates) if each in replayed), len(duplicates))
    after = duplicates[first:]
    assert not any(isinstance(each, IdempotencyInProgress) for each in after), duplicates


def owner_and_duplicates(
    owner: Callable[[], T],
    reached: threading.Event,
    duplicate: Callable[[], Any],
    start: float,
    every: float,
) -> tuple[T, list[Any]]:
    """``owner()`` on a thread of its own, and ``duplicate()`` sent every ``every`` seconds,
    from ``start`` seconds after ``reached`` is set (its claim reached a proxy holding its
    reply, say) until the owner is done: the owner's result and the duplicates' answers (for
    :func:`assert_held_off`)."""
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        running = pool.submit(owner)
        assert reached.wait(5), "the owner's claim never reached the proxy"
        first = time.monotonic() + start
        answers: list[Any] = []
        while not running.done():
            if time.monotonic() >= first:
                answers.append(duplicate())
            time.sleep(every)
        return running.result(), answers
    finally:
        pool.shutdown()


def owner_then_duplicate(
    owner: Callable[[], Any],
    duplicate: Callable[[], Any],
    *,
    hold: bool = False,
    until: tuple[Callable[[], Any], str] | None = None,
) -> tuple[Any, Any]:
    """Run ``owner``, then ``duplicate`` once the owner has claimed its key (``key_claimed``,
    sent in the owner's thread), each on its own thread and connection. With ``hold``, the owner
    stays at its claim (its record processing, its row locked in atomic mode) until the
    duplicate has answered: however late the duplicate comes, it meets a live owner. With
    ``until`` (a condition and what it says), the owner stays there until the condition holds
    (polled, to a deadline): a duplicate that waits for the owner is seen waiting
    (:func:`waiting_threads`) before the owner goes on."""
    claimed, answered = threading.Event(), threading.Event()

    def on_claim(**kwargs: Any) -> None:
        if claimed.is_set():  # the duplicate's claim, if it made one: never held
            return
        claimed.set()
        if hold:
            assert answered.wait(30), "the duplicate never answered"
        if until is not None:
            wait_for(until[0], until[1], 30)

    def run(call: Callable[[], Any]) -> Any:
        try:
            return call()
        finally:
            connections.close_all()

    key_claimed.connect(on_claim, dispatch_uid="held-owner-then-duplicate", weak=False)
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            first = pool.submit(run, owner)
            assert claimed.wait(30), "the owner never claimed its key"
            second = pool.submit(run, duplicate)
            try:
                answer = second.result(timeout=60)
            finally:
                answered.set()
            return first.result(timeout=60), answer
    finally:
        key_claimed.disconnect(dispatch_uid="held-owner-then-duplicate")


def waiting_threads(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """The threads whose claim has slept in its wait for a key in flight (``in_progress="wait"``,
    synchronous code): a duplicate in it found the key processing and waits for its owner. Seen
    at the claim loop's own sleep (``lifecycle.run_steps``), which still sleeps as it did."""
    waiting: set[int] = set()
    sleep = time.sleep

    def sleeping(seconds: float) -> None:
        waiting.add(threading.get_ident())
        sleep(seconds)

    spy = types.SimpleNamespace(**{**vars(time), "sleep": sleeping})
    monkeypatch.setattr(lifecycle, "time", spy)
    return waiting


def owner_held_until(
    send: Callable[[], T], condition: Callable[[], Any], what: str, timeout: float = 30
) -> T:
    """``send()`` (a storm of calls on one key) on a thread of its own, its first call to claim
    the key held at its claim (``key_claimed``, in its thread: the record processing, its row
    uncommitted in atomic mode) until ``condition()`` holds, polled from this thread to a
    deadline: the duplicates are where the test says (waiting for the owner, say) before the
    owner goes on, however loaded the machine. Returns what ``send`` returned."""
    claimed, release = threading.Event(), threading.Event()

    def on_claim(**kwargs: Any) -> None:
        if claimed.is_set():  # a later claim (the key's next owner): never held
            return
        claimed.set()
        assert release.wait(timeout + 30), "the test never let the owner go on"

    key_claimed.connect(on_claim, dispatch_uid="held-owner-held-until", weak=False)
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            sent = pool.submit(send)
            try:
                assert claimed.wait(timeout), "no call claimed the key"
                wait_for(condition, what, timeout)
            finally:
                release.set()
            return sent.result(timeout=60)
    finally:
        key_claimed.disconnect(dispatch_uid="held-owner-held-until")
