from __future__ import annotations

from importlib.util import find_spec

from django.apps import AppConfig
from django.core.checks import Tags, register
from django.core.signals import setting_changed

__all__ = ["IdempotencyConfig"]


class IdempotencyConfig(AppConfig):
    name = "django_idempotency"
    verbose_name = "Idempotency"
    # Explicit, so a host project's DEFAULT_AUTO_FIELD never makes a migration for us.
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_idempotency._conf.settings import SETTINGS_CHECKS, connect_signals, usable
        from django_idempotency._ops import checks, store_checks
        from django_idempotency._store import forget_cache_stores

        # Tagged SETTINGS_CHECKS too: every error of theirs stops the app (usable()).
        register(Tags.compatibility, SETTINGS_CHECKS)(checks.check_settings)
        register(Tags.compatibility, SETTINGS_CHECKS)(checks.check_database)
        register(Tags.database)(checks.check_database_server)
        register(Tags.urls)(checks.check_views)
        register(Tags.urls)(store_checks.check_stores)
        register(Tags.database, deploy=True)(store_checks.check_stores_deploy)
        connect_signals()
        setting_changed.connect(forget_cache_stores, dispatch_uid="django_idempotency.stores")
        # A setting the checks refuse stops the server here, before any view runs: gunicorn
        # and uvicorn run no system checks.
        usable()
        if find_spec("drf_spectacular") is not None:
            # Registers the schema extension: protected views document themselves, and so
            # does the operation status endpoint.
            from django_idempotency._publish import openapi

            openapi.publish_operation_status()
