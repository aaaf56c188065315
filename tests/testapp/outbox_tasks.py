"""Tasks the outbox's tests enqueue (``tests/test_outbox.py``).

:data:`receipt` stands for a Celery task at the broker's edge: it has ``name`` and
``apply_async`` and records what it was handed (the broker is not what these tests are about:
``tests/test_celery.py`` runs real workers). ``failing`` counts sends to refuse first."""

from __future__ import annotations

import threading
from typing import Any


class Recorder:
    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: list[tuple[str, list[Any], dict[str, Any]]] = []
        self.failing = 0
        self.lock = threading.Lock()

    def apply_async(self, args: list[Any], kwargs: dict[str, Any], *, task_id: str) -> None:
        with self.lock:
            if self.failing:
                self.failing -= 1
                raise ConnectionError("broker unreachable")
            self.sent.append((task_id, list(args), dict(kwargs)))

    def reset(self) -> None:
        with self.lock:
            self.sent.clear()
            self.failing = 0


receipt = Recorder("tests.testapp.outbox_tasks.receipt")
