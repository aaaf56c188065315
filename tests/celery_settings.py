"""Django settings of the Celery workers that tests/test_celery.py starts: the suite's settings,
the Celery recipe of docs/consumers.rst (included from here), and a broker of the test's own."""

from __future__ import annotations

import os

from tests.settings import *  # noqa: F403

# The Celery recipe: a project's settings.py, read with
# app.config_from_object("django.conf:settings", namespace="CELERY").
CELERY_TASK_ACKS_LATE = True  # acknowledge a task when it ends: a killed worker's task comes back
CELERY_TASK_REJECT_ON_WORKER_LOST = True  # also when only its pool process was killed
CELERY_WORKER_PREFETCH_MULTIPLIER = 1  # a worker holds no more unacknowledged tasks than it runs
CELERY_BROKER_TRANSPORT_OPTIONS = {  # Redis and SQS only: RabbitMQ needs none of these
    "visibility_timeout": 3600,  # a task not acknowledged this long after delivery comes back
    "unacked_restore_interval": 10,  # look for such tasks every 10 s...
    "unacked_restore_throttle": 1,  # ...every time (kombu's default: every 10th time, 100 s)
}
# End of the recipe.

# The test's own: its broker, queue and Redis key prefix (tests/test_celery.py sets them), and
# short timeouts so that a killed worker's task and key come back within seconds.
CELERY_BROKER_URL = os.environ.get("IDEMPOTENCY_TEST_BROKER_URL", "")
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("IDEMPOTENCY_TEST_CELERY_QUEUE", "celery")
CELERY_TASK_IGNORE_RESULT = True
CELERY_WORKER_ENABLE_REMOTE_CONTROL = False  # no reply queues left behind on a shared broker
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {
    **CELERY_BROKER_TRANSPORT_OPTIONS,
    "visibility_timeout": 10,  # the killed worker's task comes back 10 s after its delivery
    "unacked_restore_interval": 1,
    "global_keyprefix": os.environ.get("IDEMPOTENCY_TEST_REDIS_PREFIX", ""),
}
IDEMPOTENCY = {
    "LOCK_TIMEOUT": 5,
    # tests/test_outbox_celery.py: a killed relay's batch is taken again 2 s after it was taken.
    "OUTBOX_LEASE": 2,
    "OUTBOX_FAST_PATH": not os.environ.get("IDEMPOTENCY_TEST_NO_FAST_PATH"),
}
