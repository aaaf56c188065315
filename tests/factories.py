"""factory-boy factories for records in any state, as a real attempt would leave them."""

from __future__ import annotations

import uuid
from datetime import timedelta

import factory
from django.utils import timezone

from django_idempotency import IdempotencyKey
from django_idempotency import _store as store
from django_idempotency._base.keys import hash_key
from django_idempotency._call.identity import Identity


class IdempotencyKeyFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = IdempotencyKey

    class Params:
        key = factory.LazyFunction(lambda: str(uuid.uuid4()))
        stale = factory.Trait(
            unlock_at=factory.LazyFunction(lambda: timezone.now() - timedelta(seconds=1))
        )
        expired = factory.Trait(
            expires_at=factory.LazyFunction(lambda: timezone.now() - timedelta(seconds=1))
        )
        completed = factory.Trait(
            status=IdempotencyKey.Status.COMPLETED,
            response_status=201,
            response_headers=[["Content-Type", "application/json"]],
            response_body=b'{"id": 1}',
            unlock_at=None,
            lock_token=None,
        )

    scope = "anonymous"
    key_hash = factory.LazyAttribute(lambda record: hash_key(record.key))
    method = "POST"
    path = "/create/"
    request_hash = factory.Faker("sha256")
    status = IdempotencyKey.Status.PROCESSING
    lock_token = factory.LazyFunction(uuid.uuid4)
    unlock_at = factory.LazyFunction(lambda: timezone.now() + timedelta(minutes=1))
    expires_at = factory.LazyFunction(lambda: timezone.now() + timedelta(hours=24))


def claim(
    key: str = "",
    *,
    key_hash: str | None = None,
    scope: str = "anonymous",
    method: str = "POST",
    path: str = "/create/",
    fingerprint: str = "f" * 64,
    alias: str = "default",
    ttl: timedelta = timedelta(hours=1),
    lock_timeout: timedelta = timedelta(minutes=1),
) -> store.ClaimOutcome:
    """A claim made straight through the store, as the engine makes it."""
    identity = Identity(
        key=key,
        scope=scope,
        key_hash=hash_key(key) if key_hash is None else key_hash,
        fingerprint=fingerprint,
        method=method,
        path=path,
    )
    return store.using(alias).claim(identity, ttl=ttl, lock_timeout=lock_timeout)
