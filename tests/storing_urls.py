"""A URLconf of its own (``@pytest.mark.urls``) for the views of ``tests/test_storing.py``."""

from __future__ import annotations

from django.urls import include, path
from rest_framework.routers import SimpleRouter

from tests.testapp import storing_views as views

router = SimpleRouter()
router.register("viewset", views.DrfViewSet, basename="viewset")

urlpatterns = [
    path("function/", views.function_view),
    path("async/", views.async_view),
    path("atomic/", views.atomic_view),
    path("class/", views.ClassView.as_view()),
    path("drf/", views.DrfView.as_view()),
    path("drf-atomic/", views.DrfAtomicView.as_view()),
    path("api-view-inner/", views.api_view_inner),
    path("", include(router.urls)),
]
