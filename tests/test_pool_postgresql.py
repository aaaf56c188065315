"""Django's connection pool (PostgreSQL, ``"pool"`` in ``OPTIONS``) after its connections died
(issue 39).

``CONN_HEALTH_CHECKS`` off, Django's default: the pool hands its connections out unchecked. The
pool's backends are ended (``pg_terminate_backend``, as a restart or a failover ends them) while
they wait in the pool; the next claim meets a dead one, and the next after it another. The claim
is made again on a new connection (the pool drained), in atomic mode too, and the view runs
once.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client, override_settings
from django.urls import path

from django_idempotency import _store, idempotent
from django_idempotency._base.keys import hash_key
from django_idempotency.models import IdempotencyKey

ALIAS = "pooled"
APPLICATION = "idempotency-pool-test"
#: More connections than a claim's tries: every one the pool holds is dead.
POOL = {"min_size": 6, "max_size": 8}

pytestmark = [
    pytest.mark.postgresql,
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls(__name__),
]

EFFECTS: Counter[str] = Counter()


def _effect(request: HttpRequest) -> HttpResponse:
    key = request.headers["Idempotency-Key"]
    EFFECTS[key] += 1
    return JsonResponse({"key": key}, status=201)


urlpatterns = [
    path("two-phase/", idempotent(lock_timeout=6)(_effect)),
    path("atomic/", idempotent(atomic=True, lock_timeout=6)(_effect)),
]


@pytest.fixture
def pooled(django_db_blocker: Any) -> Iterator[Any]:
    """An alias of the test database whose connections come from a pool of their own."""
    pytest.importorskip("psycopg_pool", reason="needs psycopg[pool] (the test extra)")
    settings = dict(connections["default"].settings_dict)
    options = {**(settings.get("OPTIONS") or {}), "pool": POOL, "application_name": APPLICATION}
    connections.settings[ALIAS] = {
        **settings,
        "CONN_MAX_AGE": 0,
        "CONN_HEALTH_CHECKS": False,
        "OPTIONS": options,
        "TEST": {"MIRROR": "default"},
    }
    EFFECTS.clear()
    with django_db_blocker.unblock(), override_settings(IDEMPOTENCY={"DATABASE_ALIAS": ALIAS}):
        pool = connections[ALIAS].pool
        try:
            yield pool
        finally:
            _store._BOUND.pop(ALIAS, None)
            connections[ALIAS].close()
            connections[ALIAS].close_pool()
            del connections.settings[ALIAS]


def kill_the_pool(pool: Any) -> int:
    """Fill the pool, then end every backend it holds: how many."""
    pool.open()
    pool.wait(timeout=30)
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s",
            [APPLICATION],
        )
        (ended,) = cursor.fetchone()
    return int(ended)


def post(view: str, key: str) -> Any:
    try:
        return Client(raise_request_exception=False).post(
            view, {}, content_type="application/json", headers={"Idempotency-Key": key}
        )
    finally:
        connections[ALIAS].close()  # the request's end: the connection goes back to the pool


@pytest.mark.parametrize("view", ["/two-phase/", "/atomic/"])
def test_a_claim_after_the_pools_connections_died(pooled: Any, view: str) -> None:
    assert kill_the_pool(pooled) >= POOL["min_size"]
    key = str(uuid.uuid4())
    response = post(view, key)
    assert response.status_code == 201, response.content
    assert EFFECTS[key] == 1
    record = IdempotencyKey.objects.using("default").get(key_hash=hash_key(key))
    assert record.status == "completed"
    # The pool was drained: the next request meets no dead connection either.
    again = str(uuid.uuid4())
    assert post(view, again).status_code == 201
    assert EFFECTS[again] == 1
