"""A URLconf of its own (``@pytest.mark.urls``) for ``tests/test_sealing.py`` and
``tests/test_erasure.py``."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from tests.testapp import sealing_views as views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("charge/", views.charge),
    path("hold/", views.hold),
]
