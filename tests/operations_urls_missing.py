"""tests/test_operations.py's URLconf of views using ``in_progress="accepted"`` without the
status endpoint (check E071)."""

from __future__ import annotations

from django.urls import path

from tests.testapp import operations_views as views

urlpatterns = [
    path("export/", views.export),
    path("conflicting/", views.conflicting),
    path("drf-export/", views.DrfExport.as_view()),
    path("ninja/", views.api.urls),
]
