from __future__ import annotations

from django.urls import path

from benchmarks.overhead_project import views

urlpatterns = [
    path("bare/", views.bare),
    path("bare-atomic/", views.bare_atomic),
    path("two-phase/", views.two_phase),
    path("atomic/", views.atomic),
    path("django-only/", views.django_only),
    path("async-bare/", views.async_bare),
    path("async-two-phase/", views.async_two_phase),
    path("hot/", views.hot),
    path("hot-wait/", views.hot_wait),
]
if views.PEER:
    urlpatterns += [
        path("peer-two-phase/", views.peer_two_phase),
        path("peer-atomic/", views.peer_atomic),
    ]
if views.REDIS:
    urlpatterns += [path("two-phase-redis/", views.two_phase_redis)]
