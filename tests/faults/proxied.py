"""The server fixture of the modules that run the app in the test's own process, its store behind
the proxy (``proxied_store``): each server in turn, with ids apart from the vendor markers (a
test's keywords include its ids, and ``postgresql`` alone would skip it on the suite's SQLite).
A module imports :func:`proxied_server`, which overrides the suite's ``server`` there."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(
    scope="module", params=["postgresql", "mariadb"], ids=["pg-cluster", "mariadb"], name="server"
)
def proxied_server(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(request.param)
