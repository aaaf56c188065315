"""Settings of the example payments API: SQLite next to this file, PostgreSQL when
``DATABASE_URL`` is set (``postgres://user@host:5432/name``).

Development settings only: DEBUG is on and the secret key is public unless the environment
says otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-project-insecure-development-key")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]", "testserver"]

# conn_max_age=0: runserver (and any server with a thread per request) would keep one idle
# connection per thread it ever ran. Under gunicorn's sync workers a longer CONN_MAX_AGE is
# fine (one connection per worker); under threads or ASGI use a pool (docs: quickstart).
DATABASES = {
    "default": dj_database_url.config(
        default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}", conn_max_age=0
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The outbox's stand-in tasks write from threads of the web process (payments/tasks.py).
    # A SQLite transaction begun DEFERRED (Django's default) that has read cannot then wait
    # for the write lock: the refund's check-then-insert was refused at once with "database is
    # locked", a 500 (CI's schemathesis leg; 16 of 300 refunds beside running exports). Begun
    # IMMEDIATE (Django 5.1+), each waits its turn, up to "timeout" seconds.
    DATABASES["default"]["OPTIONS"] = {
        **DATABASES["default"].get("OPTIONS", {}),
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    # First, so its runserver (which migrates first) wins over staticfiles' one.
    "example_project.payments",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's files served from here, not from a CDN
    "django_idempotency",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"
ASGI_APPLICATION = "example_project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # curl -u admin:password ... sends requests as the superuser; keys are per user.
        "rest_framework.authentication.BasicAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Example payments API",
    "DESCRIPTION": (
        "Charges and refunds made safe to retry with the Idempotency-Key header "
        "(django-idempotency's example project). Request bodies are JSON or forms; "
        "read-only fields and fields the API does not know are ignored."
    ),
    "VERSION": "1.0.0",
    # Request bodies get components of their own (ChargeRequest...) without the read-only
    # fields, which a request may carry and the API ignores (issue 32).
    "COMPONENT_SPLIT_REQUEST": True,
    # /api/docs/ works offline: the UI's JavaScript and CSS come from drf-spectacular-sidecar
    # through staticfiles.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# Every key is optional; these are the defaults, spelled out for the reader.
IDEMPOTENCY = {
    "HEADER": "Idempotency-Key",
    "METHODS": ["POST", "PATCH"],
    "TTL": 24 * 60 * 60,
    "LOCK_TIMEOUT": 30,
    # Stored responses encrypted at rest when keys are given, comma-separated (docs: "Storage");
    # a bad key stops the server at startup.
    "ENCRYPTION_KEYS": [
        k for k in os.environ.get("IDEMPOTENCY_ENCRYPTION_KEYS", "").split(",") if k
    ],
}

# The charges' receipts (payments/tasks.py) are printed by the server, not mailed.
EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
DEFAULT_FROM_EMAIL = "payments@example.com"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_idempotency": {"handlers": ["console"], "level": "INFO"},
        # A 500's traceback in the server's log, DEBUG or not.
        "django.request": {"handlers": ["console"], "level": "ERROR"},
    },
}
