"""What a MariaDB Galera cluster node tells the system checks: how long the survivors stall
writes when a node dies.

When a node stops answering (SIGKILL, a lost network), the others hold every commit until they
have evicted it, ``evs.suspect_timeout`` (five seconds by default) after its last message. An
attempt renews its lock every third of ``lock_timeout``, so at the moment of the fault it holds
two thirds of it at the least (SPEC 4a): when the stall is longer, the lock can lapse in it,
and a retry through a surviving node takes the record over and runs the view again.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django_idempotency._base import durations

#: Galera's name of the time after which a silent node is suspected, then evicted.
SUSPECT_TIMEOUT = "evs.suspect_timeout"


def provider_options(text: str) -> dict[str, str]:
    """``wsrep_provider_options`` (``base_port = 4567; evs.suspect_timeout = PT5S; ...``) as
    a mapping of each option to its value."""
    options = {}
    for item in text.split(";"):
        name, equals, value = item.partition("=")
        if equals:
            options[name.strip()] = value.strip()
    return options


def suspect_timeout(cursor: Any) -> timedelta | None:
    """The node's ``evs.suspect_timeout``, read through a MySQL or MariaDB ``cursor``;
    ``None`` when the server is not a Galera node (``wsrep_on`` absent or off, no provider
    loaded). ``ValueError`` for a value that is no duration."""
    cursor.execute("SHOW VARIABLES LIKE 'wsrep_on'")
    row = cursor.fetchone()
    if row is None or str(row[1]).upper() != "ON":
        return None
    cursor.execute("SHOW VARIABLES LIKE 'wsrep_provider_options'")
    row = cursor.fetchone()
    value = provider_options("" if row is None else str(row[1])).get(SUSPECT_TIMEOUT)
    return None if value is None else durations.iso8601(value, SUSPECT_TIMEOUT)


def least_lock_timeout(stall: timedelta) -> timedelta:
    """The shortest lock timeout whose two thirds outlast ``stall``: a renewed lock never
    lapses in it."""
    return stall * 3 / 2


def outlasts(lock_timeout: timedelta, stall: timedelta) -> bool:
    return lock_timeout > least_lock_timeout(stall)
