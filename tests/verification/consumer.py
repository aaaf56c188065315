"""The outbox's far side: a broker that is a file, and a consumer process protected by
``idempotent_function``, as docs/outbox.rst's recipe writes one.

:data:`deliver` is what the views stage (``request.idempotency.enqueue(deliver, execution)``):
a stand-in for a Celery task whose ``apply_async`` appends the message (its id, its
arguments) to ``deliveries-<pid>.jsonl`` in the ledger folder and fsyncs it, so the file is the
broker's queue, written by whoever sends (the web workers' fast path, the relay) and never
touched by the nemesis. ``python -m tests.verification.consumer`` reads those files and runs
:func:`consume` for each delivery until it succeeds; a message delivered twice is handed over
twice (at least once). The consumer's effect is an ``Execution`` row written in one
transaction with its recovery point (the docs' recipe), so it happened exactly when that
committed: ``/consumer-effects/`` lists them.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

CONSUMER_LABEL = "verify-consumer"


class FileBroker:
    """What the outbox needs of a Celery task: a ``name`` it is found at, and
    ``apply_async``."""

    name = "tests.verification.consumer.deliver"

    def apply_async(
        self,
        args: list[Any] | tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        task_id: str | None = None,
        **options: Any,
    ) -> None:
        line = {"message": task_id, "args": list(args), "t": time.time(), "pid": os.getpid()}
        path = Path(os.environ["IDEMPOTENCY_VERIFY_LEDGER"]) / f"deliveries-{os.getpid()}.jsonl"
        append_line(path, line)


deliver = FileBroker()


def deliveries(folder: Path) -> list[dict[str, Any]]:
    """Every delivery the broker took, in no particular order."""
    found = []
    for path in sorted(folder.glob("deliveries-*.jsonl")):
        found += [json.loads(line) for line in path.read_text().splitlines() if line]
    return found


def _consume() -> Any:
    from django.db import transaction

    from django_idempotency import Claim, idempotent_function
    from tests.testapp.models import Execution
    from tests.verification.limits import LOCK

    @idempotent_function(key="message_id", name="verify.consume", lock_timeout=LOCK)
    def consume(execution: str, *, message_id: str, idempotency: Claim) -> Any:
        if idempotency.recovery_point == "":
            with transaction.atomic():  # the effect and the note that it exists: both or neither
                line = {"message": message_id, "execution": execution, "t": time.time(),
                        "pid": os.getpid()}  # fmt: skip
                Execution.objects.create(label=CONSUMER_LABEL, payload=json.dumps(line))
                idempotency.set_recovery_point("done", line)
        return idempotency.recovery_data

    return consume


def main() -> None:
    """Consume every delivery, each until it succeeds, until ``SIGTERM``."""
    import django
    from django.db import connections

    django.setup()
    consume = _consume()
    folder = Path(os.environ["IDEMPOTENCY_VERIFY_LEDGER"])
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    offsets: dict[Path, int] = {}
    waiting: list[dict[str, Any]] = []
    while not stopping.is_set():
        for path in folder.glob("deliveries-*.jsonl"):
            with path.open("rb") as queue:
                queue.seek(offsets.get(path, 0))
                data = queue.read()
            whole = data[: data.rfind(b"\n") + 1]
            offsets[path] = offsets.get(path, 0) + len(whole)
            waiting += [json.loads(line) for line in whole.splitlines() if line]
        left = []
        for delivery in waiting:
            try:
                consume(*delivery["args"], message_id=delivery["message"])
            except Exception as exc:  # in progress elsewhere, a database fault: later
                print(f"consume {delivery['message']}: {type(exc).__name__}: {exc}",
                      file=sys.stderr, flush=True)  # fmt: skip
                left.append(delivery)
                connections.close_all()
        waiting = left
        stopping.wait(0.2)


if __name__ == "__main__":
    main()


def append_line(path: Path, line: dict[str, Any]) -> None:
    """One JSON line appended and on disk before the caller goes on: the ledger a fault of the
    app's processes never loses."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
