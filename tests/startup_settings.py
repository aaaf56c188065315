"""Settings of a server started with ``settings.IDEMPOTENCY`` from the environment
(``IDEMPOTENCY_STARTUP_SETTINGS``, JSON): ``tests/test_startup_settings.py`` boots gunicorn and
uvicorn on them, and they must refuse what ``manage.py check`` refuses."""

from __future__ import annotations

import json
import os

from tests.settings import *  # noqa: F403

ROOT_URLCONF = "tests.servers.urls"
IDEMPOTENCY = json.loads(os.environ.get("IDEMPOTENCY_STARTUP_SETTINGS", "{}"))
