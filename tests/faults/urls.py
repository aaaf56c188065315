from __future__ import annotations

from django.urls import path

from tests.faults import views

urlpatterns = [
    path("health/", views.health),
    path("log-in/", views.log_in),
    path("warm/", views.warm),
    path("two-phase/", views.two_phase),
    path("two-phase-long/", views.two_phase_long),
    path("atomic/", views.atomic),
    path("atomic-long/", views.atomic_long),
    path("two-phase-renewed/", views.two_phase_renewed),
    path("recovery/", views.recovery),
]
