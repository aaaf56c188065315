"""The URLconf of tests/test_operations*.py: the status endpoint and views starting operations."""

from __future__ import annotations

from django.urls import include, path

from tests.testapp import operations_views as views

urlpatterns = [
    path("idempotency/", include("django_idempotency.urls")),
    path("export/", views.export),
    path("async-export/", views.async_export),
    path("conflicting/", views.conflicting),
    path("created/", views.created),
    path("started/", views.started),
    path("drf-export/", views.DrfExport.as_view()),
    path("ninja/", views.api.urls),
    path("ninja-status/", views.status_api.urls),
]
