"""Durations given as a ``timedelta`` or a number of seconds."""

from __future__ import annotations

from datetime import timedelta

Duration = timedelta | int | float


def to_timedelta(value: object, name: str) -> timedelta:
    """Normalise a duration, refusing anything that is not one (``bool`` included)."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return timedelta(seconds=value)
    raise TypeError(f"{name} must be a timedelta or a number of seconds, not {value!r}.")
