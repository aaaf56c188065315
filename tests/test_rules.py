"""Each rule of :mod:`._base.rules` says the same in SQL, as a ``Q`` and in Python.

Records covering every combination of the fields the rules read are written to the database;
for each rule, the rows its SQL selects, the rows its ``Q`` filters and the records its Python
test accepts must be the same set. The Redis store's copies (its claim script's takeover, its
census's stale records) are run on a Redis server against the same cases. A result's status is
the one :func:`~django_idempotency._base.rules.stored_status` gives, as the store writes it and
as an operation's state reads it.
"""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.test import override_settings
from django.utils import timezone

from django_idempotency import IdempotencyKey
from django_idempotency._base import rules
from django_idempotency._store.operation_states import (
    FAILED,
    STATES,
    SUCCEEDED,
    state_filter,
    state_of,
)
from django_idempotency._store.rows import prep
from tests.conftest import REDIS_STORE_NAME, flush_redis, redis_client, redis_records
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


def test_an_operation_s_state_is_the_same_as_a_q_and_in_python() -> None:
    """The admin's filter by an operation's state (:func:`.state_filter`) puts each record a
    store can hold in exactly the state the status endpoint and the admin's column give it
    (:func:`.state_of`): running, stale, handed on (a ``202``), finished below and at
    ``LEAST_ERROR``, a function's result (no status)."""
    now = timezone.now()
    past, future = now - timedelta(minutes=1), now + timedelta(minutes=1)
    kept = [(rules.PROCESSING, None)] + [
        (rules.stored_status(code), code) for code in (None, 200, 202, 399, 400, 404, 500)
    ]
    for number, ((status, code), unlock_at) in enumerate(
        itertools.product(kept, [None, past, future])
    ):
        IdempotencyKeyFactory(
            key_hash=f"{number:064d}", status=status, response_status=code, unlock_at=unlock_at
        )
    records = list(IdempotencyKey.objects.all())
    in_q = {
        state: set(
            IdempotencyKey.objects.filter(state_filter(state, now)).values_list("pk", flat=True)
        )
        for state in STATES
    }
    for record in records:
        found = [state for state in STATES if record.pk in in_q[state]]
        assert found == [state_of(record, now)], (record.status, record.response_status)
    assert all(in_q.values())  # every state is met


#: Evaluates :data:`~django_idempotency._store.redis.scripts.TAKES_OVER` on a record given
#: as ARGV: now (µs), the claimant's fingerprint, status, fingerprint, unlock (µs, '' none).
_LUA_TAKES_OVER = """
local now = tonumber(ARGV[1])
local r = {ARGV[3], ARGV[4], '', false}
if ARGV[5] ~= '' then r[4] = ARGV[5] end
if %s then return 1 end
return 0
"""


@pytest.mark.redis
def test_the_redis_claims_takeover_is_the_rule() -> None:
    """The Redis claim script's takeover, run by a Redis server on every combination of the
    fields the rule reads, takes over what :data:`~.rules.TAKEOVER` does: an expired record is
    absent there (its TTL), and claimed afresh."""
    from django_idempotency._store.redis.scripts import TAKES_OVER

    script = redis_client().register_script(_LUA_TAKES_OVER % TAKES_OVER)
    now = timezone.now()
    us = _microseconds(now)
    past, future = now - timedelta(minutes=1), now + timedelta(minutes=1)
    cases = itertools.product(
        IdempotencyKey.Status.values,
        [None, past, now, future],  # unlock_at
        [past, now, future],  # expires_at
        ["same", "other", "SAME"],  # request_hash
    )
    held = []
    for status, unlock_at, expires_at, request_hash in cases:
        record = IdempotencyKey(
            status=status, unlock_at=unlock_at, expires_at=expires_at, request_hash=request_hash
        )
        unlock = "" if unlock_at is None else _microseconds(unlock_at)
        in_lua = rules.EXPIRED.holds(record, now) or bool(
            script(args=[us, "same", status, request_hash, unlock])
        )
        assert in_lua == rules.TAKEOVER.holds(record, now, "same"), record.__dict__
        held.append(in_lua)
    assert any(held) and not all(held)  # the rule tells records apart


@pytest.mark.redis
def test_the_redis_census_counts_stale_records_by_the_rule() -> None:
    """The Redis store's census (``idempotency_stats``), reading a record's raw fields and the
    server's clock, counts as stale what :data:`~.rules.STALE` does, on every combination of
    the fields it reads (a finished record's lock end is empty, a new one's may be absent)."""
    from django_idempotency._conf.values import store_alias
    from django_idempotency._store import using
    from django_idempotency._store.redis.keyspace import record_key

    flush_redis()
    store: Any = using(store_alias(REDIS_STORE_NAME, "default"))
    now = timezone.now()
    past, future = now - timedelta(minutes=1), now + timedelta(minutes=1)
    cases = list(itertools.product(IdempotencyKey.Status.values, [None, "", past, future]))
    for number, (status, unlock_at) in enumerate(cases):
        fields = {"st": status, "sc": "census"}
        if unlock_at is not None:
            fields["ua"] = unlock_at if unlock_at == "" else str(_microseconds(unlock_at))
        redis_client().hset(record_key("census", f"{number:064x}", store.prefix), mapping=fields)
    stale = [
        status
        for status, unlock_at in cases
        if rules.STALE.holds(IdempotencyKey(status=status, unlock_at=unlock_at or None), now)
    ]
    counted = store.census()
    flush_redis()
    assert stale == [rules.PROCESSING]  # the rule tells records apart
    assert counted["stale"] == len(stale)
    assert counted["by_status"] == dict.fromkeys(IdempotencyKey.Status.values, 4)


def _microseconds(moment: Any) -> int:
    return round(moment.timestamp() * 1_000_000)


# 5xx, 408 and 429 are released for a retry (RETRYABLE_STATUSES), not stored.
@pytest.mark.parametrize("code", [200, 201, 202, 204, 303, 399, 400, 404, 409, 422, 451])
@pytest.mark.parametrize(
    "store", ["database", pytest.param(REDIS_STORE_NAME, marks=pytest.mark.redis)]
)
def test_a_result_is_stored_with_the_status_the_rule_gives(
    post: Any, key: str, store: str, code: int
) -> None:
    """The record of a response below 400 is ``completed``, at or above ``failed``: as each
    store writes it, and as an operation's state reads it (a ``202`` is still running)."""
    if store != "database":
        flush_redis()
    with override_settings(IDEMPOTENCY={"STORE": store}):
        assert post(f"/status/{code}/", key=key).status_code == code
    (record,) = list(IdempotencyKey.objects.all()) if store == "database" else redis_records()
    assert (record.response_status, record.status) == (code, rules.stored_status(code))
    state = state_of(record, timezone.now())
    if code != 202:
        assert state == (FAILED if rules.is_error(code) else SUCCEEDED)


def test_a_function_s_result_completes_its_record() -> None:
    assert rules.stored_status(None) == rules.COMPLETED
    assert rules.stored_status(399) == rules.COMPLETED
    assert rules.stored_status(rules.LEAST_ERROR) == rules.FAILED
