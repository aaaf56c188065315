"""The fault views the Redis store serves (issue 44): the two-phase ones only (the Redis store
refuses ``atomic=True``, check E061)."""

from __future__ import annotations

from django.urls import path

from tests.faults import views

urlpatterns = [
    path("health/", views.health),
    path("log-in/", views.log_in),
    path("warm/", views.warm),
    path("two-phase/", views.two_phase),
    path("two-phase-renewed/", views.two_phase_renewed),
]
