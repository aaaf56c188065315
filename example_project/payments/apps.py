from __future__ import annotations

from django.apps import AppConfig


class PaymentsConfig(AppConfig):
    name = "example_project.payments"
    label = "payments"
    default_auto_field = "django.db.models.BigAutoField"
