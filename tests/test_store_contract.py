"""The store contract (:class:`django_idempotency._store.contract.StoreContract`) held by each
store alike: the database's (the test database's vendor), the Redis store's (its own leg, on
``IDEMPOTENCY_TEST_REDIS_STORE_URL``) and a toy in memory (``tests/toy_store.py``) that
implements the contract and nothing more. Each test asks a store only what the contract
declares: the fence, the claim's outcomes, renewal, expiry."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from django_idempotency._base import rules
from django_idempotency._base.keys import hash_key
from django_idempotency._call.claim import Claim
from django_idempotency._call.identity import Identity
from django_idempotency._store import StoreContract, StoredResponse, using
from django_idempotency._store.contract import StoreFeatures
from tests.toy_store import ToyStore

pytestmark = pytest.mark.django_db(transaction=True)

TTL = timedelta(hours=1)
LOCK = timedelta(minutes=1)


@pytest.fixture(
    params=[
        pytest.param("database", marks=pytest.mark.database_store),
        pytest.param("redis", marks=pytest.mark.redis),
        "toy",
    ]
)
def store(request: pytest.FixtureRequest) -> Iterator[StoreContract]:
    if request.param == "toy":
        yield ToyStore()
        return
    if request.param == "redis":
        from tests.conftest import REDIS_STORE_NAME, flush_redis

        flush_redis()
        yield using(REDIS_STORE_NAME if "://" in REDIS_STORE_NAME else "cache:redis")
        flush_redis()
        return
    yield using("default")


def _identity(fingerprint: str = "f" * 64) -> Identity:
    key = str(uuid.uuid4())
    return Identity(key, "contract", hash_key(key), fingerprint, "POST", "/contract/")


def _claim(store: StoreContract, identity: Identity, lock: timedelta = LOCK) -> Any:
    return store.claim(identity, ttl=TTL, lock_timeout=lock)


def test_a_new_key_is_claimed_and_held_against_another_call(store: StoreContract) -> None:
    identity = _identity()
    claim = _claim(store, identity)
    assert isinstance(claim, Claim) and claim.attempt == 1
    held = _claim(store, identity)
    assert not isinstance(held, Claim)
    assert held.status == rules.PROCESSING and held.request_hash == identity.fingerprint
    lock = store.peek_status(identity.scope, identity.key_hash)
    assert lock is not None and lock.status == rules.PROCESSING
    assert store.peek_status("contract", hash_key("never sent")) is None


def test_a_stored_result_is_found_by_the_next_claim(store: StoreContract) -> None:
    identity = _identity()
    claim = _claim(store, identity)
    stored = StoredResponse(201, [["Content-Type", "application/json"]], b'{"id": 1}')
    assert store.store_response(claim.pk, claim.token_text, stored)
    found = _claim(store, identity)
    assert not isinstance(found, Claim)
    assert (found.status, found.response_status) == (rules.COMPLETED, 201)
    lock = store.peek_status(identity.scope, identity.key_hash)
    assert lock is not None and lock.status == rules.COMPLETED


def _taken_over(store: StoreContract) -> tuple[Any, Claim]:
    """A claim whose lock lapsed at once, and the retry that took its record over."""
    identity = _identity()
    first = _claim(store, identity, lock=timedelta(0))
    taker = _claim(store, identity)
    assert isinstance(taker, Claim) and taker.attempt == 2
    return first, taker


@pytest.mark.parametrize("final", ["store_response", "unlock", "release"])
def test_every_write_is_fenced_by_the_lock_token(store: StoreContract, final: str) -> None:
    """A lapsed owner's writes change nothing once its record is taken over; the taker's do.
    A final write spends the handle whatever its outcome: it comes last."""
    first, taker = _taken_over(store)
    assert store.renew([(first.pk, first.token_text)], LOCK) == set()
    assert not store.save_recovery_point(first.pk, first.token_text, "step", {"n": 1}, LOCK)
    writes = {
        "store_response": lambda: store.store_response(
            first.pk, first.token_text, StoredResponse(200, [], b"late")
        ),
        "unlock": lambda: store.unlock(first.pk, first.token_text),
        "release": lambda: store.release(first.pk, first.token_text),
    }
    assert not writes[final]()
    lease = (taker.pk, taker.token_text)
    assert store.renew([lease], LOCK) == {lease}
    assert store.store_response(taker.pk, taker.token_text, StoredResponse(200, [], b"taker"))


def _operators(store: StoreContract, action: str, scope: str, key_hash: str) -> Any:
    """The operator's ``action`` (``release_stale``, ``fail_stale``) as a callable of a record
    it read."""
    failure = StoredResponse(500, [], b"abandoned", owner=(scope, key_hash))
    if action == "release_stale":
        return store.release_stale
    return lambda record: store.fail_stale(record, failure)


@pytest.mark.parametrize("action", ["release_stale", "fail_stale"])
def test_an_operators_action_on_a_stale_record_fences_its_owner(
    store: StoreContract, action: str
) -> None:
    """An operator's action on a stale record (issue 52): a live lock is left alone; a lapsed
    one's record is released or failed, and its owner, running after all, has its result
    refused (never taken for its own)."""
    stale, live = _identity(), _identity()
    owner = _claim(store, stale, timedelta(0))
    holder = _claim(store, live)
    act = _operators(store, action, stale.scope, stale.key_hash)
    assert not act(store.read(live.scope, live.key_hash))
    assert act(store.read(stale.scope, stale.key_hash))
    assert not store.store_response(owner.pk, owner.token_text, StoredResponse(200, [], b"late"))
    # Its write's reply lost, the owner reads it back by its token: not applied.
    assert not store.finished(owner.pk, owner.token_text, getattr(store, "connection", None))
    after = store.read(stale.scope, stale.key_hash)
    if action == "release_stale":
        assert after is None
    else:
        assert after is not None and after.status == rules.FAILED
        assert after.response_status == 500
    assert store.store_response(holder.pk, holder.token_text, StoredResponse(200, [], b"ok"))


@pytest.mark.parametrize("action", ["release_stale", "fail_stale"])
def test_an_operators_action_on_a_record_taken_over_since_changes_nothing(
    store: StoreContract, action: str
) -> None:
    identity = _identity()
    _claim(store, identity, timedelta(0))
    read = store.read(identity.scope, identity.key_hash)
    taker = _claim(store, identity)  # the same request's retry takes the lapsed lock over
    assert isinstance(taker, Claim) and taker.attempt == 2
    assert not _operators(store, action, identity.scope, identity.key_hash)(read)
    assert store.store_response(taker.pk, taker.token_text, StoredResponse(200, [], b"ok"))


def test_a_released_key_is_claimed_afresh(store: StoreContract) -> None:
    identity = _identity()
    claim = _claim(store, identity)
    assert store.release(claim.pk, claim.token_text)
    assert store.peek_status(identity.scope, identity.key_hash) is None
    again = _claim(store, identity)
    assert isinstance(again, Claim) and again.attempt == 1


def test_an_unlocked_key_is_resumed_from_its_recovery_point(store: StoreContract) -> None:
    identity = _identity()
    claim = _claim(store, identity)
    assert store.save_recovery_point(claim.pk, claim.token_text, "charged", {"id": 7}, LOCK)
    assert store.unlock(claim.pk, claim.token_text)
    again = _claim(store, identity)
    assert isinstance(again, Claim) and again.attempt == 2
    assert (again.recovery_point, again.recovery_data) == ("charged", {"id": 7})
    assert store.store_response(again.pk, again.token_text, StoredResponse(200, [], b"done"))


def test_an_expired_key_runs_again_as_a_first_request(store: StoreContract) -> None:
    identity = _identity()
    claim = _claim(store, identity)
    assert store.store_response(claim.pk, claim.token_text, StoredResponse(200, [], b"done"))
    expired = store.expire(identity.scope, identity.key_hash)
    assert expired is not None and expired.key_hash == identity.key_hash
    again = _claim(store, identity)
    assert isinstance(again, Claim) and again.attempt == 1
    assert store.expire(identity.scope, hash_key("never sent")) is None


def test_the_record_is_read_and_counted(store: StoreContract) -> None:
    identity = _identity()
    before = store.count()
    claim = _claim(store, identity)
    assert store.count() == before + 1
    record = store.read(identity.scope, identity.key_hash)
    assert record is not None and record.request_hash == identity.fingerprint
    assert store.created_at(claim.pk) is not None
    assert store.census()["total"] == before + 1


def test_a_store_without_a_table_pages_its_records(store: StoreContract) -> None:
    """The admin's list of a store that keeps no table (Redis): every record, page by page
    from cursor ``"0"`` until the cursor is ``None``, filtered by status; the others say they
    cannot (their table has its own admin, the toy has nothing to page)."""
    from django.db import NotSupportedError

    identity = _identity()
    _claim(store, identity)
    if store.vendor != "redis":
        with pytest.raises(NotSupportedError):
            store.browse("0", size=10)
        return
    pages: dict[str | None, list[str]] = {}
    for status in (None, rules.PROCESSING, rules.COMPLETED):
        cursor: str | None = "0"
        found = pages.setdefault(status, [])
        while cursor is not None:
            records, cursor = store.browse(cursor, size=2, status=status)
            found += [record.key_hash for record in records]
    assert identity.key_hash in pages[None] and identity.key_hash in pages[rules.PROCESSING]
    assert identity.key_hash not in pages[rules.COMPLETED]


def test_what_a_store_cannot_do_is_a_flag_and_an_error(store: StoreContract) -> None:
    """A store that declares no atomic mode refuses its transaction; one that does gives it."""
    assert isinstance(store.features, StoreFeatures)
    _refuses_what_it_lacks(store)


def _refuses_what_it_lacks(store: StoreContract) -> None:
    from django.db import NotSupportedError

    if store.features.supports_atomic:
        with store.atomic(LOCK):
            pass
    else:
        with pytest.raises(NotSupportedError):
            store.atomic(LOCK)
    if not store.features.keeps_table:
        assert not store.stale_records().exists() and not store.expired_records().exists()
        assert store.table_size() == (None, None, "unknown")


def test_a_store_missing_a_core_member_says_which() -> None:
    with pytest.raises(NotImplementedError, match=r"must provide claim\(\)"):
        _claim(StoreContract(), _identity())


def _contract_section() -> str:
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "stores.rst").read_text()
    return text.partition(".. _store-contract:")[2]


def _names(cell: str) -> tuple[str, ...]:
    import re

    return tuple(re.findall(r"``(\w+)\(\)``", cell))


def test_the_docs_list_the_contract_s_required_methods_and_capabilities() -> None:
    """docs/stores.rst's minimal contract is the contract's own (``REQUIRED``,
    ``CAPABILITIES``): a store written from the docs has every method a caller asks."""
    import re

    from django_idempotency._store.contract import CAPABILITIES, REQUIRED

    section = _contract_section()
    required = section.partition(".. contract-required:")[2].partition("Every other member")[0]
    assert _names(required) == REQUIRED
    table = section.partition(".. contract-capabilities:")[2].partition(".. list-table::")[2]
    table = re.split(r"\n\n(?=\S)", table)[0]  # to the first paragraph after it
    rows = re.split(r"\n   \* - ", table.partition("     - without it")[2])[1:]
    documented = []
    for row in rows:
        name, methods, without = (" ".join(cell.split()) for cell in row.split("\n     - "))
        documented.append((name, _names(methods), without))
    assert documented == [(each.name, each.members, each.without) for each in CAPABILITIES]


def test_the_required_methods_are_those_the_contract_leaves_unwritten() -> None:
    """``REQUIRED`` is what raises ``NotImplementedError`` by default, and every default that
    refuses (``NotSupportedError``) is a capability's, or the database's stores' own."""
    import inspect

    from django_idempotency._store.contract import CAPABILITIES, REQUIRED

    members = {
        name: inspect.getsource(member)
        for name, member in vars(StoreContract).items()
        if inspect.isfunction(member) and not name.startswith("_")
    }
    unwritten = {name for name, source in members.items() if "raise _missing(" in source}
    assert unwritten == set(REQUIRED)
    refusing = {name for name, source in members.items() if "raise NotSupportedError" in source}
    optional = {name for each in CAPABILITIES for name in each.members}
    assert refusing - optional == {"erase_batch", "atomic"}  # the database's stores' own
    assert all(getattr(ToyStore, name) is not members.get(name) for name in REQUIRED)
