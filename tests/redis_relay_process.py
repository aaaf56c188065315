"""A relay of the Redis store's outbox that parks once it has taken its batch, before its
first send is marked, to be SIGKILLed there by ``tests/test_redis_outbox.py``. Run as
``python -m tests.redis_relay_process PARKED_FILE LEASE_SECONDS STORE``, ``STORE`` the tests'
store as ``--store`` names it (the ``redis`` cache alias, or the cluster's URL)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.test import override_settings  # noqa: E402

from django_idempotency._call import outbox  # noqa: E402


def park(*args: object) -> None:
    """The first send: the batch is taken (its lease counted in Redis); park until killed."""
    Path(sys.argv[1]).write_text(str(os.getpid()))
    while True:
        time.sleep(60)


if __name__ == "__main__":
    outbox.send = park  # type: ignore[assignment]
    with override_settings(IDEMPOTENCY={"OUTBOX_LEASE": float(sys.argv[2])}):
        call_command("idempotency_relay", "--once", "--store", sys.argv[3], verbosity=0)
