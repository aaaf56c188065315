"""A relay run on a thread of its own, as ``idempotency_relay`` runs it, for the tests that
fault or kill what it talks to (tests/test_outbox.py, tests/faults/test_relay*.py); and what a
relay run on the test's own thread leaves there, given back."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connections

from django_idempotency._ops.relay import Relay


@contextmanager
def relay_thread(relay: Relay, join: float) -> Iterator[threading.Thread]:
    """Run ``relay`` until the block ends, then stop it and wait ``join`` seconds for it; its
    thread's connections are closed as it ends."""

    def run() -> None:
        try:
            relay.run()
        finally:
            connections.close_all()  # this thread's

    thread = threading.Thread(target=run, name="relay")
    thread.start()
    try:
        yield thread
    finally:
        relay.stop()
        thread.join(join)


@contextmanager
def relay_here(alias: str = "default") -> Iterator[None]:
    """For a relay run on the test's own thread, the main one: the thread's connection to
    ``alias`` and the ``SIGTERM`` and ``SIGINT`` handlers as they were, given back after. A relay
    keeps on its thread the copy it connected where none was open (its settings a copy too,
    ``connect_timeout`` added), and installs its own handlers in the main thread: the later
    tests had both (tests/test_unkeepable_scopes.py's new connection objects no longer shared
    this thread's settings)."""
    ours = connections[alias]
    handlers = {each: signal.getsignal(each) for each in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for each, handler in handlers.items():
            signal.signal(each, handler)
        if connections[alias] is not ours:
            connections[alias].close()
            connections[alias] = ours
