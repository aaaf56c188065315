"""The protocol of a protected request, shared by the decorator, the DRF mixin and both the
sync and the async paths: :func:`begin` before the view, :func:`finish` or :func:`abort` after.

:func:`begin` is a generator so that waiting can be done by the caller: it yields the seconds to
sleep (``time.sleep`` or ``asyncio.sleep``) and returns what to do, through ``StopIteration``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Generator
from typing import Any

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connections, transaction
from django.http import HttpRequest, HttpResponseBase
from django.utils import timezone

from django_idempotency import problems, responses, signals, store
from django_idempotency.claim import Claim
from django_idempotency.conf import conf
from django_idempotency.exceptions import LockWaitTimeout, StoreUnavailable
from django_idempotency.keys import InvalidKey, hash_key, parse_key
from django_idempotency.models import IdempotencyKey
from django_idempotency.options import Policy

logger = logging.getLogger("django_idempotency")

#: What :func:`begin` decides: answer with this response, run the view owning this claim, or
#: (``None``) run the view unprotected because the request has no key.
Decision = HttpResponseBase | Claim | None
Steps = Generator[float, None, Decision]

_FIRST_WAIT = 0.02
_MAX_WAIT = 0.25
_CLAIM_ATTEMPTS = 5


def begin(request: HttpRequest, policy: Policy) -> Steps:
    header = request.headers.get(conf.HEADER)
    if header is None:
        return problems.missing_key(conf.HEADER) if policy.required else None
    try:
        key = parse_key(header, min_length=conf.MIN_KEY_LENGTH)
    except InvalidKey as exc:
        return problems.invalid_key(str(exc))
    scope = _scope(request)
    key_hash = hash_key(key)
    fingerprint = conf.FINGERPRINT_FUNCTION(request, scope)
    context = {"request": request, "scope": scope, "key_hash": key_hash}
    deadline = time.monotonic() + policy.wait_timeout.total_seconds()
    delay = _FIRST_WAIT
    try:
        for _ in range(_CLAIM_ATTEMPTS):
            claimed = store.claim(
                policy.alias,
                scope=scope,
                key_hash=key_hash,
                method=request.method or "",
                path=request.get_full_path(),
                request_hash=fingerprint,
                ttl=policy.ttl,
                lock_timeout=policy.lock_timeout,
            )
            if claimed is not None:
                claim = Claim(
                    key=key,
                    scope=scope,
                    key_hash=key_hash,
                    pk=claimed.pk,
                    lock_token=claimed.lock_token,
                    attempt=claimed.attempt,
                    recovery_point=claimed.recovery_point,
                    recovery_data=claimed.recovery_data,
                    alias=policy.alias,
                    lock_timeout=policy.lock_timeout,
                )
                _announce_claim(claim, context)
                return claim
            record = store.load(policy.alias, scope, key_hash)
            if record is None:
                continue  # released between the two statements: claim again
            if record.request_hash != fingerprint:
                logger.info("Idempotency key reused with another request: %s", key_hash[:12])
                signals.fingerprint_mismatch.send(IdempotencyKey, record=record, **context)
                return problems.key_reuse(conf.MISMATCH_STATUS)
            if record.status != IdempotencyKey.Status.PROCESSING:
                return _replay(record, context)
            if policy.in_progress != "wait" or time.monotonic() >= deadline:
                return _conflict(record, context)
            while True:
                yield min(delay, max(0.0, deadline - time.monotonic()))
                delay = min(delay * 2, _MAX_WAIT)
                if time.monotonic() >= deadline or _settled(policy.alias, scope, key_hash):
                    break
    except StoreUnavailable:
        logger.exception("Idempotency store %r unavailable; the view was not run.", policy.alias)
        return problems.unavailable()
    except LockWaitTimeout:
        if policy.atomic:
            raise  # the transaction is broken: the wrapper answers 409 outside it
        return problems.in_progress(conf.RETRY_AFTER)
    return problems.in_progress(conf.RETRY_AFTER)


def _settled(alias: str, scope: str, key_hash: str) -> bool:
    """Whether a waiter's key stopped being live in flight (finished, released or stale)."""
    peeked = store.peek_status(alias, scope, key_hash)
    if peeked is None:
        return True
    status, unlock_at = peeked
    return status != IdempotencyKey.Status.PROCESSING or (
        unlock_at is not None and unlock_at <= timezone.now()
    )


def _scope(request: HttpRequest) -> str:
    scope = conf.SCOPE_FUNCTION(request)
    if len(scope) > 255:
        scope = "sha256:" + hashlib.sha256(scope.encode()).hexdigest()
    return scope


def _announce_claim(claim: Claim, context: dict[str, Any]) -> None:
    if claim.is_takeover:
        logger.warning(
            "Took over stale idempotency record %s (attempt %s, recovery point %r).",
            claim.pk,
            claim.attempt,
            claim.recovery_point,
        )
        signals.key_taken_over.send(IdempotencyKey, claim=claim, **context)
    else:
        logger.debug("Claimed idempotency record %s.", claim.pk)
        signals.key_claimed.send(IdempotencyKey, claim=claim, **context)


def _replay(record: IdempotencyKey, context: dict[str, Any]) -> HttpResponseBase:
    logger.debug("Replaying idempotency record %s.", record.pk)
    signals.response_replayed.send(IdempotencyKey, record=record, **context)
    if record.response_body is None or record.response_status is None:
        return problems.response_not_stored()
    return responses.replay(
        record.response_status, record.response_headers, bytes(record.response_body)
    )


