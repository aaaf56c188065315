"""Real threads against a real server (PostgreSQL, MariaDB): the claim is race-free."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test import Client, RequestFactory, override_settings
from django.utils import timezone

from django_idempotency import Claim, IdempotencyKey, key_claimed, request_fingerprint
from django_idempotency._store.postgresql import CLAIM_FUNCTION, PostgreSQLStore
from django_idempotency._store.rows import Record
from tests import factories
from tests.conftest import executions
from tests.factories import IdempotencyKeyFactory
from tests.held import owner_held_until, owner_then_duplicate, waiting_threads
from tests.test_unavailable import CALLS, COUNTED
from tests.waiting import wait_for

pytestmark = [pytest.mark.server_db, pytest.mark.django_db(transaction=True)]


def send(path: str, key: str, body: Any = None) -> Any:
    """POST ``body`` (an amount by default) to ``path`` with ``key``."""
    return Client().post(
        path,
        {"amount": 4200} if body is None else body,
        content_type="application/json",
        headers={"Idempotency-Key": key},
    )


def storm(
    count: int,
    path: str,
    key: str | Callable[[int], str],
    body: Any = None,
    answered: list[Any] | None = None,
) -> list[Any]:
    """Send ``count`` POSTs released at once from ``count`` threads; each response is added
    to ``answered`` as it comes."""
    barrier = threading.Barrier(count)

    def each(index: int) -> Any:
        try:
            barrier.wait(timeout=30)
            response = send(path, key(index) if callable(key) else key, body)
            if answered is not None:
                answered.append(response)
            return response
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(each, range(count), timeout=60))


def outcome(response: Any) -> str:
    assert response.status_code < 400 or response.status_code == 409, response.content
    if response.status_code == 409:
        assert response["Retry-After"]
        return "409"
    return "replay" if response.get("Idempotent-Replayed") == "true" else "executed"


def storm_on_a_live_owner(path: str, key: str) -> list[Any]:
    """Twenty POSTs of ``key`` released at once, the owner held at its claim until the nineteen
    others have answered: each met a live owner. With a view running a fixed 0.3 s instead,
    duplicates a loaded machine sent later replayed a finished record, and a claim that took a
    live owner's key went unseen."""
    answered: list[Any] = []
    return owner_held_until(
        partial(storm, 20, path, key, answered=answered),
        lambda: len(answered) == 19,
        "the nineteen duplicates' answers",
    )


def test_twenty_identical_requests_execute_once() -> None:
    assert connection.vendor != "sqlite"
    responses = storm_on_a_live_owner("/create/", str(uuid.uuid4()))
    counts = Counter(outcome(response) for response in responses)
    assert executions("create") == 1
    assert counts == {"executed": 1, "409": 19}


def test_async_view_twenty_identical_requests_execute_once() -> None:
    responses = storm_on_a_live_owner("/async/", str(uuid.uuid4()))
    assert Counter(outcome(response) for response in responses) == {"executed": 1, "409": 19}
    assert executions("async") == 1


def test_distinct_keys_never_conflict() -> None:
    """Each request held at its claim until all twenty have claimed: twenty live owners at
    once (with a view's fixed 0.1 s, a loaded machine's requests could come one by one). Under
    Django's pool (8 connections at most, one of them the renewer's), until no other request
    can get a connection: as many live owners at once as the pool lets in, wave after wave."""
    claimed = threading.Condition()
    owners = [0]

    def meet(**kwargs: Any) -> None:
        with claimed:
            owners[0] += 1
            claimed.notify_all()
            deadline = time.monotonic() + 30
            while owners[0] < 20 and not _pool_refuses_another():
                assert time.monotonic() < deadline, f"{owners[0]} of 20 claimed"
                claimed.wait(0.01)

    key_claimed.connect(meet, dispatch_uid="distinct-keys-together", weak=False)
    try:
        responses = storm(20, "/create/", lambda index: f"distinct-{index}")
    finally:
        key_claimed.disconnect(dispatch_uid="distinct-keys-together")
    assert [response.status_code for response in responses] == [201] * 20
    assert executions("create") == 20


def _pool_refuses_another() -> bool:
    """Whether a request waits for one of Django's pool's connections (never without a pool)."""
    pool = getattr(connection, "pool", None)
    return pool is not None and pool.get_stats().get("requests_waiting", 0) > 0


def test_drf_viewset_twenty_identical_requests_execute_once() -> None:
    storm(20, "/api/executions/", str(uuid.uuid4()), {"label": "drf-storm"})
    assert executions("drf-storm") == 1


