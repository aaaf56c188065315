"""A fault proxy (:class:`tests.faults.proxy.FaultProxy`) made and stopped in one place: in front
of one of the fault suite's own servers (``tests/faults/conftest.py``), of a private
redis-server, or of the suite's own test database with a Django alias through it
(``tests/test_blackhole.py``, ``tests/test_renewal_postgresql.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connections

from tests import own_servers
from tests.faults.databases import free_port
from tests.faults.proxy import FaultProxy

#: A server's port when the test database's settings name none.
DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306}


@contextmanager
def proxying(
    upstream: int, port: int | None = None, host: str = "127.0.0.1"
) -> Iterator[FaultProxy]:
    """A proxy on ``port`` (by default one of the fault suite's, ``IDEMPOTENCY_FAULT_PORTS``) to
    ``host:upstream``, stopped at the end."""
    proxy = FaultProxy(free_port() if port is None else port, upstream, host).start()
    try:
        yield proxy
    finally:
        proxy.stop()


@contextmanager
def proxied_alias(
    alias: str, port: int, django_db_blocker: Any, **options: Any
) -> Iterator[FaultProxy]:
    """A proxy on ``port`` to the test database's server, and ``alias``, the test database
    through it: no persistent connections, and Django's pool (``IDEMPOTENCY_TEST_POOL``) left
    out, as a pool refuses ``CONN_MAX_AGE``, which a test may set; ``options`` added to the
    database's ``OPTIONS``. The alias, and the app's store bound to it, are gone at the end."""
    settings = dict(connections["default"].settings_dict)
    upstream = int(settings["PORT"] or DEFAULT_PORTS[connections["default"].vendor])
    kept = {
        name: value for name, value in (settings.get("OPTIONS") or {}).items() if name != "pool"
    }
    try:
        with proxying(upstream, port, settings["HOST"] or "127.0.0.1") as proxy:
            connections.settings[alias] = {
                **settings,
                "HOST": "127.0.0.1",
                "PORT": str(proxy.port),
                "OPTIONS": {**kept, **options},
                "CONN_MAX_AGE": 0,
                "TEST": {"MIRROR": "default"},
            }
            yield proxy
    finally:
        with django_db_blocker.unblock():
            own_servers.unregister(alias)
