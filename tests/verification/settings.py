"""Settings of the servers ``run.py`` starts: the fault suite's (its database from
``DATABASE_URL``, short connect timeouts), the verification views, and the Redis store when
``IDEMPOTENCY_VERIFY_REDIS_URL`` is set (the app's own tables stay on ``DATABASE_URL``)."""

from __future__ import annotations

import os

from tests.faults.settings import *  # noqa: F403
from tests.faults.settings import INSTALLED_APPS, REST_FRAMEWORK
from tests.settings import MIDDLEWARE

ROOT_URLCONF = "tests.verification.urls"
#: A database fault in DRF's own token authentication (before ``@idempotent`` runs on a
#: function view) is a ``503``, not DRF's uncaught exception (docs/usage.rst).
#: Basic authentication is a principal kind of the DRF entry points beside the token.
REST_FRAMEWORK = {
    **REST_FRAMEWORK,
    "EXCEPTION_HANDLER": "django_idempotency.rest_framework.exception_handler",
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.BasicAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
}
#: Each Basic request checks its password: MD5, a test project's hasher only (PBKDF2 would cost
#: every such request a quarter of a second of CPU on the runs' two cores).
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
INSTALLED_APPS = [*INSTALLED_APPS, "tests.verification.apps.VerificationConfig"]
#: Gathers each request's executions, for a result the app could not store (witness.py).
MIDDLEWARE = ["tests.verification.witness.attempts", *MIDDLEWARE]

#: The outbox's messages go to a Celery task (tests/verification/consumer.py): one the fast path
#: did not send or mark (its worker killed, or stopped past half the lease) is the relay's in
#: seconds, so a run's messages are all delivered soon after it heals.
IDEMPOTENCY: dict[str, object] = {
    "OUTBOX_LEASE": 4,
    "OUTBOX_RETRY_DELAY": 0.5,
    "OUTBOX_POLL_INTERVAL": 0.5,
    "OUTBOX_MAX_ATTEMPTS": 1000,
}
if os.environ.get("IDEMPOTENCY_VERIFY_REDIS_URL"):
    IDEMPOTENCY["STORE"] = os.environ["IDEMPOTENCY_VERIFY_REDIS_URL"]

# The Celery recipe (docs/outbox.rst): a killed worker's message comes back, and a worker holds
# no more unacknowledged tasks than it runs. The broker is RabbitMQ, the queue the run's own
# (run.py names it, and deletes it with its exchange when the run ends).
CELERY_BROKER_URL = os.environ.get(
    "IDEMPOTENCY_VERIFY_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//"
)
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("IDEMPOTENCY_VERIFY_QUEUE", "idem-verify")
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_WORKER_ENABLE_REMOTE_CONTROL = False  # no reply queues left behind on a shared broker
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
