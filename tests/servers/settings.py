"""Settings of the real server processes the server tests start (``tests/servers/harness.py``).

They are the test suite's settings, pointed at the pytest-django test database whose name the
harness passes in ``IDEMPOTENCY_SERVER_DB``, with the server views' urls and logs on stderr.
"""

from __future__ import annotations

import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES, MIDDLEWARE

ROOT_URLCONF = "tests.servers.urls"

_test_database = os.environ["IDEMPOTENCY_SERVER_DB"]
for _alias in ("default", "idempotency"):
    DATABASES[_alias] = {**DATABASES[_alias], "NAME": _test_database}
# A server that refuses connections: nothing listens on port 1 (as in tests/test_unavailable.py).
DATABASES["unreachable"] = {
    **DATABASES["default"],
    "HOST": "127.0.0.1",
    "PORT": "1",
    "OPTIONS": {"connect_timeout": 2},
}

if os.environ.get("IDEMPOTENCY_SERVER_KIND") == "wsgi":
    # Counting statements wraps the request in a sync middleware; on ASGI that would run the
    # async views in a thread, which is not what the async storm is meant to show.
    MIDDLEWARE = ["tests.servers.middleware.count_statements", *MIDDLEWARE]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(process)d %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "django_idempotency": {"handlers": ["stderr"], "level": "INFO"},
        # A 500's traceback, which the test's failure prints with the server's log.
        "django.request": {"handlers": ["stderr"], "level": "ERROR", "propagate": False},
    },
}
