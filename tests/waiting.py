"""Waiting for another thread or process to reach a point: a condition polled until a deadline,
failing with what never happened (a fixed sleep is a guess that a loaded machine loses)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], object], message: str, timeout: float = 5.0) -> None:
    """Until ``condition()`` is true; fails with ``message`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.01)
