"""The HTTP side of a protected request, shared by the decorator and the DRF mixin, sync and
async: :class:`HttpAdapter` is what :mod:`._lifecycle` needs to know of HTTP.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from functools import cache
from types import ModuleType
from typing import Any

from django.core.exceptions import ImproperlyConfigured, RequestDataTooBig
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponseBase
from django.http.request import HttpHeaders

from django_idempotency._base.errors import (
    InvalidKey,
    LockWaitTimeout,
    StoreUnavailable,
    UnreplayableResponse,
)
from django_idempotency._base.keys import hash_key, parse_key
from django_idempotency._call import claiming, lifecycle, reports, storing, telemetry, writing
from django_idempotency._call import operations as ids
from django_idempotency._call.attempt import Attempt
from django_idempotency._call.claim import Claim
from django_idempotency._call.identity import Identity
from django_idempotency._call.lifecycle import Answer
from django_idempotency._conf.options import Options, Policy
from django_idempotency._conf.settings import conf
from django_idempotency._http import (
    bodies,
    operations,
    placement,
    problems,
    responses,
    unclaimed,
)
from django_idempotency._http.fingerprints import full_path
from django_idempotency._store import StoredResponse, sealing, using
from django_idempotency._store import operations as operation_store
from django_idempotency._store.limits import bounded_fingerprint, bounded_scope, unkeepable
from django_idempotency._store.rows import Record
from django_idempotency.models import IdempotencyKey

logger = logging.getLogger("django_idempotency")


def answerable(policy: Policy) -> Policy:
    """``policy``, unless its answers need what the URLconf lacks: ``in_progress="accepted"``
    answers with its operation's status URL, which ``django_idempotency.urls`` gives (check
    E071, which needs the URLconf and so does not run at startup). Refused before the claim:
    the view would run, then fail on its own ``operation_url``."""
    if policy.in_progress == "accepted":
        try:
            ids.status_url("0.x")
        except ImproperlyConfigured as exc:
            raise ImproperlyConfigured(f"(django_idempotency.E071) {exc}") from exc
    return policy


class HttpAdapter(lifecycle.Adapter[HttpResponseBase]):
    """A protected request: its policy from its view's options, the key from its header, the
    answers as HTTP responses."""

    #: The request, which signal receivers get too (:attr:`.Attempt.request`).
    request: HttpRequest

    def __init__(self, request: HttpRequest, options: Options, view_request: Any = None) -> None:
        super().__init__()
        self.request = request
        self.options = options
        #: The view's first argument as given: DRF's ``Request`` under ``@api_view``.
        self.view_request = request if view_request is None else view_request

    def resolve(self, *, asynchronous: bool) -> Policy | None:
        """The view's policy for this request; ``None`` (and no claim on the request) when the
        app is off or the method is not protected. A request another layer protects already is
        refused (:func:`refuse_nested`)."""
        refuse_nested(self.request)
        if conf.ENABLED:
            policy = self.options.resolve()
            if policy.protects(self.request.method):
                return answerable(policy)
        attach(self.request, None)
        return None

    def unprotected(self, result: Any) -> HttpResponseBase:
        """The view's response, run without a claim: what it staged with ``enqueue()`` is sent
        (:mod:`.unclaimed`)."""
        unclaimed.conclude(self.request, result)
        return result  # type: ignore[no-any-return]

    def unprotected_in_thread(self) -> bool:
        return unclaimed.pending(self.request)

    def misconfigured(self, exc: ImproperlyConfigured) -> HttpResponseBase:
        """``500 idempotency-misconfigured``: a setting that can never work, met before the
        claim; its message goes to the log, not to the client."""
        request = self.request
        logger.error(
            "Idempotency settings cannot be used: %s The %s %s request was refused before its "
            "view ran.",
            exc,
            request.method,
            request.path,
            extra=telemetry.log_facts("misconfigured"),
        )
        return problems.misconfigured()

    def key_header(self) -> str | None:
        """The key header's value as sent, ``None`` without one: read from ``META``, cheaper
        than ``request.headers``, which parses every header of the request on first use."""
        return self.request.META.get(_wsgi_name(conf.HEADER))

    def identify(self, policy: Policy) -> Identity | Answer[HttpResponseBase] | None:
        request = self.request
        header = self.key_header()
        if header is None:
            if not policy.required:
                return None
            self._key_refused("missing_key", policy, f"no {conf.HEADER} header")
            return Answer(problems.missing_key(conf.HEADER))
        try:
            key = parse_key(header, min_length=conf.MIN_KEY_LENGTH, bare=conf.BARE_KEYS)
            key = policy.key_format.check(key)
        except InvalidKey as exc:
            self._key_refused("invalid_key", policy, str(exc))
            return Answer(problems.invalid_key(str(exc)))
        try:
            scope = _call(policy, policy.scope, "scope", request)
            if reason := unkeepable(scope):
                return Answer(self._scope_refused(policy, reason))
            scope = bounded_scope(scope)
            fingerprint = _call(policy, policy.fingerprint, "fingerprint", request, scope)
        except StoreUnavailable as exc:
            reports.identity_unavailable(self._attributes(policy), policy, exc)
            return Answer(problems.unavailable())
        except RequestDataTooBig as exc:
            return Answer(problems.body_too_large(_sentence(exc)))
        except bodies.UNREADABLE as exc:
            return Answer(problems.invalid_body(_sentence(exc)))
        return Identity(
            key=key,
            scope=scope,
            key_hash=hash_key(key),
            fingerprint=bounded_fingerprint(fingerprint),
            method=request.method or "",
            path=full_path(request),
            operation=_operation(request),
        )

    def fault(self, exc: DatabaseError) -> Answer[HttpResponseBase] | None:
        """The ``503`` of a keyed, protected request whose user could not be read (a
        database fault); ``None``: not this app's to answer."""
        policy = self.policy
        if policy is None or self.key_header() is None or not using(policy.alias).is_transient(exc):
            return None
        refusal = StoreUnavailable(f"The request's user could not be read: {exc}")
        reports.identity_unavailable(self._attributes(policy), policy, refusal)
        return Answer(problems.unavailable())

    def _scope_refused(self, policy: Policy, reason: str) -> HttpResponseBase:
        """``400 invalid-scope``: the scope function returned what no store keeps exactly.

        Refused before the claim, alike on every store and with ``DEBUG`` on or off.
        A client can send what makes such a scope (``/t/acme%00x/`` reached a tenant's scope
        through gunicorn), so it is its ``400``, not a ``500``; the WARNING names the function.
        """
        message = _described(policy.scope, "scope", self.request, f"returned a scope {reason}")
        logger.warning(message, extra=telemetry.log_facts("invalid_scope"))
        telemetry.count("invalid_scope", self._attributes(policy))
        return problems.invalid_scope(f"The request names a principal {reason}.")

    def _key_refused(self, outcome: str, policy: Policy, reason: str) -> None:
        reports.key_refused(outcome, self._attributes(policy), reason)

    def _attributes(self, policy: Policy) -> dict[str, str]:
        method = self.request.method or ""
        return telemetry.labels(method, _operation(self.request), policy.atomic)

    def hold(self, claim: Claim | None) -> None:
        attach(self.request, claim)

    def found(self, found: claiming.Found) -> Answer[HttpResponseBase]:
        if found.kind is claiming.Kind.MISMATCH:
            return Answer(problems.key_reuse(conf.MISMATCH_STATUS))
        if found.kind is claiming.Kind.REPLAY:
            return Answer(_replay(found.record))
        record, policy = found.record, self.policy
        if policy is not None and policy.in_progress == "accepted":
            # The first request still runs: its operation's status URL.
            try:
                named = operation_store.found_name(policy.alias, record)
            except StoreUnavailable:
                logger.warning("Could not read a running operation's id.", exc_info=True)
                return Answer(problems.unavailable())
            if named is not None:
                made = operations.accepted(named[0], record.scope, record.key_hash, named[1])
                return Answer(made)
        return Answer(problems.in_progress(conf.RETRY_AFTER))

    def refused(
        self, exc: StoreUnavailable | LockWaitTimeout, policy: Policy
    ) -> Answer[HttpResponseBase]:
        if isinstance(exc, LockWaitTimeout):
            return Answer(problems.in_progress(conf.RETRY_AFTER))
        return Answer(problems.unavailable())

    def interrupted(self, exc: lifecycle.Interruption) -> Answer[HttpResponseBase]:
        """A view stopped by its recovery point: ``503`` when the store did not answer, ``409``
        when another attempt owns the key (its result is replayed to the next retry)."""
        if isinstance(exc, StoreUnavailable):
            return Answer(problems.unavailable())
        return Answer(problems.in_progress(conf.RETRY_AFTER))

    def finish(self, attempt: Attempt, result: HttpResponseBase) -> HttpResponseBase:
        """Store the view's response (or release the claim) and return the response. The
        app's own problem (a ``409``, ``422``, ``400``, ``503``, ``500`` it answered itself, from a
        layer inside this one) is never stored as the view's: the view did not answer it, and
        its key would answer that problem until the record expired."""
        slug = getattr(result, "idempotency_problem", None)
        if slug is not None:
            writing.release(attempt, reason=f"the app's own {slug} answer", raised=False, undo=True)
            return result
        try:
            responses.check_replayable(result)
            if responses.needs_deferred_render(result):
                if attempt.policy.atomic:
                    # Stored in the view's transaction, which ends before DRF's dispatch does.
                    if not responses.finalize(result, self.view_request):
                        raise UnreplayableResponse(
                            "An atomic idempotent view returned a DRF Response that is not "
                            "rendered yet, outside a DRF view; use IdempotencyMixin."
                        )
                else:
                    responses.add_post_render_callback(
                        result, lambda rendered: _conclude(attempt, rendered)
                    )
                    return result
            responses.render(result)
        except Exception:  # a dying process (SystemExit...) is a crash: recovered later
            writing.release(attempt, reason="unreplayable response", raised=True)
            raise
        connection = self.connection  # atomic mode's
        _conclude(attempt, result, connection is not None and connection.needs_rollback)
        return result


