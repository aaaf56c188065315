"""Applies the run's plant (``IDEMPOTENCY_VERIFY_PLANT``) once the app is loaded, in every
server process, before any request."""

from __future__ import annotations

import os

from django.apps import AppConfig


class VerificationConfig(AppConfig):
    name = "tests.verification"
    label = "verification"

    def ready(self) -> None:
        from tests.verification import plants

        plants.apply(os.environ.get("IDEMPOTENCY_VERIFY_PLANT", ""))
        if os.environ.get("IDEMPOTENCY_VERIFY_SQLITE_TRACE"):
            from tests.verification import trace

            trace.install(os.environ["IDEMPOTENCY_VERIFY_SQLITE_TRACE"])