def test_wait_mode_duplicates_receive_the_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight at once: the owner is held at its claim until the seven others wait for it, and
    they replay its result. With a view running a fixed 0.5 s instead, duplicates that came
    later (a loaded machine) replayed a finished record without having waited."""
    waiting = waiting_threads(monkeypatch)
    responses = owner_held_until(
        partial(storm, 8, "/wait/", str(uuid.uuid4())),
        lambda: len(waiting) == 7,
        "the seven duplicates to wait for the owner",
    )
    counts = Counter(outcome(response) for response in responses)
    assert counts == {"executed": 1, "replay": 7}
    assert executions("wait") == 1


@pytest.mark.parametrize(
    ("path", "label"),
    [("/wait-short/", "wait-short"), ("/atomic-short-wait/", "atomic-short-wait")],
)
def test_waiting_is_bounded_by_wait_timeout(path: str, label: str) -> None:
    """The duplicate, sent once the owner has claimed, gives up at its wait's bound while the
    owner is held at its claim until it has answered: a ``409``, well within the owner's
    life."""
    started = time.monotonic()
    responses = owner_then_duplicate(*[partial(send, path, str(uuid.uuid4()))] * 2, hold=True)
    assert [outcome(r) for r in responses] == ["executed", "409"]
    assert time.monotonic() - started < 5
    assert executions(label) == 1


@pytest.mark.parametrize("path", ["/atomic-short-wait/", "/wait-short/"])
def test_a_claim_refused_after_its_wait_ran_the_scope_and_fingerprint_once(path: str) -> None:
    """In atomic mode the wait ends in a ``LockWaitTimeout`` that ends the transaction too."""
    CALLS.clear()
    with override_settings(IDEMPOTENCY=COUNTED):
        responses = owner_then_duplicate(*[partial(send, path, str(uuid.uuid4()))] * 2, hold=True)
    assert [outcome(r) for r in responses] == ["executed", "409"]
    assert CALLS == {"scope": 2, "fingerprint": 2}


def test_atomic_duplicates_wait_for_the_commit_and_replay() -> None:
    """The owner is held at its claim, its row uncommitted, until the seven others' claims
    wait on it (the server's own view of its waiters), not for a fixed 0.5 s."""
    responses = owner_held_until(
        partial(storm, 8, "/atomic/", str(uuid.uuid4())),
        lambda: waiting_claims() == 7,
        "the seven duplicates' claims to wait on the owner's row",
    )
    counts = Counter(outcome(response) for response in responses)
    assert counts == {"executed": 1, "replay": 7}
    assert executions("atomic") == 1


def test_atomic_failure_lets_a_waiting_duplicate_run() -> None:
    key = str(uuid.uuid4())
    responses = owner_held_until(
        partial(storm, 2, "/atomic/?fail=", key),
        lambda: waiting_claims() == 1,
        "the duplicate's claim to wait on the owner's row",
    )
    assert sorted(outcome(r) for r in responses) == ["executed", "replay"]
    assert IdempotencyKey.objects.count() == 1


def test_stale_record_is_taken_over_by_exactly_one_retry() -> None:
    key = str(uuid.uuid4())
    with pytest.raises(KeyboardInterrupt):
        Client().post(
            "/recovery/",
            {},
            content_type="application/json",
            headers={"Idempotency-Key": key, "X-Crash-After": "charge"},
        )
    IdempotencyKey.objects.update(unlock_at=timezone.now() - timedelta(seconds=1))
    responses = storm(10, "/recovery/", key, {})
    counts = Counter(outcome(response) for response in responses)
    assert counts["executed"] == 1
    assert counts["executed"] + counts["replay"] + counts["409"] == 10
    record = IdempotencyKey.objects.get()
    assert (record.status, record.attempt) == (IdempotencyKey.Status.COMPLETED, 2)
    assert [executions(f"step-{step}") for step in ("reserve", "charge", "ship")] == [1, 1, 1]


def test_expired_record_is_replaced_by_exactly_one_of_twenty() -> None:
    """The takeover's fenced UPDATE, not the read before it, decides who owns the key."""
    key = str(uuid.uuid4())
    IdempotencyKeyFactory(key=key, completed=True, expires_at=timezone.now())
    responses = storm_on_a_live_owner("/create/", key)
    counts = Counter(outcome(response) for response in responses)
    assert executions("create") == 1
    assert counts == {"executed": 1, "409": 19}
    record = IdempotencyKey.objects.get()
    assert (record.status, record.attempt) == (IdempotencyKey.Status.COMPLETED, 1)


def waiting_claims() -> int:
    """How many claims wait on another transaction's uncommitted insert of their key (an atomic
    claim on MySQL/MariaDB is the procedure's ``CALL`` under its own lock wait bound).

    Asked on a connection of its own, outside Django's pool (the pool leg): the storm's
    threads may hold every connection the pool has while the owner is held."""
    observer = connection.copy()
    observer.settings_dict["OPTIONS"].pop("pool", None)
    with closing(observer), observer.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock' "
            "AND (query LIKE 'WITH inserted AS%%' OR query LIKE %s)"
            if connection.vendor == "postgresql"
            else "SELECT count(*) FROM information_schema.processlist "
            "WHERE command = 'Query' AND db = DATABASE() "
            "AND (info LIKE %s OR info LIKE 'CALL %%' OR info LIKE 'SET STATEMENT %% FOR CALL %%')",
            [f"%%, {CLAIM_FUNCTION}(%%" if connection.vendor == "postgresql" else "INSERT INTO%%"],
        )
        return int(cursor.fetchone()[0])