def refuse_nested(request: HttpRequest) -> None:
    """``ImproperlyConfigured`` when another layer has claimed ``request``'s key already (its
    ``request.idempotency`` is a claim): two stacked ``@idempotent``, or ``IdempotencyMixin``
    and ``method_decorator(idempotent)`` on a handler. The inner claim would find the outer's
    record and answer ``409``, and the outer would store that ``409`` as the view's response:
    every key poisoned until it expired. Refused before the inner claim."""
    if isinstance(getattr(request, "idempotency", None), Claim):
        raise ImproperlyConfigured(
            f"The {request.method} {request.path} request is protected twice: an outer layer "
            "(@idempotent, IdempotencyMixin or django_idempotency.ninja.idempotent) has claimed "
            "its key already. Protect a view once: remove the inner @idempotent (or "
            "method_decorator(idempotent) on a handler of an IdempotencyMixin view)."
        )


def view_adapter(
    options: Options, view: Any = None
) -> Callable[[tuple[Any, ...], dict[str, Any]], HttpAdapter]:
    """What :func:`._lifecycle.wrap` makes for each call of a decorated view; its first call
    refuses a django-ninja caller, before the claim (:func:`.placement.refuse_ninja_caller`)."""
    checked = False

    def adapter(args: tuple[Any, ...], kwargs: dict[str, Any]) -> HttpAdapter:
        nonlocal checked
        if not checked:
            # Its frame is called by the view's wrapper, which its caller called.
            placement.refuse_ninja_caller(view, sys._getframe(2))
            checked = True
        request = args[0] if args else kwargs.get("request")
        return HttpAdapter(http_request(request), options, request)

    return adapter


