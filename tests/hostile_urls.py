"""A URLconf of its own (``@pytest.mark.urls``): ``short_ttl`` fails the system check on purpose."""

from __future__ import annotations

from django.urls import path

from tests.testapp import hostile_views as views

urlpatterns = [
    path("echo/", views.echo),
    path("upload/", views.upload),
    path("stream/", views.stream),
    path("short-ttl/", views.short_ttl),
    path("drf-atomic-validating/", views.DrfAtomicValidatingView.as_view()),
    path("drf-atomic-unavailable/", views.DrfAtomicUnavailableView.as_view()),
    path("drf-upload/", views.DrfUploadView.as_view()),
    path("drf-post-only/", views.DrfPostOnlyView.as_view()),
    path("drf-get-only/", views.DrfGetOnlyView.as_view()),
]
