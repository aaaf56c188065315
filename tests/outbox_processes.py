"""The processes of ``tests/test_outbox_celery.py``: a web worker that enqueues and may park
before its result is stored, and a relay that may park mid-batch (each then SIGKILLed by the
test). Run as ``python -m tests.outbox_processes web ORDER...`` (parked with
``IDEMPOTENCY_TEST_PARK``, or made to wait for a file with ``IDEMPOTENCY_TEST_WAIT_FILE``) or
``relay [--hang-after N] [--batch-size N] [--forever]`` (``--forever``: a relay service, until
SIGTERM, its passes reported), with the Celery workers' settings (``tests.celery_settings``)."""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.celery_settings")

import django

import tests.celery_app  # noqa: F401  (the project's Celery app, as its __init__ loads it)

django.setup()

from django.core.management import call_command  # noqa: E402

from django_idempotency import Claim, idempotent_function  # noqa: E402
from django_idempotency._call import outbox  # noqa: E402
from tests.testapp.celery_tasks import send_receipt  # noqa: E402
from tests.testapp.models import Execution  # noqa: E402


@idempotent_function(key="order_id", name="tests.place_order")
def place_order(order_id: int, *, idempotency: Claim) -> None:
    idempotency.enqueue(send_receipt, order_id)
    if os.environ.get("IDEMPOTENCY_TEST_PARK"):  # killed here: enqueued, its result not stored
        Execution.objects.create(label="web-parked", payload=str(os.getpid()))
        while True:
            time.sleep(60)
    if wait := os.environ.get("IDEMPOTENCY_TEST_WAIT_FILE"):  # the test stops the database
        Execution.objects.create(label="web-waiting", payload=str(os.getpid()))
        while not os.path.exists(wait):
            time.sleep(0.05)


def park_relay_after(count: int) -> None:
    """The relay parks after handing ``count`` messages to the broker, before marking them."""
    send = outbox.send
    sent = [0]

    def counting(*args: object) -> None:
        if sent[0] == count:
            Execution.objects.create(label="relay-parked", payload=str(os.getpid()))
            while True:
                time.sleep(60)
        send(*args)  # type: ignore[arg-type]
        sent[0] += 1

    outbox.send = counting  # type: ignore[assignment]


if __name__ == "__main__":
    role, *rest = sys.argv[1:]
    if role == "web":
        for order in rest:
            place_order(order_id=int(order))
    else:
        if "--hang-after" in rest:
            park_relay_after(int(rest[rest.index("--hang-after") + 1]))
        size = rest[rest.index("--batch-size") + 1] if "--batch-size" in rest else "100"
        if "--forever" in rest:  # a service: its warnings in its log, as a deployment's
            import logging

            handler = logging.StreamHandler()
            handler.setLevel(logging.WARNING)
            logging.getLogger("django_idempotency").addHandler(handler)
            call_command(
                "idempotency_relay", "--batch-size", size, "--interval", "0.5", verbosity=2
            )
        else:
            call_command("idempotency_relay", "--once", "--batch-size", size, verbosity=0)
