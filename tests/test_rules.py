"""Each rule of :mod:`._base.rules` says the same in SQL, as a ``Q`` and in Python.

Records covering every combination of the fields the rules read are written to the database;
for each rule, the rows its SQL selects, the rows its ``Q`` filters and the records its Python
test accepts must be the same set.
"""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone

from django_idempotency import IdempotencyKey
from django_idempotency._base import rules
from django_idempotency._store.rows import prep
from tests.factories import IdempotencyKeyFactory

pytestmark = pytest.mark.django_db

RULES = {"EXPIRED": rules.EXPIRED, "STALE": rules.STALE, "TAKEOVER": rules.TAKEOVER}
RULES["DELETABLE"] = rules.DELETABLE


@pytest.mark.parametrize("name", sorted(RULES))
def test_a_rule_selects_the_same_records_in_sql_as_q_and_in_python(name: str) -> None:
    rule = RULES[name]
    now = timezone.now()
    past, future = now - timedelta(minutes=1), now + timedelta(minutes=1)
    combinations = itertools.product(
        IdempotencyKey.Status.values,  # status
        [None, past, now, future],  # unlock_at
        [past, now, future],  # expires_at
        # A fingerprint of another case is another request: MySQL and MariaDB compared the
        # column case-insensitively until migration 0007 (issue 38).
        ["same", "other", "SAME"],  # request_hash
    )
    for number, (status, unlock_at, expires_at, request_hash) in enumerate(combinations):
        IdempotencyKeyFactory(
            key_hash=f"{number:064d}",
            status=status,
            unlock_at=unlock_at,
            expires_at=expires_at,
            request_hash=request_hash,
        )
    records = list(IdempotencyKey.objects.all())
    assert len(records) == 3 * 4 * 3 * 3

    in_python = {r.pk for r in records if rule.holds(r, now, "same")}
    in_q = set(IdempotencyKey.objects.filter(rule.filter(now, "same")).values_list("pk", flat=True))
    connection = connections["default"]
    q = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {q('id')} FROM {q(IdempotencyKey._meta.db_table)} WHERE {rule.where(q)}",
            rule.args(prep("expires_at", now, connection), "same"),
        )
        in_sql = {row[0] for row in cursor.fetchall()}
    assert in_python == in_q == in_sql
    assert 0 < len(in_python) < len(records)  # the rule tells records apart


def test_the_models_flags_are_the_rules() -> None:
    """``is_stale`` and ``is_expired`` (the admin's columns) ask the rules, at this moment."""
    now = timezone.now()
    for status in IdempotencyKey.Status.values:
        for moment in (None, now - timedelta(minutes=1), now + timedelta(minutes=1)):
            record = IdempotencyKey(
                status=status, unlock_at=moment, expires_at=moment or now + timedelta(minutes=1)
            )
            assert record.is_stale is rules.STALE.holds(record, timezone.now())
            assert record.is_expired is rules.EXPIRED.holds(record, timezone.now())