def _conflict(record: IdempotencyKey, context: dict[str, Any]) -> HttpResponseBase:
    logger.info("Idempotency record %s is still in flight.", record.pk)
    signals.request_in_progress.send(IdempotencyKey, record=record, **context)
    return problems.in_progress(conf.RETRY_AFTER)


def finish(
    request: HttpRequest, claim: Claim, response: HttpResponseBase, policy: Policy
) -> HttpResponseBase:
    """Store the view's response (or release the claim) and return the response."""
    try:
        responses.check_replayable(response)
        if responses.needs_deferred_render(response):
            if policy.atomic:
                raise responses.UnreplayableResponse(
                    "An atomic idempotent view returned a DRF Response that is not rendered yet; "
                    "put @idempotent above @api_view, or use IdempotencyMixin."
                )
            responses.add_post_render_callback(
                response, lambda rendered: _store(request, claim, rendered, policy)
            )
            return response
        responses.render(response)
    except BaseException:
        abort(request, claim, policy, reason="unreplayable response", raised=True)
        raise
    _store(request, claim, response, policy)
    return response


def _store(
    request: HttpRequest, claim: Claim, response: HttpResponseBase, policy: Policy
) -> None:
    context = {"request": request, "scope": claim.scope, "key_hash": claim.key_hash}
    if response.status_code in conf.RETRYABLE_STATUSES:
        abort(request, claim, policy, reason=f"status {response.status_code}", raised=False)
        return
    stored = responses.capture(response, conf.REPLAYED_HEADERS, conf.MAX_BODY_SIZE)
    if stored.body is None:
        logger.error(
            "Idempotency record %s: the response body is over MAX_BODY_SIZE (%s bytes); "
            "it was not stored, and replays will answer 500 response-not-stored.",
            claim.pk,
            conf.MAX_BODY_SIZE,
        )
    try:
        stored_ok = store.store_response(policy.alias, claim.pk, claim.lock_token, stored)
    except DatabaseError:
        if policy.atomic:
            raise
        # The view ran but its result is lost: the record stays `processing` and is taken over
        # once `unlock_at` passes (docs: "The crash window").
        logger.exception("Could not store the response of idempotency record %s.", claim.pk)
        return
    if not stored_ok:
        logger.error(
            "Idempotency record %s: attempt %s finished after its lock was taken over; its "
            "result was refused. Raise lock_timeout above the view's longest run.",
            claim.pk,
            claim.attempt,
        )
        signals.late_result_refused.send(IdempotencyKey, claim=claim, response=response, **context)


def abort(
    request: HttpRequest, claim: Claim, policy: Policy, *, reason: str, raised: bool
) -> None:
    """Release the claim so the client's retry runs the view again.

    In atomic mode an exception (``raised``) rolls the claim back with the transaction; only a
    retryable status needs the row deleted, and that deletion commits with the view's work.
    """
    context = {"request": request, "scope": claim.scope, "key_hash": claim.key_hash}
    if policy.atomic:
        if not raised:
            store.release(policy.alias, claim.pk, claim.lock_token)
    else:
        try:
            store.release(policy.alias, claim.pk, claim.lock_token)
        except DatabaseError:
            logger.exception("Could not release idempotency record %s.", claim.pk)
            return
    logger.info("Released idempotency record %s (%s).", claim.pk, reason)
    signals.key_released.send(IdempotencyKey, claim=claim, reason=reason, **context)


def run_steps(steps: Steps) -> Decision:
    """Drive :func:`begin` synchronously."""
    try:
        delay = next(steps)
        while True:
            time.sleep(delay)
            delay = steps.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def arun_steps(steps: Steps) -> Decision:
    """Drive :func:`begin` from async code: database work in a thread, sleeping on the loop."""
    advance = sync_to_async(_advance)
    while True:
        done, value = await advance(steps)
        if done:
            return value  # type: ignore[return-value]
        await asyncio.sleep(value)  # type: ignore[arg-type]


def _advance(steps: Steps) -> tuple[bool, float | Decision]:
    try:
        return False, next(steps)
    except StopIteration as stop:
        return True, stop.value


def ensure_connection(alias: str) -> None:
    """Connect before an atomic block opens, so an unreachable store is a 503, not a 500."""
    try:
        connections[alias].ensure_connection()
    except DatabaseError as exc:
        raise StoreUnavailable(str(exc)) from exc


def in_transaction(policy: Policy, call: Callable[[], HttpResponseBase]) -> HttpResponseBase:
    """Run ``call`` as atomic mode asks: claim, view and result in one transaction.

    A duplicate's claim waits on the first attempt's uncommitted row, at most ``wait_timeout``;
    a crash rolls everything back and leaves no record behind.
    """
    if not policy.atomic:
        return call()
    try:
        ensure_connection(policy.alias)
        with transaction.atomic(using=policy.alias):
            store.limit_lock_wait(policy.alias, policy.wait_timeout)
            return call()
    except StoreUnavailable:
        logger.exception("Idempotency store %r unavailable; the view was not run.", policy.alias)
        return problems.unavailable()
    except LockWaitTimeout:
        return problems.in_progress(conf.RETRY_AFTER)


def http_request(request: Any) -> HttpRequest:
    """The ``HttpRequest`` behind a view's first argument (a DRF ``Request`` wraps one)."""
    if isinstance(request, HttpRequest):
        return request
    inner = getattr(request, "_request", None)
    if isinstance(inner, HttpRequest):
        return inner
    raise TypeError(
        f"An idempotent view was called with {type(request).__name__!r} where a request was "
        "expected. On a class-based view's method use "
        "method_decorator(idempotent, name='dispatch'), or IdempotencyMixin for DRF."
    )


def attach(request: HttpRequest, claim: Claim | None) -> None:
    request.idempotency = claim  # type: ignore[attr-defined]
