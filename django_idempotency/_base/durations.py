"""Durations given as a ``timedelta`` or a number of seconds, and a time as a number: the
microseconds since the epoch every store writes and reads (a record's life, the claim's clock)."""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

Duration = timedelta | int | float

#: The epoch and the unit of a time sent as a number: microseconds since the epoch.
EPOCH = datetime(1970, 1, 1, tzinfo=dt_timezone.utc)
MICROSECOND = timedelta(microseconds=1)


def microseconds(value: datetime) -> int:
    """A time as microseconds since the epoch: exact, and made for a fraction of what
    ``isoformat()`` costs. A naive time (``USE_TZ = False``) is local time, as Django makes it
    and as the connection's time zone reads it."""
    if value.tzinfo is None:
        value = value.astimezone()
    return (value - EPOCH) // MICROSECOND


#: The longest duration accepted: ``now + ttl`` must stay a date the databases store (and
#: ``timedelta`` itself tops out at 999,999,999 days). A thousand years is forever enough.
MAX_DURATION = timedelta(days=365_000)
#: The least deadline of one of the app's own statements (seconds: a claim, a renewal, a result
#: write; :mod:`.._store.deadlines`): a statement slowed by a loaded machine is not a fault.
LEAST_STATEMENT = 1.0
#: The shortest lock (``LOCK_TIMEOUT``, a ``lock_timeout``): no shorter than the deadline of the
#: statement that claims it. A claim may take that long and still succeed, and a lock shorter
#: than it can have lapsed when the claim returns: every duplicate then takes the record over
#: while its view runs (a lock of 0.1 ms ran the views of 6 keys 56 times).
MIN_LOCK_TIMEOUT = timedelta(seconds=LEAST_STATEMENT)


def to_timedelta(value: object, name: str) -> timedelta:
    """Normalise a duration, refusing anything that is not one (``bool`` included).

    ``TypeError`` for a value that is not a duration at all, ``ValueError`` for one that is not
    finite or is longer than :data:`MAX_DURATION`, so that neither a system check nor a request
    ever meets ``OverflowError``.
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


def positive(value: object, name: str) -> timedelta:
    """A duration that must be above zero; ``TypeError`` or ``ValueError`` if it is not."""
    duration = to_timedelta(value, name)
    if duration <= timedelta(0):
        raise ValueError(f"{name} must be positive, not {value!r}.")
    return duration


_TEXT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse(value: object, name: str) -> timedelta:
    """A duration, or text such as ``90``, ``90s``, ``15m``, ``2h`` or ``1d`` (a command's
    option); ``TypeError`` or ``ValueError`` if it is neither."""
    if not isinstance(value, str):
        return to_timedelta(value, name)
    match = _TEXT.match(value)
    if not match:
        raise ValueError(f"{name} must be a duration such as 90, 90s, 15m, 2h or 1d.")
    return to_timedelta(float(match[1]) * _UNITS[match[2]], name)


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


# ISO 8601 durations as Galera writes its timeouts (evs.suspect_timeout = PT5S): days, hours,
# minutes and seconds (a fraction allowed); years and months have no fixed length.
_ISO8601 = re.compile(
    r"P(?:(?P<weeks>\d+(?:\.\d+)?)W)?(?:(?P<days>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<hours>\d+(?:\.\d+)?)H)?(?:(?P<minutes>\d+(?:\.\d+)?)M)?"
    r"(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?"
)


def iso8601(text: str, name: str) -> timedelta:
    """An ISO 8601 duration (``PT5S``, ``PT1M30S``, ``PT0.5S``, ``P1DT2H``), or a bare number
    of seconds; ``ValueError`` naming ``name`` for anything else."""
    value = text.strip().upper()
    try:
        return to_timedelta(float(value), name)
    except ValueError:
        pass
    match = _ISO8601.fullmatch(value)
    if match is None or value in ("P", "PT") or value.endswith("T"):
        raise ValueError(f"{name} is not an ISO 8601 duration such as PT5S: {text!r}.")
    parts = {unit: float(amount) for unit, amount in match.groupdict().items() if amount}
    return to_timedelta(timedelta(**parts), name)
