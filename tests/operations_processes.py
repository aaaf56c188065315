"""The web process of ``tests/test_celery_operations.py``: ``python -m tests.operations_processes
KEY`` sends the export's first request (its view enqueues the task through the outbox, sent to
the test's broker by the fast path) and prints the response as JSON; with the Celery workers'
settings (``tests.celery_settings``). Also the URLconf it serves."""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.celery_settings")

import django

import tests.celery_app  # noqa: F401  (the project's Celery app, as its __init__ loads it)

django.setup()

from django.http import HttpRequest, HttpResponse, JsonResponse  # noqa: E402
from django.test import Client, override_settings  # noqa: E402
from django.urls import include, path  # noqa: E402

from django_idempotency import idempotent  # noqa: E402
from tests.testapp.operations_tasks import export  # noqa: E402


@idempotent(in_progress="accepted")
def start_export(request: HttpRequest) -> HttpResponse:
    claim = request.idempotency  # type: ignore[attr-defined]
    claim.enqueue(export, claim.operation_id)
    return JsonResponse(
        {"operation": claim.operation_id}, status=202, headers={"Location": claim.operation_url}
    )


urlpatterns = [
    path("idempotency/", include("django_idempotency.urls")),
    path("export/", start_export),
]

if __name__ == "__main__":
    with override_settings(ROOT_URLCONF="tests.operations_processes"):
        response = Client().post(
            "/export/",
            {},
            content_type="application/json",
            headers={"Idempotency-Key": sys.argv[1]},
        )
    print(json.dumps({"status": response.status_code, "body": json.loads(response.content)}))
