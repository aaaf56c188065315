"""Applies the run's plant (``IDEMPOTENCY_VERIFY_PLANT``) once the app is loaded, in every
server process, before any request, and listens for the results it could not store and the
locks it lost."""

from __future__ import annotations

import logging
import os

from django.apps import AppConfig


class VerificationConfig(AppConfig):
    name = "tests.verification"
    label = "verification"

    def ready(self) -> None:
        from django_idempotency import key_claimed, key_taken_over, lock_lost
        from tests.verification import plants, witness

        plants.apply(os.environ.get("IDEMPOTENCY_VERIFY_PLANT", ""))
        logging.getLogger("django_idempotency").addHandler(witness.Unstored())
        key_claimed.connect(witness.claimed, dispatch_uid="verification-claimed")
        key_taken_over.connect(witness.claimed, dispatch_uid="verification-taken-over")
        lock_lost.connect(witness.lost, dispatch_uid="verification-lost")
        if os.environ.get("IDEMPOTENCY_VERIFY_SQLITE_TRACE"):
            from tests.verification import trace

            trace.install(os.environ["IDEMPOTENCY_VERIFY_SQLITE_TRACE"])
