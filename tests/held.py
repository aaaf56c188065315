"""What duplicates sent while an owner holds a key may see."""

from __future__ import annotations

from typing import Any

from django_idempotency import IdempotencyInProgress


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
