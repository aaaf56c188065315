"""The operation status endpoint: ``path("idempotency/",
include("django_idempotency.urls"))`` serves ``GET idempotency/operations/<id>`` and the
principal's list, ``GET idempotency/operations/``.

The namespace is ``django_idempotency``; a claim's ``operation_url`` is reversed from it.
"""

from __future__ import annotations

from django.urls import path

from django_idempotency._http.operations import operation_list, operation_status

__all__ = ["app_name", "urlpatterns"]

app_name = "django_idempotency"

urlpatterns = [
    path("operations/", operation_list, name="operations"),
    path("operations/<str:operation_id>", operation_status, name="operation"),
]