def commit_a_record_while_a_claim_waits(key: str, claim: Callable[[], Any]) -> Any:
    """Insert the key's record in an open transaction, let ``claim`` block on it, then commit.

    The claim's ``INSERT`` waits for the uncommitted row. On PostgreSQL, once it commits,
    ``ON CONFLICT DO NOTHING`` skips: the one-statement claim's ``SELECT`` half reads the
    snapshot taken before the commit and does not see the row either, while the claim
    function's ``SELECT`` is a statement of its own, with a snapshot taken after, and sees it.
    On MySQL the ``INSERT`` (inside the claim procedure, or sent alone) fails on the duplicate
    and the next statement reads the committed row.
    """
    body = {"amount": 4200}
    request = RequestFactory().post("/create/", body, content_type="application/json")
    fingerprint = request_fingerprint(request, "anonymous")
    inserted, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                IdempotencyKeyFactory(key=key, completed=True, request_hash=fingerprint)
                inserted.set()
                assert release.wait(timeout=30)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=2) as pool:
        holder = pool.submit(hold)
        assert inserted.wait(timeout=30)
        claimed = pool.submit(claim)
        wait_for(lambda: waiting_claims() >= 1, "the claim to wait on the open insert", 30)
        release.set()
        holder.result(timeout=30)
        return claimed.result(timeout=30)


def in_thread(call: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        try:
            return call()
        finally:
            connections.close_all()

    return run


def claim_in_thread(key: str) -> Callable[[], Any]:
    return in_thread(lambda: factories.claim(key))


@pytest.mark.postgresql
@pytest.mark.parametrize("function", [True, False], ids=["claim-function", "statements"])
def test_a_claim_that_waited_on_a_concurrent_insert_finds_it_or_says_so(
    function: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not function:  # as without the migration that creates the function
        monkeypatch.setattr(PostgreSQLStore, "has_function", lambda self, connection: False)
    key = str(uuid.uuid4())
    claim = claim_in_thread(key)
    if function:  # a session's first claim is plain statements: the function from its second on
        claim = in_thread(lambda: [factories.claim(str(uuid.uuid4())), factories.claim(key)][1])
    found = commit_a_record_while_a_claim_waits(key, claim)
    if function:
        assert isinstance(found, (IdempotencyKey, Record))
        assert found.status == IdempotencyKey.Status.COMPLETED
    else:
        assert found is None
    completed = IdempotencyKey.objects.filter(status=IdempotencyKey.Status.COMPLETED)
    assert completed.count() == 1


@pytest.mark.mysql
def test_a_claim_that_waited_on_a_concurrent_insert_reads_the_committed_record() -> None:
    key = str(uuid.uuid4())
    found = commit_a_record_while_a_claim_waits(key, claim_in_thread(key))
    assert isinstance(found, IdempotencyKey)
    assert found.status == IdempotencyKey.Status.COMPLETED
    assert found.pk == IdempotencyKey.objects.get().pk


def test_the_engine_claims_again_and_replays_a_record_committed_while_it_waited() -> None:
    key = str(uuid.uuid4())
    response = commit_a_record_while_a_claim_waits(
        key,
        in_thread(
            lambda: Client().post(
                "/create/",
                {"amount": 4200},
                content_type="application/json",
                headers={"Idempotency-Key": key},
            )
        ),
    )
    assert (response.status_code, response.content) == (201, b'{"id": 1}')
    assert response["Idempotent-Replayed"] == "true"
    assert executions("create") == 0


def test_claims_waiting_on_an_insert_that_rolls_back_never_raise() -> None:
    """Four claims wait on one uncommitted insert of their key, which then rolls back.

    On InnoDB each waiter holds a shared lock on the duplicate and wants an exclusive one once it
    is gone: they deadlock (1213), and the victims' claims say "claim again" (``None``) rather
    than raise. Exactly one owns the key.
    """
    key = str(uuid.uuid4())
    waiting, inserted, release = 4, threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                IdempotencyKeyFactory(key=key)
                inserted.set()
                assert release.wait(timeout=30)
                transaction.set_rollback(True)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=waiting + 1) as pool:
        holder = pool.submit(hold)
        assert inserted.wait(timeout=30)
        claims = [pool.submit(claim_in_thread(key)) for _ in range(waiting)]
        wait_for(lambda: waiting_claims() == waiting, "every claim to wait on the insert", 30)
        release.set()
        holder.result(timeout=30)
        results = [claim.result(timeout=30) for claim in claims]
    assert sum(isinstance(result, Claim) for result in results) == 1
    assert all(
        result is None or isinstance(result, (Claim, IdempotencyKey, Record)) for result in results
    )
