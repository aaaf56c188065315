"""Ports for the servers the tests start and stop: outside the kernel's ephemeral range.

A client that dials a loopback port where nothing listens gets its own local port from the
ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``). When that local port is the very
port it dials, Linux connects the socket to itself (a TCP simultaneous open), and holds the port.
A server of ours stopped for an outage on a port of that range, dialled meanwhile by the app's
retries, then cannot bind it when it starts again: ``pg_ctl start`` failed so in CI (issue 32).
A loop of refused connects to one such port met itself after 3,610 tries on a CI machine.
"""

from __future__ import annotations

import random
import socket
from contextlib import ExitStack
from pathlib import Path

EPHEMERAL_SETTING = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: Linux's default, where the setting cannot be read.
DEFAULT_EPHEMERAL = range(32768, 61000)


def ephemeral() -> range:
    """The ports the kernel hands to outgoing connections."""
    try:
        first, last = (int(part) for part in EPHEMERAL_SETTING.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return range(first, last + 1)


def overlap(ports: range) -> range:
    """The part of ``ports`` inside the ephemeral range (empty when none is)."""
    kernel = ephemeral()
    return range(max(ports.start, kernel.start), min(ports.stop, kernel.stop))


def below_ephemeral(size: int = 1000) -> range:
    """A stretch of ``size`` ports just under the ephemeral range, at a random place of the
    ports above 20000 (two runs on one machine rarely start at the same one)."""
    top = ephemeral().start
    start = random.randrange(20000, max(20001, top - size))
    return range(start, min(start + size, top))


def free(count: int, within: range, taken: set[int] | None = None) -> list[int]:
    """``count`` ports of ``within`` that nothing is bound to now, none of ``taken`` (the ports
    are added to it). They are held together while chosen, so none repeats."""
    taken = set() if taken is None else taken
    chosen: list[int] = []
    with ExitStack() as held:
        for port in within:
            if len(chosen) == count:
                break
            if port in taken:
                continue
            sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            # As the servers bind (redis-server, PostgreSQL): a port left in TIME_WAIT by a
            # server killed a moment ago is free for them (in a range of ten, each kill made
            # one unusable for a minute).
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            chosen.append(port)
    if len(chosen) < count:
        raise OSError(f"{count} free ports wanted in {within.start}-{within.stop - 1}, "
                      f"{len(chosen)} found")  # fmt: skip
    taken.update(chosen)
    return chosen
