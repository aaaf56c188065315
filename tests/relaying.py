"""A relay run on a thread of its own, as ``idempotency_relay`` runs it, for the tests that
fault or kill what it talks to (tests/test_outbox.py, tests/faults/test_relay*.py)."""

from __future__ import annotations

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
