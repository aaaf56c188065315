"""Settings of the servers ``run.py`` starts: the fault suite's (its database from
``DATABASE_URL``, short connect timeouts), the verification views, and the Redis store when
``IDEMPOTENCY_VERIFY_REDIS_URL`` is set (the app's own tables stay on ``DATABASE_URL``)."""

from __future__ import annotations

import os

from tests.faults.settings import *  # noqa: F403
from tests.faults.settings import INSTALLED_APPS, REST_FRAMEWORK

ROOT_URLCONF = "tests.verification.urls"
#: A database fault in DRF's own token authentication (before ``@idempotent`` runs on a
#: function view) is a ``503``, not DRF's uncaught exception (docs/usage.rst).
REST_FRAMEWORK = {
    **REST_FRAMEWORK,
    "EXCEPTION_HANDLER": "django_idempotency.rest_framework.exception_handler",
}
INSTALLED_APPS = [*INSTALLED_APPS, "tests.verification.apps.VerificationConfig"]

#: The outbox's messages go to a file (tests/verification/consumer.py): one the fast path did not
#: send or mark (its worker killed, or stopped past half the lease) is the relay's in seconds,
#: so a run's messages are all delivered soon after it heals.
IDEMPOTENCY: dict[str, object] = {
    "OUTBOX_LEASE": 4,
    "OUTBOX_RETRY_DELAY": 0.5,
    "OUTBOX_POLL_INTERVAL": 0.5,
    "OUTBOX_MAX_ATTEMPTS": 1000,
}
if os.environ.get("IDEMPOTENCY_VERIFY_REDIS_URL"):
    IDEMPOTENCY["STORE"] = os.environ["IDEMPOTENCY_VERIFY_REDIS_URL"]
