"""The Celery app of tests/test_celery.py's workers: ``celery -A tests.celery_app worker``, with
``DJANGO_SETTINGS_MODULE=tests.celery_settings``. Its task is the recipe of docs/consumers.rst
(``tests.testapp.celery_tasks``)."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import task_postrun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.celery_settings")

app = Celery("tests", include=["tests.testapp.celery_tasks", "tests.testapp.operations_tasks"])
app.config_from_object("django.conf:settings", namespace="CELERY")


@task_postrun.connect
def record_success(task_id: str, state: str | None = None, **kwargs: Any) -> None:
    """One ``task-succeeded`` row per task that ended well (a retry ends as ``RETRY``): the test
    knows every message was handled, duplicates and retries included, before it counts effects."""
    if state == "SUCCESS":
        from tests.testapp.models import Execution

        Execution.objects.create(label="task-succeeded", payload=task_id)
