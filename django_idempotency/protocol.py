"""The HTTP side of a protected request, shared by the decorator and the DRF mixin, sync and
async: :func:`begin` before the view, :func:`finish` or :func:`abort` after it.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from functools import cache
from typing import Any

from django.db import connections
from django.http import HttpRequest, HttpResponseBase
from django.http.request import HttpHeaders

from django_idempotency import engine, problems, responses
from django_idempotency.claim import Claim
from django_idempotency.conf import conf
from django_idempotency.exceptions import LockWaitTimeout, StoreUnavailable, UnreplayableResponse
from django_idempotency.fingerprints import stored_fingerprint
from django_idempotency.keys import InvalidKey, hash_key, parse_key
from django_idempotency.models import IdempotencyKey
from django_idempotency.options import Policy

logger = logging.getLogger("django_idempotency")

#: What :func:`begin` decides: answer with this response, run the view owning this claim, or
#: (``None``) run the view unprotected because the request has no key.
Decision = HttpResponseBase | Claim | None

run_steps = engine.run_steps
arun_steps = engine.arun_steps


def has_key(request: HttpRequest) -> bool:
    return _wsgi_name(conf.HEADER) in request.META


def begin(request: HttpRequest, policy: Policy) -> engine.Steps[Decision]:
    header = request.META.get(_wsgi_name(conf.HEADER))
    if header is None:
        return problems.missing_key(conf.HEADER) if policy.required else None
    try:
        key = parse_key(header, min_length=conf.MIN_KEY_LENGTH)
    except InvalidKey as exc:
        return problems.invalid_key(str(exc))
    scope = _scope(request)
    attempt = engine.Attempt(
        key=key,
        scope=scope,
        key_hash=hash_key(key),
        fingerprint=stored_fingerprint(conf.FINGERPRINT_FUNCTION(request, scope)),
        method=request.method or "",
        path=request.get_full_path(),
        request=request,
    )
    try:
        outcome = yield from engine.acquire(attempt, policy)
    except StoreUnavailable:
        logger.exception("Idempotency store %r unavailable; the view was not run.", policy.alias)
        return problems.unavailable()
    except LockWaitTimeout:
        if policy.atomic:
            raise  # the transaction is broken: in_transaction() answers 409 outside it
        return problems.in_progress(conf.RETRY_AFTER)
    if isinstance(outcome, Claim):
        return outcome
    if outcome.kind == "mismatch":
        return problems.key_reuse(conf.MISMATCH_STATUS)
    if outcome.kind == "replay":
        return _replay(outcome.record)
    return problems.in_progress(conf.RETRY_AFTER)


@cache
def _wsgi_name(header: str) -> str:
    """The header's key in ``request.META``: cheaper than ``request.headers``, which parses
    every header of the request on first use."""
    return HttpHeaders.to_wsgi_name(header)


def _scope(request: HttpRequest) -> str:
    scope = conf.SCOPE_FUNCTION(request)
    if len(scope) > 255:
        scope = "sha256:" + hashlib.sha256(scope.encode()).hexdigest()
    return scope


def _replay(record: IdempotencyKey) -> HttpResponseBase:
    if record.response_body is None or record.response_status is None:
        return problems.response_not_stored()
    return responses.replay(
        record.response_status, record.response_headers, bytes(record.response_body)
    )


def finish(
    request: HttpRequest, claim: Claim, response: HttpResponseBase, policy: Policy
) -> HttpResponseBase:
    """Store the view's response (or release the claim) and return the response."""
    try:
        responses.check_replayable(response)
        if responses.needs_deferred_render(response):
            if policy.atomic:
                raise UnreplayableResponse(
                    "An atomic idempotent view returned a DRF Response that is not rendered yet; "
                    "put @idempotent above @api_view, or use IdempotencyMixin."
                )
            responses.add_post_render_callback(
                response, lambda rendered: _store(request, claim, rendered, policy)
            )
            return response
        responses.render(response)
    except Exception:  # a dying process (SystemExit...) is a crash: recovered later
        abort(request, claim, policy, reason="unreplayable response")
        raise
    _store(request, claim, response, policy)
    return response


def _store(request: HttpRequest, claim: Claim, response: HttpResponseBase, policy: Policy) -> None:
    if response.status_code in conf.RETRYABLE_STATUSES:
        engine.release(
            claim, policy, request, reason=f"status {response.status_code}", raised=False
        )
        return
    if policy.atomic and connections[policy.alias].needs_rollback:
        # DRF marks an ATOMIC_REQUESTS transaction for rollback when it answers an exception
        # (a serializer's 400): the claim rolls back with the view's work, as after a crash,
        # and a retry runs again (issue 20).
        engine.release(claim, policy, request, reason="transaction rolled back", raised=True)
        return
    stored = responses.capture(response, conf.REPLAYED_HEADERS, conf.MAX_BODY_SIZE)
    if stored.body is None:
        logger.error(
            "Idempotency record %s: the response body is over MAX_BODY_SIZE (%s bytes); "
            "it was not stored, and replays will answer 500 response-not-stored.",
            claim.pk,
            conf.MAX_BODY_SIZE,
        )
    engine.complete(claim, stored, policy, request)


def abort(request: HttpRequest, claim: Claim, policy: Policy, *, reason: str) -> None:
    """The view raised: release the claim so the client's retry runs it again."""
    engine.release(claim, policy, request, reason=reason, raised=True)


def in_transaction(policy: Policy, call: Callable[[], HttpResponseBase]) -> HttpResponseBase:
    """Run ``call`` as atomic mode asks: claim, view and result in one transaction.

    A duplicate's claim waits on the first attempt's uncommitted row, at most ``wait_timeout``;
    a crash rolls everything back and leaves no record behind.
    """
    if not policy.atomic:
        return call()
    try:
        with engine.atomic_attempt(policy):
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
