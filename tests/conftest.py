from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from tests.testapp.models import Execution

#: Suites that need a server of their own, which only their CI leg starts: elsewhere they are not
#: selected rather than skipped (a skip on a server database fails CI).
_OWN_LEG = {
    "pgbouncer": "IDEMPOTENCY_TEST_PGBOUNCER_POOL_SIZE",  # .ci/leg-pgbouncer
    "galera": "IDEMPOTENCY_GALERA",  # .ci/leg-galera
    "galera_app": "IDEMPOTENCY_GALERA_APP",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    elsewhere = {marker for marker, variable in _OWN_LEG.items() if not os.environ.get(variable)}
    deselected = [item for item in items if elsewhere & set(item.keywords)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if not elsewhere & set(item.keywords)]
    if os.environ.get("DATABASE_URL", "").startswith(("postgres", "postgresql")):
        return
    skip = pytest.mark.skip(reason="needs PostgreSQL: set DATABASE_URL")
    for item in items:
        if "postgresql" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def key() -> str:
    return str(uuid.uuid4())


@pytest.fixture
def post(client: Client) -> Callable[..., Any]:
    """POST JSON with an Idempotency-Key (``key=None`` sends none)."""

    def send(path: str, data: Any = None, *, key: str | None, **extra: Any) -> Any:
        headers = dict(extra.pop("headers", {}))
        if key is not None:
            headers["Idempotency-Key"] = key
        content_type = extra.pop("content_type", "application/json")
        return client.post(path, data or {}, content_type=content_type, headers=headers, **extra)

    return send


def executions(label: str | None = None) -> int:
    queryset = Execution.objects.all()
    return (queryset.filter(label=label) if label else queryset).count()


def worker_environment() -> dict[str, str]:
    """The environment of a worker process using this run's PostgreSQL test database."""
    settings = connection.settings_dict
    url = f"postgres://{settings['USER']}@{settings['HOST']}:{settings['PORT']}/{settings['NAME']}"
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": url}


def on_postgresql() -> bool:
    return connection.vendor == "postgresql"


def problem_slug(response: Any) -> str:
    """The slug of an RFC 9457 problem response's ``type``."""
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == response.status_code
    assert body["title"] and body["detail"]
    return str(body["type"].rsplit("#", 1)[1])
