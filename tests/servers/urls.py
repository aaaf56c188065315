from __future__ import annotations

from django.urls import path

from tests.servers import bodies, views

urlpatterns = [
    path("health/", views.health),
    path("t/<str:tenant>/orders/", views.tenant_order),
    path("protected/", bodies.Protected.as_view()),
    path("slow/", views.slow),
    path("async-slow/", views.async_slow),
    path("crash/", views.crash),
    path("three-steps/", views.three_steps),
    path("derived/", views.derived),
    path("late/", views.late),
    path("wait/", views.wait),
    path("wait-short/", views.wait_short),
    path("async-wait/", views.async_wait),
    path("atomic/", views.atomic),
    path("atomic-short/", views.atomic_short),
    path("refusing/", views.refusing),
    path("lose-db/", views.lose_db),
    path("renewed/", views.renewed),
    path("renewed-wait/", views.renewed_wait),
    path("renewed-async/", views.renewed_async),
]
