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


def human(seconds: float) -> str:
    """``42s``, ``17m``, ``5h``, ``3d``: an age for operators, in its largest sensible unit."""
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"
