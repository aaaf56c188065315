"""A database server of the fault suite's own (:mod:`tests.faults.databases`), made a Django
database alias of this process, so that a test can make it the idempotency store and restart,
stop or make read-only the server under a view running in the test's own thread (issue 25).

The machine's shared servers are never touched. The ports come from ``IDEMPOTENCY_FAULT_PORTS``
as in the fault suite; outside its CI leg they default to this suite's range.
"""

from __future__ import annotations

import os
from contextlib import suppress
from typing import Any

import dj_database_url
from django.core.management import call_command
from django.db import connections

from django_idempotency import _store
from tests.faults import databases

DEFAULT_PORTS = "26000-26099"
START_TIMEOUT = databases.START_TIMEOUT
Server = databases.PostgresCluster | databases.MariaDBServer


def make(vendor: str) -> Server:
    """A server of ``vendor`` (``postgresql`` or ``mysql``), made and started, its database
    (:data:`tests.faults.databases.DATABASE`) created."""
    os.environ.setdefault(databases.PORTS_VARIABLE, DEFAULT_PORTS)
    server: Server = (
        databases.PostgresCluster() if vendor == "postgresql" else databases.MariaDBServer()
    )
    server.create()
    return server


def vendor(server: Server) -> str:
    return "postgresql" if isinstance(server, databases.PostgresCluster) else "mysql"


def register(alias: str, server: Server, port: int | None = None) -> None:
    """Add ``alias`` for the server's database to Django's connections, migrated (through
    ``port``, a proxy's, when given)."""
    settings: dict[str, Any] = dict(dj_database_url.parse(server.url(port)))
    if vendor(server) == "mysql":
        settings["OPTIONS"] = {"charset": "utf8mb4"}
    configured = {"default": connections.settings["default"], alias: settings}
    connections.settings[alias] = connections.configure_settings(configured)[alias]
    call_command("migrate", "django_idempotency", database=alias, verbosity=0)


def unregister(alias: str) -> None:
    """Remove ``alias``, and the app's store bound to it (the next server may be another
    vendor's under the same alias)."""
    _store._BOUND.pop(alias, None)
    if alias in connections.settings:
        connections[alias].close()
        del connections.settings[alias]
        with suppress(AttributeError):
            delattr(connections._connections, alias)


def terminate(server: Server) -> int:
    """End the app's sessions (``pg_terminate_backend``, ``KILL CONNECTION``): how many."""
    if isinstance(server, databases.PostgresCluster):
        return server.terminate_backends(databases.DATABASE)
    return server.terminate_backends()
