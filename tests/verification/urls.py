from __future__ import annotations

import os

from django.urls import include, path

from tests.verification import views

DATABASE_ONLY = [path("atomic/", views.atomic)]
urlpatterns = [
    path("health/", views.health),
    path("setup/", views.setup),
    path("atomic-effects/", views.atomic_effects),
    path("mixin/", views.MixinView.as_view()),
    path("function/", views.function),
    path("plain/", views.plain),
    path("short-ttl/", views.short_ttl),
    path("steps/", views.steps),
    path("outbox/", views.outbox),
    path("outbox-state/", views.outbox_state),
    path("accepted/", views.accepted),
    path("export/", views.export),
    path("function-policy/", views.function_policy),
    path("async/", views.async_view),
    path("ninja/", views.api.urls),
    path("call/", views.call),
    path("idempotency/", include("django_idempotency.urls")),
    # The Redis store refuses atomic mode (E061); its outbox and operations are served above.
    *([] if os.environ.get("IDEMPOTENCY_VERIFY_REDIS_URL") else DATABASE_ONLY),
]
