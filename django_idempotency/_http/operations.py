"""Long-running operations over HTTP (SPEC 4c): the status endpoint, the ``202`` a
duplicate gets under ``in_progress="accepted"``, and ``complete_operation()``.

The status endpoint answers JSON of its own, never the final response itself: its ``200``
means "this operation exists and is yours", whatever the operation ended with, so a final
``404`` or ``500`` cannot be mistaken for the endpoint's own (an unknown id, a fault). The final
response itself is what a retry of the original request replays, byte for byte.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_safe

from django_idempotency._base import rules
from django_idempotency._base.errors import OperationError, StoreUnavailable
from django_idempotency._call import operations as ids
from django_idempotency._call import storing, telemetry
from django_idempotency._conf.settings import conf
from django_idempotency._conf.values import store_alias
from django_idempotency._http import problems, responses
from django_idempotency._http.scopes import ANONYMOUS_SCOPE
from django_idempotency._store import StoredResponse, sealing, using
from django_idempotency._store import operations as store
from django_idempotency._store.limits import bounded_scope
from django_idempotency._store.writes import COMPLETED

__all__ = [
    "accepted",
    "complete_operation",
    "fail_operation",
    "operation_list",
    "operation_status",
    "set_operation_progress",
]

#: The list endpoint's page size: ``?limit=`` up to :data:`MAX_PAGE`, :data:`PAGE` without it.
PAGE, MAX_PAGE = 20, 100

logger = logging.getLogger("django_idempotency")

#: The status endpoint's ``state`` of an operation.
RUNNING, STALLED, SUCCEEDED, FAILED = store.RUNNING, store.STALLED, store.SUCCEEDED, store.FAILED


def complete_operation(
    operation_id: str,
    response: HttpResponseBase | None = None,
    *,
    status: int = 200,
    data: Any = None,
) -> None:
    """Store the final response of the operation ``operation_id``, once.

    Give an ``HttpResponse`` (a ``JsonResponse``, a problem), or ``status`` and ``data`` (made
    into a JSON response). From then on a retry of the request that started the operation
    replays this response (``Idempotent-Replayed: true``, byte for byte, its headers as a
    view's are kept), and the status endpoint reports it. A response marked with
    :func:`~django_idempotency.store_for` sets the record's TTL from now; any other keeps the
    record's expiry. A ``4xx`` or ``5xx`` is the operation's failure, stored the same way.

    Raises :class:`~django_idempotency.OperationError` when the operation is unknown or its
    record erased (``reason`` ``"unknown"``), expired (``"expired"``), already completed
    (``"completed"``), or when the request that started it has not stored its own response
    yet (``"running"``: start the work through the outbox, which waits for it); ``ValueError``
    for a ``202`` (a final response is no ``202``) or a body over ``MAX_BODY_SIZE``;
    :class:`~django_idempotency.StoreUnavailable` when the database did not answer.
    """
    stored = _final(response, status, data)
    alias = conf.DATABASE_ALIAS
    operation = _operation(alias, operation_id)
    if operation is not None:  # sealed for its record
        stored = replace(stored, owner=(operation.scope, operation.key_hash))
    if operation is not None and store.complete(alias, operation, stored):
        logger.info(
            "Idempotency operation %s completed with status %s.",
            operation_id,
            stored.status,
            extra=telemetry.log_facts("operation_completed", operation.key_hash, operation.scope),
        )
        return
    # Refused: read it again to say why (a concurrent completion, an expiry meanwhile).
    raise _refusal(operation_id, operation and _operation(alias, operation_id))


def _final(response: HttpResponseBase | None, status: int, data: Any) -> StoredResponse:
    """The operation's final response as its record keeps it, refused before the record is
    read when no retry could replay it: not rendered, a ``202``, too large."""
    if response is None:
        response = JsonResponse(data, status=status, encoder=DjangoJSONEncoder, safe=False)
    responses.check_replayable(response)
    if not isinstance(response, HttpResponse):
        raise TypeError(f"complete_operation() takes an HttpResponse, not {response!r}.")
    if not getattr(response, "is_rendered", True):
        raise TypeError(
            "complete_operation() was given a DRF Response, which has no renderer outside a "
            "view; give a JsonResponse, or status= and data=."
        )
    if response.status_code == store.ACCEPTED:
        raise ValueError(
            "An operation's final response cannot be a 202 Accepted: that is the answer of "
            "an operation still running."
        )
    mark = storing.storage(response)
    stored = responses.capture(
        response, conf.REPLAYED_HEADERS, conf.MAX_BODY_SIZE, None if mark is None else mark.ttl
    )
    if stored.body is None:
        raise ValueError(
            f"The operation's final response is over MAX_BODY_SIZE ({conf.MAX_BODY_SIZE} bytes)."
        )
    return stored


def fail_operation(
    operation_id: str,
    detail: str,
    *,
    status: int = 500,
    title: str = "Operation failed",
) -> None:
    """Store the operation's failure as its final response, once: an RFC 9457 problem
    (``application/problem+json``, type ``operation-failed``) with ``status`` (a ``4xx`` or
    ``5xx``, ``500`` by default), ``title`` and ``detail``, which the client reads: say what
    failed, never a traceback. From then on the status endpoint answers ``"failed"`` with
    it, and a retry of the original request replays it.

    The background task's way out when its work cannot succeed (a task that raises leaves
    the operation running until its TTL). Refused as :func:`complete_operation` is (an
    :class:`~django_idempotency.OperationError`: ``"completed"`` when a final response is
    stored already); ``ValueError`` for a status under 400.
    """
    if not 400 <= status <= 599:
        raise ValueError(f"fail_operation() takes a 4xx or 5xx status, not {status!r}.")
    complete_operation(operation_id, problems.operation_failed(status, title, detail))


def set_operation_progress(operation_id: str, progress: Any) -> None:
    """Set what the status endpoint shows as the running operation's ``progress``: any JSON
    value (``{"done": 40, "total": 100}``, a short message), at most ``MAX_PROGRESS_SIZE``
    (1024) bytes as compact JSON; each call replaces the last. It also tells
    ``idempotency_recover --operations`` and ``idempotency_stats`` that the operation is not
    stuck.

    Refused as :func:`complete_operation` is (:class:`~django_idempotency.OperationError`:
    ``"completed"`` once its final response is stored, ``"running"`` before its ``202`` is);
    ``ValueError`` for a value over the size or not JSON.
    """
    try:
        # NaN and Infinity are no JSON: every database's JSON column refused them, which was
        # said as StoreUnavailable (a fault to retry), never as the caller's error.
        size = len(
            json.dumps(progress, separators=(",", ":"), cls=DjangoJSONEncoder, allow_nan=False)
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"An operation's progress must be JSON: {exc}") from exc
    if size > store.MAX_PROGRESS_SIZE:
        raise ValueError(
            f"An operation's progress is at most {store.MAX_PROGRESS_SIZE} bytes of JSON, not "
            f"{size}: a few figures and a short message (the result is the final response)."
        )
    progress = json.loads(json.dumps(progress, cls=DjangoJSONEncoder))
    alias = conf.DATABASE_ALIAS
    operation = _operation(alias, operation_id)
    if operation is not None and store.set_progress(alias, operation, progress):
        return
    raise _refusal(operation_id, operation and _operation(alias, operation_id))


def _operation(alias: str, operation_id: str) -> store.Operation | None:
    """The operation ``operation_id`` names, its MAC checked; ``None``: no such operation."""
    operation = _read(alias, operation_id)
    if operation is None or not _verified(operation_id, operation):
        return None
    return operation


def _read(alias: str, operation_id: str) -> store.Operation | None:
    """The record an operation id names, its MAC not checked: a primary key of the database
    store's table, or a Redis store's operation (:func:`.store.read_named`)."""
    pk = ids.parse_id(operation_id)
    if pk is None:
        return store.read_named(operation_id)
    return store.read(alias, pk)


def _unknown(operation_id: str) -> str:
    """Why no operation answers to ``operation_id``. An id of a Redis store's names its store
    by a keyed hash only (:func:`.._store.redis.names.tag`), which no process can read back
    into a URL: one that knows no store of that hash (a Celery worker whose settings lack the
    web's ``STORE``, or whose ``SECRET_KEY`` differs) is told so, not that the id is none."""
    from django_idempotency._store.redis import names

    parsed = names.parse(operation_id)
    if parsed is None or names.resolve(parsed[0]) is not None:
        return f"No operation {operation_id!r}: the id is not one, or its record was erased."
    return (
        f"No operation {operation_id!r} in this process's stores: the id names an operation of "
        f"a Redis store (the store marked {parsed[0]!r}, a hash of its name keyed by "
        "SECRET_KEY), and this process knows no Redis store of that mark. Name the store here "
        "as the process that answered the 202 names it (the same STORE or CACHES alias; a "
        "view's store URL is known once the view's module is imported), with the same "
        "SECRET_KEY (docs: 'Long-running operations')."
    )


def _refusal(operation_id: str, operation: store.Operation | None) -> OperationError:
    if operation is None:
        return OperationError(_unknown(operation_id), reason="unknown")
    if operation.expired(timezone.now()):
        return OperationError(
            f"Operation {operation_id!r} expired with its record ({operation.expires_at:%c}): "
            "its final response would never be read. Give the view a ttl longer than the "
            "work takes (docs: 'Long-running operations').",
            reason="expired",
        )
    if operation.running:  # still processing: the request has not stored its 202 yet
        return OperationError(
            f"Operation {operation_id!r}: the request that started it has not stored its "
            "response yet; start the work through request.idempotency.enqueue(), which "
            "sends it once that response is stored.",
            reason="running",
        )
    return OperationError(
        f"Operation {operation_id!r} is already completed (status "
        f"{operation.response_status}); its final response is stored once.",
        reason="completed",
    )


@require_safe
def operation_list(request: HttpRequest) -> HttpResponse:
    """``GET operations/``: the asking principal's unexpired operations, newest first, a page
    at a time (``?limit=``, ``?state=``, and ``next``: the next page's URL, or ``null``)."""
    try:
        limit = int(request.GET.get("limit", PAGE))
        before = int(request.GET["before"]) if "before" in request.GET else None
    except ValueError:
        return problems.invalid_operation_query("limit and before are integers.")
    state = request.GET.get("state") or None
    if not 1 <= limit <= MAX_PAGE or (before is not None and not 0 < before < ids.BIGINT):
        return problems.invalid_operation_query(
            f"limit is 1 to {MAX_PAGE}; before is the position the last page's next gave."
        )
    if state is not None and state not in store.STATES:
        return problems.invalid_operation_query(f"state is one of {', '.join(store.STATES)}.")
    try:
        # Never the anonymous scope: every anonymous client shares it, and a list of it would
        # hand each one the others' operation ids, which are all that guards their responses.
        scopes = {
            bounded_scope(scope)
            for scope in _scopes(request)
            if scope is not None and scope != ANONYMOUS_SCOPE
        }
        alias = store_alias(conf.STORE, conf.DATABASE_ALIAS)  # the STORE setting's store
        found = (
            store.of_scopes(alias, scopes, before=before, limit=limit + 1, state=state)
            if scopes
            else []
        )
    except StoreUnavailable as exc:
        return _unavailable(exc)
    page, more = found[:limit], len(found) > limit
    now = timezone.now()
    listed = [_listed(operation, now) for operation in page]
    following = None
    if more:
        query = request.GET.copy()
        query["before"] = str(store.cursor(page[-1]))
        following = f"{request.path}?{query.urlencode()}"
    return _json({"operations": listed, "next": following}, 200)


def _listed(operation: store.Operation, now: datetime) -> dict[str, Any]:
    """An operation as the list shows it: its id and the status URL its client polls, its
    state, and its progress while it runs (a finished one's response is the status's)."""
    operation_id = ids.make_id(
        operation.pk, operation.scope, operation.key_hash, operation.created_at
    )
    item = {
        "id": operation_id,
        "state": store.state_of(operation, now),
        "created_at": operation.created_at,
        "url": ids.status_url(operation_id),
    }
    if item["state"] == RUNNING and operation.progress is not None:
        item["progress"] = operation.progress
    return item


@require_safe
def operation_status(request: HttpRequest, operation_id: str) -> HttpResponse:
    """``GET operations/<id>``: the operation's state as JSON, to its own principal only."""
    try:
        scopes = _scopes(request)
        operation = _read(conf.DATABASE_ALIAS, operation_id)
    except StoreUnavailable as exc:
        return _unavailable(exc)
    if (
        operation is None
        or not _verified(operation_id, operation)
        or operation.scope not in {bounded_scope(scope) for scope in scopes if scope is not None}
        or operation.expired(timezone.now())
    ):
        return problems.operation_not_found()
    return _state(operation_id, operation)


def _unavailable(exc: StoreUnavailable) -> HttpResponse:
    """The endpoints' ``503``, logged as a protected view's is: operators see the fault."""
    logger.error("Idempotency operations endpoint unavailable (%s)", exc, exc_info=exc)
    return problems.unavailable()


def _verified(operation_id: str, operation: store.Operation) -> bool:
    return ids.verify(
        operation_id, operation.pk, operation.scope, operation.key_hash, operation.created_at
    )


def accepted(pk: int | str, scope: str, key_hash: str, created_at: datetime) -> HttpResponse:
    """``in_progress="accepted"``: the ``202`` of a duplicate of a request still running,
    with its operation's status URL; never stored (the first request's response will be).
    ``pk``: what its operation id is made of (:func:`.store.found_name`)."""
    operation_id = ids.make_id(pk, scope, key_hash, created_at)
    response = _json({"id": operation_id, "state": RUNNING}, 202)
    response["Location"] = ids.status_url(operation_id)
    response["Retry-After"] = str(conf.RETRY_AFTER)
    return response


def _state(operation_id: str, operation: store.Operation) -> HttpResponse:
    if operation.stalled(timezone.now()):
        # Its owner died with its lock lapsed: nothing runs it, so no Retry-After. The
        # original request, retried, takes the record over and resumes it.
        return _json({"id": operation_id, "state": STALLED}, 200)
    if operation.running:
        shown: dict[str, Any] = {"id": operation_id, "state": RUNNING}
        if operation.progress is not None:
            shown["progress"] = operation.progress
        response = _json(shown, 200)
        response["Retry-After"] = str(conf.RETRY_AFTER)
        return response
    final = operation.response_status
    if final is None:  # an idempotent_function's record: its result is no HTTP response
        state = SUCCEEDED if operation.status == COMPLETED else FAILED
        return _json({"id": operation_id, "state": state, "response": None}, 200)
    if operation.response_body is None:  # over MAX_BODY_SIZE: not stored
        return _json({"id": operation_id, "state": FAILED, "response": None}, 200)
    try:
        headers, body = sealing.unseal(
            operation.response_headers,
            operation.response_body,
            (operation.scope, operation.key_hash),
        )
    except sealing.Unreadable:
        return _json({"id": operation_id, "state": FAILED, "response": None}, 200)
    return _json(
        {
            "id": operation_id,
            "state": FAILED if rules.is_error(final) else SUCCEEDED,
            "response": _response(final, headers, body or b""),
        },
        200,
    )


def _response(status: int, headers: list[list[str]], body: bytes) -> dict[str, Any]:
    """The final response as the status endpoint shows it: its status, its ``Content-Type``,
    its ``Location`` (if any), and its body: JSON as JSON, other text as a string."""
    kept = {name.lower(): value for name, value in headers}
    content_type = kept.get("content-type", "")
    shown: dict[str, Any] = {"status": status, "content_type": content_type}
    if "location" in kept:
        shown["location"] = kept["location"]
    media = content_type.partition(";")[0].strip().lower()
    text = body.decode("utf-8", "replace")
    if media == "application/json" or media.endswith("+json"):
        try:
            # NaN and Infinity (Python writes them) are no JSON: shown parsed, they made this
            # answer one a client's parser refuses.
            shown["body"] = json.loads(text, parse_constant=_no_json)
            return shown
        except (ValueError, RecursionError):  # nested past the parser's depth: a string
            pass
    shown["body"] = text
    return shown


def _no_json(name: str) -> Any:
    raise ValueError(f"{name} is no JSON")


def _json(data: dict[str, Any], status: int) -> HttpResponse:
    response = JsonResponse(data, status=status, encoder=DjangoJSONEncoder)
    # The state changes: no cache may keep it, nor serve one principal's to another.
    response["Cache-Control"] = "no-store"
    return response


def _scopes(request: HttpRequest) -> tuple[str, ...]:
    """:func:`_principals`; a database fault reading them (the session's user, a DRF token)
    is :class:`~.exceptions.StoreUnavailable`, the endpoint's ``503``, as it is for a
    protected view's scope, not Django's ``500``."""
    try:
        return _principals(request)
    except DatabaseError as exc:
        if using(conf.DATABASE_ALIAS).is_transient(exc):
            raise StoreUnavailable(f"The request's principal could not be read: {exc}") from exc
        raise


def _principals(request: HttpRequest) -> tuple[str, ...]:
    """The principals asking, as the views' records have them (none: credentials refused):
    ``OPERATION_SCOPE_FUNCTION``'s, or the scope setting's function's as Django's middleware
    authenticated the request and as DRF's default authentication does (when DRF is
    installed). A plain Django view keys a token's request by what Django's middleware saw (a
    token is anonymous to it), a DRF view by the user DRF's classes found: the request may read
    either principal's operations, each one it can prove."""
    function = conf.OPERATION_SCOPE_FUNCTION
    if function is not None:
        return (function(request),)
    if "rest_framework" not in settings.INSTALLED_APPS:
        return (conf.SCOPE_FUNCTION(request),)
    from django_idempotency._http.drf_auth import authenticate

    middleware = conf.SCOPE_FUNCTION(request)
    if not authenticate(request):
        return ()
    return (middleware, conf.SCOPE_FUNCTION(request))