def keep_body(request: HttpRequest) -> None:
    """Keep a keyed request's body for the fingerprint, whoever reads it first, without
    reading it now (:func:`._bodies.read_when_asked`): a request the framework refuses is never
    read.

    Without a key the request runs as if unprotected: its body is the view's business, and an
    upload over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` must not fail for being read.
    """
    if _wsgi_name(conf.HEADER) in request.META:
        bodies.read_when_asked(request)


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


def _call(
    policy: Policy,
    function: Callable[..., object],
    option: str,
    request: HttpRequest,
    *args: str,
) -> str:
    """The view's scope or fingerprint, from its function or the setting's.

    One that raises, or returns anything but a ``str``, is a bug in the project: the exception
    propagates (its type kept: a database error stays one), with a note and an ERROR log naming
    the function, before anything is claimed or the view runs. A database fault
    (the default scope reads ``request.user``, a query while the database is down) is no bug:
    :class:`~.exceptions.StoreUnavailable`, a ``503``.
    """
    try:
        value = function(request, *args)
    except (*bodies.UNREADABLE, RequestDataTooBig):
        # The client's body, not the function: answered 400 invalid-request-body, or 413.
        raise
    except DatabaseError as exc:
        if using(policy.alias).is_transient(exc):
            raise StoreUnavailable(f"The {option} function met a database fault: {exc}") from exc
        _note(exc, function, option, request)
        raise
    except Exception as exc:
        _note(exc, function, option, request)
        raise
    if isinstance(value, str):
        return value
    raise TypeError(
        _failed(function, option, request, f"returned {type(value).__name__}, not a str")
    )


def _note(
    exc: Exception, function: Callable[..., object], option: str, request: HttpRequest
) -> None:
    """Note and log the function's own exception as the project's bug."""
    note = _failed(function, option, request, f"raised {type(exc).__name__}: {exc}")
    if sys.version_info >= (3, 11):  # shown under the traceback, by Django's too
        exc.add_note(note)


