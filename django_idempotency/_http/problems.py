"""RFC 9457 problem details for the app's own error responses.

Each ``type`` is ``PROBLEM_TYPE_BASE`` followed by the problem's slug, so a project can point
its clients at its own documentation of these problems.
"""

from __future__ import annotations

import json

from django.http import HttpResponse

from django_idempotency._conf.settings import conf

CONTENT_TYPE = "application/problem+json"


def problem(
    status: int, slug: str, title: str, detail: str, headers: dict[str, str] | None = None
) -> HttpResponse:
    body = {
        "type": conf.PROBLEM_TYPE_BASE + slug,
        "title": title,
        "status": status,
        "detail": detail,
    }
    response = HttpResponse(
        json.dumps(body), status=status, content_type=CONTENT_TYPE, headers=headers
    )
    # An answer about one request (or one principal's operation) at one moment: no cache may
    # keep it, nor serve it to another client.
    response["Cache-Control"] = "no-store"
    # Marks the response as the app's own, so it is never stored as the view's result.
    response.idempotency_problem = slug  # type: ignore[attr-defined]
    return response


def missing_key(header: str) -> HttpResponse:
    return problem(
        400,
        "missing-idempotency-key",
        "Missing idempotency key",
        f"This endpoint requires an {header} header.",
    )


def invalid_key(detail: str) -> HttpResponse:
    return problem(400, "invalid-idempotency-key", "Invalid idempotency key", detail)


def invalid_scope(detail: str) -> HttpResponse:
    """A scope (the principal the scope function named) that no store keeps exactly."""
    return problem(400, "invalid-scope", "Invalid scope", detail)


def invalid_body(reason: str) -> HttpResponse:
    """A body the fingerprint cannot read: Django's own parser refused it."""
    return problem(
        400,
        "invalid-request-body",
        "Invalid request body",
        f"The request body could not be read: {reason}",
    )


def body_too_large(reason: str) -> HttpResponse:
    """A keyed body over ``DATA_UPLOAD_MAX_MEMORY_SIZE``: refused before it was read."""
    return problem(
        413,
        "request-body-too-large",
        "Request body too large",
        f"{reason} Nothing was claimed and the view did not run.",
    )


def key_reuse(status: int) -> HttpResponse:
    return problem(
        status,
        "idempotency-key-reuse",
        "Idempotency key reused",
        "This idempotency key was already used for a different request "
        "(another method, path or body).",
    )


def in_progress(retry_after: int) -> HttpResponse:
    return problem(
        409,
        "request-in-progress",
        "Request in progress",
        "A request with this idempotency key is still being processed; retry later.",
        headers={"Retry-After": str(retry_after)},
    )


def unavailable(
    detail: str = "The idempotency store could not be reached, so the request was not processed.",
) -> HttpResponse:
    return problem(
        503,
        "idempotency-unavailable",
        "Idempotency store unavailable",
        detail,
        headers={"Retry-After": str(conf.RETRY_AFTER)},
    )


def misconfigured() -> HttpResponse:
    """A setting that can never work, met before the claim: nothing ran. The
    setting and its value are the operators' business: the log names them."""
    return problem(
        500,
        "idempotency-misconfigured",
        "Idempotency misconfigured",
        "The server's idempotency settings cannot be used, so the request was not processed.",
    )


def response_not_stored(*, unreadable: bool = False) -> HttpResponse:
    """A finished request whose response cannot be replayed: it was too large to store, or
    (``unreadable``) no key of ``ENCRYPTION_KEYS`` decrypts it; the view is never run again."""
    why = (
        "its stored response can no longer be read"
        if unreadable
        else "its response was too large to store"
    )
    return problem(
        500,
        "response-not-stored",
        "Response not stored",
        f"The original request completed, but {why}, so it cannot be replayed.",
    )


def request_abandoned() -> HttpResponse:
    """Stored by ``idempotency_recover --fail`` and the admin's "mark as failed" action."""
    return problem(
        500,
        "request-abandoned",
        "Request abandoned",
        "The original request stopped before it finished (its worker presumably died) and was "
        "marked as failed by an operator; it will not run again with this key. Check whether "
        "its effects took place before retrying with a new key.",
    )


def operation_failed(
    status: int = 500, title: str = "Operation failed", detail: str = "The operation failed."
) -> HttpResponse:
    """An operation's final response stored by :func:`~django_idempotency.fail_operation`."""
    return problem(status, "operation-failed", title, detail)


def invalid_operation_query(detail: str = "limit and before are integers.") -> HttpResponse:
    """The list endpoint's answer to a query it cannot read (``limit``, ``before``, ``state``)."""
    return problem(400, "invalid-operation-query", "Invalid operation query", detail)


def operation_not_found() -> HttpResponse:
    """The status endpoint's answer to an unknown id, another principal's operation or an
    expired one, alike: never a hint that the id exists."""
    return problem(
        404,
        "operation-not-found",
        "Operation not found",
        "No operation with this id is visible to you.",
    )
