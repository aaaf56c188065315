"""Settings of the app processes the fault suite starts (``tests/faults/app.py``).

The test suite's settings, on the database ``DATABASE_URL`` names (a fault server of the suite's
own, or a proxy in front of it), with the fault views' urls. ``IDEMPOTENCY_FAULT_CONN_MAX_AGE``
(seconds) and ``IDEMPOTENCY_FAULT_HEALTH_CHECKS=1`` make the connections persistent (item 4);
``IDEMPOTENCY_FAULT_POOL=1`` turns Django's pool on (PostgreSQL, issue 39).
"""

from __future__ import annotations

import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES

ROOT_URLCONF = "tests.faults.urls"

for _alias in ("default", "idempotency"):
    DATABASES[_alias]["CONN_MAX_AGE"] = int(os.environ.get("IDEMPOTENCY_FAULT_CONN_MAX_AGE", "0"))
    DATABASES[_alias]["CONN_HEALTH_CHECKS"] = (
        os.environ.get("IDEMPOTENCY_FAULT_HEALTH_CHECKS") == "1"
    )
    if DATABASES[_alias]["ENGINE"] == "django.db.backends.postgresql":
        # A dead server is found out in seconds, not at the kernel's TCP timeout.
        DATABASES[_alias]["OPTIONS"] = {
            **DATABASES[_alias].get("OPTIONS", {}),
            "connect_timeout": 3,
        }
        if os.environ.get("IDEMPOTENCY_FAULT_POOL") == "1":  # Django's pool (issue 39)
            # As docs/scale.rst advises: a connection for each of a worker's threads (a request
            # holds one from its claim to its end) and one for the lock renewer.
            DATABASES[_alias]["OPTIONS"]["pool"] = {"min_size": 2, "max_size": 17}
    elif DATABASES[_alias]["ENGINE"] == "django.db.backends.mysql":
        DATABASES[_alias]["OPTIONS"] = {**DATABASES[_alias]["OPTIONS"], "connect_timeout": 3}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # With the time: the renewals' and takeovers' timing is what a scenario's log shows (issue 39).
    "formatters": {
        "plain": {"format": "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"}
    },
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "django_idempotency": {"handlers": ["stderr"], "level": "INFO"},
        # A 500's traceback, in the server's log the suite prints when a scenario fails.
        "django.request": {"handlers": ["stderr"], "level": "ERROR"},
    },
}
