"""Settings for the test suite: SQLite by default; PostgreSQL or MySQL/MariaDB when DATABASE_URL
is set (``postgres://...`` or ``mysql://...``)."""

from __future__ import annotations

import importlib.util
import os
import tempfile

import dj_database_url

SECRET_KEY = "django-idempotency-tests"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "tests.urls"
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"  # unlike ours: must not make a migration

_url = os.environ.get("DATABASE_URL", "")
#: Server-side binding and prepared statements (psycopg's own threshold): the connection
#: docs/performance.rst recommends.
_PREPARED_STATEMENTS = {"server_side_binding": True, "prepare_threshold": 5}
if _url:
    DATABASES = {"default": dj_database_url.parse(_url, conn_max_age=0)}
    # Several suites may share one server (developers, CI): each can name its own test database.
    DATABASES["default"]["TEST"] = {"NAME": os.environ.get("IDEMPOTENCY_TEST_DB") or None}
    if os.environ.get("IDEMPOTENCY_TEST_PGBOUNCER_POOL_SIZE"):  # .ci/leg-pgbouncer
        # A named cursor outlives the transaction PgBouncer (transaction mode) lends a server for.
        DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
    if os.environ.get("IDEMPOTENCY_TEST_PREPARED"):  # CI runs the whole suite so as well
        DATABASES["default"]["OPTIONS"] = {**_PREPARED_STATEMENTS}
    if DATABASES["default"]["ENGINE"] == "django.db.backends.mysql":
        # What docs/installation.rst asks of a project; Django's default isolation level (read
        # committed) is left alone.
        DATABASES["default"]["OPTIONS"] = {"charset": "utf8mb4"}
        DATABASES["default"]["TEST"].update(CHARSET="utf8mb4", COLLATION="utf8mb4_unicode_ci")
else:
    # The test database is a file, not Django's default in-memory one: the threads of a test
    # (the renewer, a storm, a waiter) then share it through SQLite's own locks and busy wait,
    # as a deployed SQLite database is shared. An in-memory test database is shared through
    # SQLite's "shared cache", whose table locks fail at once ("database table is locked")
    # instead of waiting: a test's poll or claim failed whenever another thread was writing
    # (issue 32). One file per pytest process, so that runs side by side never share one.
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": ":memory:",
            "TEST": {
                "NAME": os.path.join(
                    tempfile.gettempdir(), f"django-idempotency-tests-{os.getpid()}.sqlite3"
                )
            },
            # Nothing waits for a disk flush: a test database need not survive a power cut.
            "OPTIONS": {"init_command": "PRAGMA synchronous=OFF"},
        }
    }

# The same database under two more aliases, test mirrors (test cases open no transaction on
# them): "idempotency" is the separate claim connection that ATOMIC_REQUESTS projects need, and
# tests/test_unavailable.py makes "unreachable" unreachable.
#: Django's connection pool (PostgreSQL): what .ci/run's py3.13 leg runs the whole suite under
#: (issue 39). CONN_HEALTH_CHECKS stays off, Django's default: the pool hands its
#: connections out unchecked.
POOL = {"min_size": 2, "max_size": 8}
if os.environ.get("IDEMPOTENCY_TEST_POOL") and DATABASES["default"]["ENGINE"].endswith(
    "postgresql"
):
    DATABASES["default"]["OPTIONS"] = {**DATABASES["default"].get("OPTIONS", {}), "pool": POOL}

for _alias in ("idempotency", "unreachable"):
    DATABASES[_alias] = {**DATABASES["default"], "TEST": {"MIRROR": "default"}}
# A pool is made once per alias, from its first settings: tests/test_unavailable.py points this
# alias elsewhere for a while, which a pool would not see.
DATABASES["unreachable"]["OPTIONS"] = {
    name: value for name, value in DATABASES["default"].get("OPTIONS", {}).items() if name != "pool"
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # tests/test_prepared_statements_postgresql.py
    DATABASES["prepared"] = {
        **DATABASES["default"],
        "OPTIONS": {**_PREPARED_STATEMENTS},
        "TEST": {"MIRROR": "default"},
    }

# The Redis store's tests (issue 44): a Redis cache alias, on the server .ci/leg-redis starts (or
# IDEMPOTENCY_TEST_REDIS_STORE_URL); IDEMPOTENCY_TEST_STORE=redis runs the semantic suite on it.
REDIS_URL = os.environ.get("IDEMPOTENCY_TEST_REDIS_STORE_URL", "redis://127.0.0.1:6379/8")
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "redis": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL},
}

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",  # the admin's CSS, for tests/test_admin_browser.py
    "rest_framework",
    "rest_framework.authtoken",
    "django_idempotency",
    "tests.testapp",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

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

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"null": {"class": "logging.NullHandler"}},
    "loggers": {"django_idempotency": {"handlers": ["null"], "level": "DEBUG"}},
}

#: The suite's outbox tasks (tests.testapp.outbox_tasks) are Celery look-alikes the tests read
#: back: where Celery is not installed (the README's install, CI's legs without the celery
#: extra) E056 would refuse every test that sets an OUTBOX_ key, which is what it is for in a
#: project. tests/test_startup_settings.py unsilences it to test that refusal.
SILENCED_SYSTEM_CHECKS = (
    [] if importlib.util.find_spec("celery") is not None else ["django_idempotency.E056"]
)
