"""Settings of the overhead benchmark's project: the database at ``BENCH_DATABASE_URL``.

No middleware beyond the one query of authentication: the figures are the app's cost, not a stack's.
"""

from __future__ import annotations

import os

import dj_database_url

SECRET_KEY = "django-idempotency-benchmark"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "benchmarks.overhead_project.urls"
DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench_overhead"),
        # benchmarks/scale.py serves the async view with 0: under ASGI each request's database
        # work runs on a thread of its own, and persistent connections outlive those threads.
        conn_max_age=int(os.environ.get("BENCH_CONN_MAX_AGE", "600")),
    )
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_idempotency",
    "example_project.payments",
]
try:
    import drf_idempotency  # noqa: F401  (the peer: in the benchmarks' own environment only)
except ImportError:
    pass
else:
    # Its settings are read from IDEMPOTENCY too: this project sets none, so both use defaults.
    INSTALLED_APPS.append("drf_idempotency")
# benchmarks/stores.py: the Redis store (issue 44) through a Django cache alias.
if os.environ.get("BENCH_REDIS_URL"):
    CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "redis": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": os.environ["BENCH_REDIS_URL"],
        },
    }
MIDDLEWARE = [
    "benchmarks.overhead_project.middleware."
    + ("lazy_bearer_user" if os.environ.get("BENCH_AUTH") == "lazy" else "bearer_user")
]
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"null": {"class": "logging.NullHandler"}},
    "loggers": {
        "django_idempotency": {"handlers": ["null"], "level": "WARNING", "propagate": False}
    },
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.mysql":
    DATABASES["default"]["OPTIONS"] = {"charset": "utf8mb4"}
if os.environ.get("BENCH_PREPARED_STATEMENTS"):
    # overhead.py --prepared-statements: what docs/performance.rst recommends.
    DATABASES["default"]["OPTIONS"] = {"server_side_binding": True, "prepare_threshold": 5}
