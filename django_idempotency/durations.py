"""Durations given as a ``timedelta`` or a number of seconds."""

from __future__ import annotations

import math
from datetime import timedelta

Duration = timedelta | int | float

#: The longest duration accepted: ``now + ttl`` must stay a date the databases store (and
#: ``timedelta`` itself tops out at 999,999,999 days). A thousand years is forever enough.
MAX_DURATION = timedelta(days=365_000)


def to_timedelta(value: object, name: str) -> timedelta:
    """Normalise a duration, refusing anything that is not one (``bool`` included).

    ``TypeError`` for a value that is not a duration at all, ``ValueError`` for one that is not
    finite or is longer than :data:`MAX_DURATION`, so that neither a system check nor a request
    ever meets ``OverflowError`` (issue 20).
    """
    if isinstance(value, timedelta):
        duration = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value) or abs(value) > MAX_DURATION.total_seconds():
            raise ValueError(f"{name} must be finite and at most {MAX_DURATION}, not {value!r}.")
        duration = timedelta(seconds=value)
    else:
        raise TypeError(f"{name} must be a timedelta or a number of seconds, not {value!r}.")
    if abs(duration) > MAX_DURATION:
        raise ValueError(f"{name} must be at most {MAX_DURATION}, not {value!r}.")
    return duration
