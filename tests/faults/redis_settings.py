"""Settings of the app processes under a Redis fault (issue 44): the fault suite's, with every
record in the Redis store ``IDEMPOTENCY_FAULT_REDIS_URL`` names (a private ``redis-server``)
and only the two-phase views' urls: the fault URLconf's atomic views are refused there (E061).
The app's own tables (sessions, users) stay on ``DATABASE_URL`` (a SQLite file)."""

from __future__ import annotations

import os

from tests.faults.settings import *  # noqa: F403

ROOT_URLCONF = "tests.faults.redis_urls"
IDEMPOTENCY = {"STORE": os.environ["IDEMPOTENCY_FAULT_REDIS_URL"]}
