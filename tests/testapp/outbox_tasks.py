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


class CommitProbe(Recorder):
    """Records, with each message, whether the order it names (an Execution's primary key)
    was committed when the message was handed to the broker: a consumer reads it then."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.committed: list[bool] = []
        self.handed = threading.Event()

    def apply_async(self, args: list[Any], kwargs: dict[str, Any], *, task_id: str) -> None:
        from django.db import connection

        from tests.testapp.models import Execution

        # On the sender's own connection: it sees what is committed, as a worker would.
        try:
            self.committed.append(Execution.objects.filter(pk=args[0]).exists())
        finally:
            connection.close()  # the thread's: it would outlive the test database
        super().apply_async(args, kwargs, task_id=task_id)
        self.handed.set()

    def reset(self) -> None:
        super().reset()
        self.committed.clear()
        self.handed.clear()


probe = CommitProbe("tests.testapp.outbox_tasks.probe")
