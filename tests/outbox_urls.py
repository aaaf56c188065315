"""A URLconf of its own (``@pytest.mark.urls``) for ``tests/test_outbox.py``."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from tests.testapp import outbox_views as views

urlpatterns = [
    path("order/", views.order),
    path("atomic/", views.atomic_order),
    path("async/", views.async_order),
    path("short/", views.lock_lost_order),
    path("drf/", views.DrfOrder.as_view()),
    path("notify/", views.notify_order),
    path("probed/", views.probed_order),
    path("admin/", admin.site.urls),
]
