"""Concurrent completions of one operation (issue 43): on a server, threads each completing
the same operation with a response of their own; exactly one applies (PostgreSQL and MariaDB)."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from django.db import connections
from django.http import JsonResponse

from django_idempotency import IdempotencyKey, OperationError, complete_operation

pytestmark = [
    pytest.mark.server_db,
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls("tests.operations_urls"),
]

THREADS = 8


def test_concurrent_completions_apply_once(post: Any, key: str) -> None:
    first = post("/export/", {"rows": 1}, key=key)
    assert first.status_code == 202
    operation_id = json.loads(first.content)["operation"]
    start = threading.Barrier(THREADS)
    outcomes: list[Any] = [None] * THREADS

    def complete(index: int) -> None:
        try:
            start.wait()
            complete_operation(operation_id, JsonResponse({"winner": index}, status=201))
            outcomes[index] = "applied"
        except OperationError as exc:
            outcomes[index] = exc.reason
        finally:
            connections.close_all()

    threads = [threading.Thread(target=complete, args=(index,)) for index in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(outcomes, key=str) == ["applied", *["completed"] * (THREADS - 1)]
    winner = outcomes.index("applied")
    retry = post("/export/", {"rows": 1}, key=key)
    assert retry.status_code == 201
    assert json.loads(retry.content) == {"winner": winner}
    assert IdempotencyKey.objects.get().response_status == 201
