"""The outbox's far side: a Celery task on RabbitMQ, its body protected by
``idempotent_function``, as docs/outbox.rst's recipe writes one.

:data:`deliver` is what the views stage (``request.idempotency.enqueue(deliver, execution)``):
a real Celery task of :data:`app`, sent by the web workers' fast path and the relay to a queue
of the run's own (``IDEMPOTENCY_VERIFY_QUEUE`` on ``IDEMPOTENCY_VERIFY_AMQP_URL``: settings.py)
and run by ``celery --app=tests.verification.consumer worker`` (run.py starts it, and the
nemesis SIGKILLs its process group: ``consumer-kill``). The recipe's settings: ``acks_late``
and ``reject_on_worker_lost`` (a killed worker's message comes back), a prefetch of one; a
copy that meets the key in progress, or a database fault, is retried with backoff.

The recorder: every start of the task's body (a delivery: the message's id, the execution it
names, its retry count) is a line appended to ``deliveries-<pid>.jsonl`` in the ledger folder
and fsynced before the body goes on, so the file, never touched by the nemesis, holds every
delivery that ran; a message handed over twice is two lines. The consumer's effect is an
``Execution`` row written in one transaction with its recovery point (the docs' recipe), so
it happened exactly when that committed: ``/outbox-state/`` lists them. After its effect
the body notes that it is working (``working-<pid>.jsonl``) and works ``CONSUMER_WORK``
seconds (limits.py) before its result is written: the nemesis's ``consumer-kill`` waits for
such a note, so a worker killed then leaves the record ``processing`` at its recovery point,
and the redelivered message must resume from it rather than run the effect again. A worker
notes when it is ready (``consumer-ready.jsonl``): the nemesis kills a worker that has
started, not one still importing (on a loaded machine a worker takes seconds to start).

An ``/export/`` view's message also names its operation and the answer to complete it with:
once its effect is at its recovery point, the task completes the operation
(``complete_operation``, docs/operations.rst's recipe), on every delivery, a completion already
stored (``OperationError``, ``"completed"``: a worker killed after completing) being the
end of it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import worker_ready

from tests.verification.ledger import append_line
from tests.verification.limits import CONSUMER_WORK, LOCK

CONSUMER_LABEL = "verify-consumer"
TASK_NAME = "tests.verification.consumer.deliver"

app = Celery("verification")
app.config_from_object("django.conf:settings", namespace="CELERY")


@app.task(
    bind=True,
    name=TASK_NAME,
    acks_late=True,  # acknowledged when it ends: a killed worker's message comes back
    reject_on_worker_lost=True,  # also when only its pool process was killed
    # A copy running, a dead worker's lock not yet expired (IdempotencyInProgress), or a
    # database fault: again later. The body resumes from its recovery point, so any exception
    # may be retried.
    autoretry_for=(Exception,),
    retry_backoff=1,
    retry_backoff_max=LOCK,  # a dead worker's key is free by then
    max_retries=None,
)
def deliver(self: Any, execution: str, operation: str = "", answer: Any = None) -> None:
    line = {"message": self.request.id, "args": [execution], "t": time.time(),
            "pid": os.getpid(), "retries": self.request.retries}  # fmt: skip
    if operation:
        line["operation"] = operation
    append_line(_folder() / f"deliveries-{os.getpid()}.jsonl", line)
    try:
        _consume()(execution, message_id=self.request.id, operation=operation, answer=answer)
    except Exception:
        from django.db import connections

        connections.close_all()  # a fault's connection is not the retry's
        raise


@worker_ready.connect
def _ready(**kwargs: Any) -> None:
    append_line(_folder() / "consumer-ready.jsonl", {"pid": os.getpid(), "t": time.time()})


def _folder() -> Path:
    return Path(os.environ["IDEMPOTENCY_VERIFY_LEDGER"])


_consumer: list[Any] = []


def _consume() -> Any:
    """The recipe's consumer, made once the worker's Django is set up."""
    if _consumer:
        return _consumer[0]
    from django.db import transaction
    from django.http import JsonResponse

    from django_idempotency import Claim, OperationError, complete_operation, idempotent_function
    from tests.testapp.models import Execution

    # On the database store whatever STORE is: its recovery point commits with the effect's
    # row (docs/outbox.rst: a Redis store's point does not roll back with the transaction).
    @idempotent_function(key="message_id", name="verify.consume", lock_timeout=LOCK,
                         store="database")  # fmt: skip
    def consume(execution: str, *, message_id: str, idempotency: Claim, operation: str = "",
                answer: Any = None) -> Any:  # fmt: skip
        if idempotency.recovery_point == "":
            with transaction.atomic():  # the effect and the note that it exists: both or neither
                line = {"message": message_id, "execution": execution, "t": time.time(),
                        "pid": os.getpid()}  # fmt: skip
                Execution.objects.create(label=CONSUMER_LABEL, payload=json.dumps(line))
                idempotency.set_recovery_point("done", line)
            append_line(_folder() / f"working-{os.getpid()}.jsonl",
                        {"message": message_id, "t": time.time()})  # fmt: skip
            time.sleep(CONSUMER_WORK)
        if operation:  # the operation's final response: the answer the view would have given
            try:
                complete_operation(operation, JsonResponse(answer, status=201))
            except OperationError as exc:
                if exc.reason != "completed":  # a worker killed after completing: done
                    raise
        return idempotency.recovery_data

    _consumer.append(consume)
    return consume
