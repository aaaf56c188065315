"""Waiting for another thread or process to reach a point: a condition polled until a deadline,
failing with what never came (a fixed sleep is a guess that a loaded machine loses)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    """``condition()``'s first true value, polled for ``timeout`` seconds; fails naming
    ``what`` it waited for."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")
