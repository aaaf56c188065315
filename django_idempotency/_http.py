"""The HTTP side of a protected request, shared by the decorator and the DRF mixin, sync and
async: :class:`HttpAdapter` is what :mod:`._lifecycle` needs to know of HTTP.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from functools import cache
from typing import Any

from django.db import connections
from django.http import HttpRequest, HttpResponseBase
from django.http.request import HttpHeaders

from django_idempotency import _bodies as bodies
from django_idempotency import _engine as engine
from django_idempotency import _lifecycle as lifecycle
from django_idempotency import _problems as problems
from django_idempotency import _responses as responses
from django_idempotency import _storing as storing
from django_idempotency import _telemetry as telemetry
from django_idempotency._conf import conf
from django_idempotency._keys import InvalidKey, hash_key, parse_key
from django_idempotency._lifecycle import Answer
from django_idempotency._limits import bounded_fingerprint, bounded_scope
from django_idempotency._options import Options, Policy
from django_idempotency.claim import Claim
from django_idempotency.exceptions import LockWaitTimeout, StoreUnavailable, UnreplayableResponse
from django_idempotency.models import IdempotencyKey

logger = logging.getLogger("django_idempotency")

#: What :func:`begin` decides: answer with this response, run the view owning this claim, or
#: (``None``) run the view unprotected because the request has no key.
Decision = HttpResponseBase | Claim | None

run_steps = lifecycle.run_steps


class HttpAdapter(lifecycle.Adapter[HttpResponseBase]):
    """A protected request: the key from its header, the answers as HTTP responses."""

    request: HttpRequest

    def __init__(self, request: HttpRequest) -> None:
        super().__init__()
        self.request = request

    def attempt(self, policy: Policy) -> engine.Attempt | Answer[HttpResponseBase] | None:
        request = self.request
        header = request.META.get(_wsgi_name(conf.HEADER))
        if header is None:
            if not policy.required:
                return None
            self._key_refused("missing_key", policy, f"no {conf.HEADER} header")
            return Answer(problems.missing_key(conf.HEADER))
        try:
            key = parse_key(header, min_length=conf.MIN_KEY_LENGTH, bare=conf.BARE_KEYS)
            policy.key_format.check(key)
        except InvalidKey as exc:
            self._key_refused("invalid_key", policy, str(exc))
            return Answer(problems.invalid_key(str(exc)))
        scope = bounded_scope(_call(policy.scope, "scope", request))
        return engine.Attempt(
            key=key,
            scope=scope,
            key_hash=hash_key(key),
            fingerprint=bounded_fingerprint(
                _call(policy.fingerprint, "fingerprint", request, scope)
            ),
            method=request.method or "",
            path=request.get_full_path(),
            request=request,
            operation=_operation(request),
        )

    def _key_refused(self, outcome: str, policy: Policy, reason: str) -> None:
        method = self.request.method or ""
        attributes = telemetry.labels(method, _operation(self.request), policy.atomic)
        engine.key_refused(outcome, attributes, reason)

    def hold(self, claim: Claim | None) -> None:
        self.claim = claim
        attach(self.request, claim)

    def found(self, found: engine.Found) -> Answer[HttpResponseBase]:
        if found.kind is engine.Kind.MISMATCH:
            return Answer(problems.key_reuse(conf.MISMATCH_STATUS))
        if found.kind is engine.Kind.REPLAY:
            return Answer(_replay(found.record))
        return Answer(problems.in_progress(conf.RETRY_AFTER))

    def refused(
        self, exc: StoreUnavailable | LockWaitTimeout, policy: Policy
    ) -> Answer[HttpResponseBase]:
        if isinstance(exc, LockWaitTimeout):
            return Answer(problems.in_progress(conf.RETRY_AFTER))
        return Answer(problems.unavailable())

    def finish(self, claim: Claim, result: HttpResponseBase, policy: Policy) -> HttpResponseBase:
        assert self.subject is not None
        return finish(self.subject, claim, result, policy)


def keep_body(request: HttpRequest) -> None:
    """Read a keyed request's body now, and keep it readable for the view (:mod:`._bodies`).

    Without a key the request runs as if unprotected: its body is the view's business, and an
    upload over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` must not fail for being read (issue 20).
    """
    if _wsgi_name(conf.HEADER) in request.META:
        bodies.keep_readable(request)


def begin(request: HttpRequest, policy: Policy) -> engine.Steps[Decision]:
    """Claim the request's key, or the response to answer with instead."""
    adapter = HttpAdapter(request)
    decision = yield from lifecycle.begin(adapter, policy)
    return decision.value if isinstance(decision, Answer) else decision


def protecting(options: Options, request: HttpRequest) -> Policy | None:
    """The policy of a request its view protects; ``None`` (and no claim) when it does not."""
    policy = options.resolve()
    if conf.ENABLED and policy.protects(request.method):
        return policy
    attach(request, None)
    return None


@cache
def _wsgi_name(header: str) -> str:
    """The header's key in ``request.META``: cheaper than ``request.headers``, which parses
    every header of the request on first use."""
    return HttpHeaders.to_wsgi_name(header)


def _operation(request: HttpRequest) -> str:
    """The view's URL route (``orders/<int:pk>/``) or name: one value per view, not per URL."""
    match = request.resolver_match
    if match is None:
        return ""
    return match.route or match.view_name


def _call(function: Callable[..., object], option: str, request: HttpRequest, *args: str) -> str:
    """The view's scope or fingerprint, from its function or the setting's.

    One that raises, or returns anything but a ``str``, is a bug in the project: the exception
    propagates (its type kept: a database error stays one), with a note and an ERROR log naming
    the function, before anything is claimed or the view runs (issue 18).
    """
    try:
        value = function(request, *args)
    except Exception as exc:
        note = _failed(function, option, request, f"raised {type(exc).__name__}: {exc}")
        if sys.version_info >= (3, 11):  # shown under the traceback, by Django's too
            exc.add_note(note)
        raise
    if isinstance(value, str):
        return value
    raise TypeError(
        _failed(function, option, request, f"returned {type(value).__name__}, not a str")
    )


def _failed(function: Callable[..., object], option: str, request: HttpRequest, what: str) -> str:
    setting = f"{option.upper()}_FUNCTION"
    where = (
        f"IDEMPOTENCY[{setting!r}]"
        if function is getattr(conf, setting)
        else f"the view's {option} option"
    )
    name = getattr(function, "__qualname__", None) or repr(function)
    message = (
        f"The {option} function {getattr(function, '__module__', '')}.{name} ({where}) {what}; "
        f"the {request.method} {request.path} request was refused before its view ran."
    )
    logger.error(message, extra=telemetry.log_facts("policy_function_failed"))
    return message


def _replay(record: IdempotencyKey) -> HttpResponseBase:
    if record.response_body is None or record.response_status is None:
        return problems.response_not_stored()
    return responses.replay(
        record.response_status, record.response_headers, bytes(record.response_body)
    )


def finish(
    attempt: engine.Attempt, claim: Claim, response: HttpResponseBase, policy: Policy
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
                response, lambda rendered: _store(attempt, claim, rendered, policy)
            )
            return response
        responses.render(response)
    except Exception:  # a dying process (SystemExit...) is a crash: recovered later
        abort(attempt, claim, policy, reason="unreplayable response")
        raise
    _store(attempt, claim, response, policy)
    return response


def _store(
    attempt: engine.Attempt, claim: Claim, response: HttpResponseBase, policy: Policy
) -> None:
    if policy.atomic and connections[policy.alias].needs_rollback:
        # DRF marks an ATOMIC_REQUESTS transaction for rollback when it answers an exception
        # (a serializer's 400, an APIException's 503): the claim rolls back with the view's
        # work, as after a crash, and a retry runs again (issue 20). First: no statement may
        # run in that transaction, not even a retryable status's release.
        engine.release(claim, policy, attempt, reason="transaction rolled back", raised=True)
        return
    if response.status_code in conf.RETRYABLE_STATUSES:
        engine.release(
            claim, policy, attempt, reason=f"status {response.status_code}", raised=False
        )
        return
    storage = storing.storage(response)
    if storage is not None and not storage.stored:
        engine.release(claim, policy, attempt, reason=storing.NO_STORE_REASON, raised=False)
        return
    ttl = None if storage is None else storage.ttl
    stored = responses.capture(response, conf.REPLAYED_HEADERS, conf.MAX_BODY_SIZE, ttl)
    if stored.body is None:
        logger.error(
            "Idempotency record %s: the response body is over MAX_BODY_SIZE (%s bytes); "
            "it was not stored, and replays will answer 500 response-not-stored.",
            claim.pk,
            conf.MAX_BODY_SIZE,
            extra=telemetry.claim_facts("body_not_stored", claim),
        )
    engine.complete(claim, stored, policy, attempt)


def abort(attempt: engine.Attempt, claim: Claim, policy: Policy, *, reason: str) -> None:
    """The view raised: release the claim so the client's retry runs it again."""
    engine.abort(claim, policy, attempt, reason=reason)


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
