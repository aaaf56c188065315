"""What duplicates sent while an owner holds a key may see, and a duplicate sent once the owner
has claimed."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import connections

from django_idempotency import IdempotencyInProgress, key_claimed


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


def owner_then_duplicate(
    owner: Callable[[], Any], duplicate: Callable[[], Any], *, hold: bool = False
) -> tuple[Any, Any]:
    """Run ``owner``, then ``duplicate`` once the owner has claimed its key (``key_claimed``,
    sent in the owner's thread), each on its own thread and connection. With ``hold``, the owner
    stays at its claim (its record processing, its row locked in atomic mode) until the
    duplicate has answered: however late the duplicate comes, it meets a live owner."""
    claimed, answered = threading.Event(), threading.Event()

    def on_claim(**kwargs: Any) -> None:
        if claimed.is_set():  # the duplicate's claim, if it made one: never held
            return
        claimed.set()
        if hold:
            assert answered.wait(30), "the duplicate never answered"

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