def _sentence(exc: Exception) -> str:
    """Django's message about a body, as the end of a sentence."""
    text = str(exc).strip() or type(exc).__name__
    return text if text.endswith(".") else text + "."


def _failed(function: Callable[..., object], option: str, request: HttpRequest, what: str) -> str:
    message = _described(function, option, request, what)
    logger.error(message, extra=telemetry.log_facts("policy_function_failed"))
    return message


def _described(
    function: Callable[..., object], option: str, request: HttpRequest, what: str
) -> str:
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
    return message


def _replay(record: IdempotencyKey | Record) -> HttpResponseBase:
    if record.response_status is None:
        return problems.response_not_stored()
    try:
        headers, body = sealing.unseal(
            record.response_headers, record.response_body, (record.scope, record.key_hash)
        )
    except sealing.Unreadable as exc:
        logger.error(
            "Idempotency record %s: %s It is answered 500 response-not-stored, and never run "
            "again.",
            record.pk,
            exc,
            extra=telemetry.log_facts("unreadable", record.key_hash, record.scope),
        )
        return problems.response_not_stored(unreadable=True)
    if body is None:
        return problems.response_not_stored()
    return responses.replay(record.response_status, headers, body)


def _conclude(attempt: Attempt, response: HttpResponseBase, rolled_back: bool = False) -> None:
    """Store the response, or release the claim; ``rolled_back``: atomic mode's transaction
    is marked for rollback."""
    if rolled_back:
        # DRF marks an ATOMIC_REQUESTS transaction for rollback when it answers an exception
        # (a serializer's 400, an APIException's 503): the claim rolls back with the view's
        # work, as after a crash, and a retry runs again. First: no statement may
        # run in that transaction, not even a retryable status's release.
        writing.release(attempt, reason="transaction rolled back", raised=True)
        return
    if response.status_code in conf.RETRYABLE_STATUSES:
        reason = f"status {response.status_code}"
        writing.release(attempt, reason=reason, raised=False, undo=True)
        return
    writing.conclude(
        attempt, storing.storage(response), lambda ttl: _capture(attempt, response, ttl)
    )


def _capture(attempt: Attempt, response: HttpResponseBase, ttl: timedelta | None) -> StoredResponse:
    identity = attempt.identity
    stored = responses.capture(
        response,
        conf.REPLAYED_HEADERS,
        conf.MAX_BODY_SIZE,
        ttl,
        (identity.scope, identity.key_hash),
    )
    limit, setting = conf.MAX_BODY_SIZE, "MAX_BODY_SIZE"
    if stored.body is not None and conf.MAX_STORED_BODY_SIZE is not None:
        size = len(stored.sealed[1] or b"")
        if size > conf.MAX_STORED_BODY_SIZE:
            stored = replace(stored, body=None)
            limit, setting = conf.MAX_STORED_BODY_SIZE, "MAX_STORED_BODY_SIZE"
    if stored.body is None:
        claim = attempt.claim
        assert claim is not None  # a result is captured for its claim's write
        logger.error(
            "Idempotency record %s: the response body is over %s (%s bytes); "
            "it was not stored, and replays will answer 500 response-not-stored.",
            claim.pk,
            setting,
            limit,
            extra=claim.facts("body_not_stored"),
        )
    return stored


def ninja() -> ModuleType | None:
    """``django_idempotency.ninja`` once something has imported it, else ``None``: the testing
    toolkit and the checks reach django-ninja's operations through it. Looked up,
    never imported from here: the HTTP side imports nothing of the public modules above it.
    A project whose URLconf routes to a protected operation has imported it; the
    checks read the URLconf first."""
    return sys.modules.get("django_idempotency.ninja")


def http_request(request: Any) -> HttpRequest:
    """The ``HttpRequest`` behind a view's first argument (a DRF ``Request`` wraps one)."""
    if isinstance(request, HttpRequest):
        return request
    inner = getattr(request, "_request", None)
    if isinstance(inner, HttpRequest):
        return inner
    raise TypeError(
        f"An idempotent view was called with {type(request).__name__!r} where a request was "
        "expected. On a method, use @method_decorator(idempotent); for a DRF view, "
        "IdempotencyMixin, or method_decorator(idempotent) on the handler method (post, put...)."
    )


def attach(request: HttpRequest, claim: Claim | None) -> None:
    """``request.idempotency``: the claim, or for a request run unprotected an
    :class:`.Unclaimed` (falsy; its ``enqueue()`` sends after the response)."""
    request.idempotency = unclaimed.Unclaimed() if claim is None else claim  # type: ignore[attr-defined]
