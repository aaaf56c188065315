"""The fault scenario on SQLite: the database file held by another process's ``BEGIN
EXCLUSIVE`` past the busy wait (:mod:`tests.faults.storm` says what it asserts)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.faults.catalogue import sqlite_fault
from tests.faults.storm import check, run

pytestmark = pytest.mark.faults


@pytest.mark.parametrize("mode", ["two-phase", "atomic"])
def test_exclusive_lock(mode: str, sqlite: Any, sqlite_app: Any, sqlite_store: Any) -> None:
    figures = run(sqlite_app, sqlite_store, "sqlite", sqlite_fault(sqlite, mode), mode)
    check(figures, sqlite_app)
