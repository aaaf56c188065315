"""A store in this process's memory that implements the store contract and nothing else: what
a third store needs to write (:class:`django_idempotency._store.contract.StoreContract`), and
the proof that the contract's tests (``test_store_contract.py``) ask nothing of a store but the
contract. Not thread-safe beyond one lock, and never used by the app."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from django_idempotency._base import rules
from django_idempotency._store.claims import Lock, new_token
from django_idempotency._store.contract import ClaimHandle, StoreContract, StoreFeatures
from django_idempotency._store.writes import StoredResponse
from django_idempotency.models import IdempotencyKey


class ToyStore(StoreContract):
    """Records as unsaved model instances in a dict by (scope, key hash); a claim's handle is a
    number of this store's."""

    vendor = "toy"
    name = "Toy"
    features = StoreFeatures(has_server=False)

    def __init__(self, alias: str = "toy") -> None:
        self.alias = alias
        self._records: dict[tuple[str, str], IdempotencyKey] = {}
        self._handles: dict[ClaimHandle, tuple[str, str]] = {}
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()

    def claim(
        self,
        identity: Any,
        *,
        ttl: timedelta,
        lock_timeout: timedelta,
        token: str | None = None,
        bound: float | None = None,
    ) -> Any:
        token = token or new_token()
        key = (identity.scope, identity.key_hash)
        now = timezone.now()
        with self._lock:
            record = self._records.get(key)
            if record is not None and not rules.TAKEOVER.holds(record, now, identity.fingerprint):
                return record
            attempt = (
                1 if record is None or rules.EXPIRED.holds(record, now) else record.attempt + 1
            )
            if attempt == 1:
                record = IdempotencyKey(
                    scope=identity.scope,
                    key_hash=identity.key_hash,
                    method=identity.method,
                    path=identity.path,
                    request_hash=identity.fingerprint,
                    created_at=now,
                    expires_at=now + ttl,
                )
            assert record is not None
            record.status, record.lock_token, record.attempt = rules.PROCESSING, token, attempt
            record.unlock_at, record.updated_at = now + lock_timeout, now
            self._records[key] = record
            pk = next(self._numbers)
            self._handles[pk] = key
        return identity.claimed(
            pk=pk,
            token_text=token,
            attempt=attempt,
            recovery_point=record.recovery_point,
            recovery_data=record.recovery_data,
            alias=self.alias,
            lock_timeout=lock_timeout,
            held_until=time.monotonic() + lock_timeout.total_seconds(),
            uncommitted=False,
            life=record.created_at,
        )

    def _owned(self, pk: ClaimHandle, token: Any) -> IdempotencyKey | None:
        """The claim's record while ``token`` holds its lock (the fence)."""
        key = self._handles.get(pk)
        record = None if key is None else self._records.get(key)
        if record is None or record.status != rules.PROCESSING:
            return None
        return record if str(record.lock_token) == str(token) else None

    def peek_status(self, scope: str, key_hash: str, bound: float | None = None) -> Lock | None:
        record = self._records.get((scope, key_hash))
        return None if record is None else Lock(record.status, record.unlock_at)

    def store_response(
        self,
        pk: ClaimHandle,
        token: Any,
        stored: StoredResponse,
        *,
        stale_at: datetime | None = None,
        connection: Any = None,
        bound: float | None = None,
        release: Any = None,
    ) -> bool:
        with self._lock:
            record = self._owned(pk, token)
            if record is None:
                return False
            record.status = rules.stored_status(stored.status)
            record.response_status = stored.status
            record.response_headers, record.response_body = stored.sealed
            record.lock_token = record.unlock_at = None
            if stored.ttl is not None:
                record.expires_at = timezone.now() + stored.ttl
            return True

    def save_recovery_point(
        self,
        pk: ClaimHandle,
        token: Any,
        name: str,
        data: Any,
        lock_timeout: timedelta,
        *,
        connection: Any = None,
        bound: float | None = None,
        release: Any = None,
    ) -> bool:
        with self._lock:
            record = self._owned(pk, token)
            if record is None:
                return False
            record.recovery_point, record.recovery_data = name, data
            record.unlock_at = timezone.now() + lock_timeout
            return True

    def unlock(
        self, pk: ClaimHandle, token: Any, *, connection: Any = None, bound: float | None = None
    ) -> bool:
        with self._lock:
            record = self._owned(pk, token)
            if record is not None:
                record.lock_token, record.unlock_at = None, timezone.now()
            return record is not None

    def release(
        self,
        pk: ClaimHandle,
        token: Any,
        *,
        stale_at: datetime | None = None,
        connection: Any = None,
        bound: float | None = None,
    ) -> bool:
        with self._lock:
            record = self._owned(pk, token)
            if record is not None:
                del self._records[(record.scope, record.key_hash)]
            return record is not None

    def renew(
        self,
        leases: Sequence[tuple[ClaimHandle, Any]],
        lock_timeout: timedelta,
        bound: float | None = None,
    ) -> set[tuple[ClaimHandle, Any]]:
        held = set()
        with self._lock:
            for pk, token in leases:
                record = self._owned(pk, token)
                if record is not None:
                    record.unlock_at = timezone.now() + lock_timeout
                    held.add((pk, token))
        return held

    def _stale(self, record: IdempotencyKey) -> IdempotencyKey | None:
        """The record an operator read while still stale under the token read (the fence)."""
        current = self._records.get((record.scope, record.key_hash))
        if current is None or record.lock_token is None:
            return None
        if str(current.lock_token) != str(record.lock_token):
            return None
        return current if rules.STALE.holds(current, timezone.now()) else None

    def release_stale(self, record: IdempotencyKey) -> bool:
        with self._lock:
            current = self._stale(record)
            if current is not None:
                del self._records[(current.scope, current.key_hash)]
            return current is not None

    def fail_stale(self, record: IdempotencyKey, stored: StoredResponse) -> bool:
        with self._lock:
            current = self._stale(record)
            if current is None:
                return False
            current.status = rules.stored_status(stored.status)
            current.response_status = stored.status
            current.response_headers, current.response_body = stored.sealed
            current.lock_token = current.unlock_at = None
            return True

    def read(self, scope: str, key_hash: str) -> IdempotencyKey | None:
        return self._records.get((scope, key_hash))

    def records_of(self, key_hash: str) -> list[IdempotencyKey]:
        found = [record for (_, hashed), record in self._records.items() if hashed == key_hash]
        return sorted(found, key=lambda record: record.created_at)

    def created_at(self, pk: ClaimHandle) -> datetime | None:
        key = self._handles.get(pk)
        record = None if key is None else self._records.get(key)
        return None if record is None else record.created_at

    def expire(self, scope: str, key_hash: str) -> IdempotencyKey | None:
        record = self._records.get((scope, key_hash))
        if record is not None:
            record.expires_at = timezone.now()
        return record

    def erase_scope(self, scope: str, *, dry_run: bool = False) -> tuple[int, int]:
        """Without it, erasure (``idempotency_cleanup --scope``) is refused for the whole
        project while this store is named: never half an erasure."""
        with self._lock:
            of_scope = [key for key in self._records if key[0] == scope]
            running = [key for key in of_scope if self._records[key].status == rules.PROCESSING]
            finished = [key for key in of_scope if key not in running]
            if not dry_run:
                for key in finished:
                    del self._records[key]
        return len(finished), len(running)

    #: Whether the store answers: a test switches it off to see ``check --deploy`` (E062) ask
    #: the contract's :meth:`ping`, not a client, and the stats name it by its class.
    answers = True

    def count(self) -> int:
        self.ping()
        return len(self._records)

    def ping(self) -> None:
        if not self.answers:
            raise ConnectionError("the toy store is switched off")
