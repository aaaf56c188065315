"""A replay of a finished key is a read: it is served while the database refuses writes (a
read-only spell, a failover in progress), as issue 25 asks of the claim."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection

from tests.conftest import executions
from tests.vendors import READ_ONLY

Post = Callable[..., Any]

#: The two-phase and the atomic view (both ``POST``, a 201 stored).
VIEWS = ["/create/", "/atomic/"]


@contextmanager
def read_only() -> Iterator[None]:
    """This connection refuses writes until the block ends (the test's requests use it)."""
    on, off = READ_ONLY[connection.vendor]
    with connection.cursor() as cursor:
        cursor.execute(on)
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(off)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("view", VIEWS)
def test_a_finished_key_is_replayed_while_the_database_refuses_writes(
    post: Post, key: str, view: str
) -> None:
    if connection.vendor == "sqlite" and view == "/atomic/":
        pytest.skip("SQLite claims inside a transaction by inserting first (see SQLiteStore)")
    first = post(view, {"a": 1}, key=key)
    assert first.status_code == 201
    with read_only():
        replay = post(view, {"a": 1}, key=key)
        mismatch = post(view, {"a": 2}, key=key)
        new_key = post(view, {"a": 1}, key=f"{key}-new")
    assert (replay.status_code, replay.content) == (201, first.content)
    assert replay["Idempotent-Replayed"] == "true"
    assert mismatch.status_code == 422
    # The spell is real: a key that needs a write is refused, and no view ran but the first.
    assert new_key.status_code == 503
    assert executions() == 1
