"""A connection that prepares statements (server-side binding) prepares the claim, and works."""

from __future__ import annotations

import uuid

import pytest
from django.db import connections
from django.test import Client, override_settings

from django_idempotency._store.postgresql import CLAIM_FUNCTION
from tests.conftest import executions

pytestmark = [
    pytest.mark.postgresql,
    pytest.mark.django_db(transaction=True, databases=["default", "prepared"]),
]


def prepared_statements() -> list[str]:
    with connections["prepared"].cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE NOT from_sql")
        return [row[0] for row in cursor.fetchall()]


def test_the_claim_is_prepared_and_replays_stay_byte_for_byte() -> None:
    client = Client()
    keys = [str(uuid.uuid4()) for _ in range(6)]
    with override_settings(IDEMPOTENCY={"DATABASE_ALIAS": "prepared"}):
        assert not any(f", {CLAIM_FUNCTION}(" in sql for sql in prepared_statements())

        def post(index: int, key: str) -> object:
            return client.post(
                "/create/",
                {"n": index},
                content_type="application/json",
                headers={"Idempotency-Key": key},
            )

        firsts = [post(index, key) for index, key in enumerate(keys)]
        replays = [post(index, key) for index, key in enumerate(keys)]
        claims = [sql for sql in prepared_statements() if f", {CLAIM_FUNCTION}(" in sql]

    assert [response.status_code for response in firsts] == [201] * 6
    assert [response.content for response in replays] == [response.content for response in firsts]
    assert {response.headers["Idempotent-Replayed"] for response in replays} == {"true"}
    assert executions() == 6
    # psycopg prepares a statement on its fifth execution on the connection (prepare_threshold).
    assert len(claims) == 1, claims
