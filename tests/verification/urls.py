from __future__ import annotations

import os

from django.urls import path

from tests.verification import views

urlpatterns = [
    path("health/", views.health),
    path("setup/", views.setup),
    path("atomic-effects/", views.atomic_effects),
    path("mixin/", views.MixinView.as_view()),
    path("function/", views.function),
    path("plain/", views.plain),
    path("short-ttl/", views.short_ttl),
    # The Redis store refuses atomic mode (E061).
    *([] if os.environ.get("IDEMPOTENCY_VERIFY_REDIS_URL") else [path("atomic/", views.atomic)]),
]
