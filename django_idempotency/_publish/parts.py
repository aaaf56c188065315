"""The parts of a protected operation's OpenAPI description, whichever generator publishes
them: drf-spectacular's extension (:mod:`._openapi`) and ninja's schema
(:mod:`._ninja_openapi`) show the same header, problems and replay header."""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpResponse

from django_idempotency._base.keys import MAX_KEY_LENGTH
from django_idempotency._conf.options import Policy
from django_idempotency._conf.settings import conf
from django_idempotency._http import problems as _problems
from django_idempotency._http.scopes import user_scope
from django_idempotency._publish import policy as published

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "An RFC 9457 problem detail answered by django-idempotency.",
    "properties": {
        "type": {"type": "string", "format": "uri"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
    },
    "required": ["type", "title", "status", "detail"],
}


REPLAYED: dict[str, Any] = {
    "schema": {"type": "string", "enum": ["true"]},
    "description": "Present when this is the stored response of an earlier request with the "
    "same idempotency key, replayed.",
}


def replayable(code: object) -> bool:
    code = str(code).upper()
    if code[:1] not in ("2", "3", "4"):
        return False
    return not code.isdigit() or int(code) not in conf.RETRYABLE_STATUSES


def key_parameter(policy: Policy) -> dict[str, Any]:
    spelling = "or a bare value" if conf.BARE_KEYS else "(quoted: a bare value is refused)"
    description = (
        "A unique key (a UUID) for this operation; retrying with the same key and request "
        "returns the first response instead of running the operation again. A Structured Field "
        f'string (`"…"`) {spelling}, {conf.MIN_KEY_LENGTH} to {MAX_KEY_LENGTH} printable '
        f"ASCII characters{published.format_text(policy)}. Remembered for "
        f"{published.duration_text(policy.ttl)}."
    )
    if not policy.required:
        description += " Optional: without it the request is not protected."
    return {
        "in": "header",
        "name": conf.HEADER,
        "required": policy.required,
        "schema": published.key_schema(policy),
        "description": description,
    }


Problem = tuple[int, str, dict[str, Any], dict[str, Any]]


def problems(policy: Policy) -> list[Problem]:
    """Each status the app may answer on this operation: description, examples, headers."""
    answers: list[Problem] = []
    for status, entries in sorted(_by_status(policy).items()):
        description = " Or: ".join(text for text, _ in entries if text)
        examples = {
            response.idempotency_problem: {  # type: ignore[attr-defined]
                "value": json.loads(response.content)
            }
            for _, response in entries
        }
        headers = RETRY_AFTER if status in (409, 503) else {}
        answers.append((status, description, examples, headers))
    return answers


def _by_status(policy: Policy) -> dict[int, list[tuple[str, HttpResponse]]]:
    """Each problem the app may answer, made by the code that answers it (so the published
    example cannot drift from the response), grouped by its status."""
    header = conf.HEADER
    by_status: dict[int, list[tuple[str, HttpResponse]]] = {}

    def add(description: str, response: HttpResponse) -> None:
        by_status.setdefault(response.status_code, []).append((description, response))

    if policy.required:
        add(f"The {header} header is missing.", _problems.missing_key(header))
    add(
        f"The {header} header is invalid.",
        _problems.invalid_key(f"The {header} must be printable ASCII."),
    )
    add(
        "The request body could not be read (a multipart body without its boundary, say).",
        _problems.invalid_body("Invalid boundary in multipart: None."),
    )
    if published.scope_function(policy) is not user_scope:  # the default never refuses one
        add(
            "The request names a principal no store can keep (a NUL character in it, say).",
            _problems.invalid_scope("The request names a principal with a NUL character."),
        )
    add(
        "The request body is larger than the server reads for a request with a key.",
        _problems.body_too_large(
            "The request body is larger than DATA_UPLOAD_MAX_MEMORY_SIZE (2,621,440 bytes)."
        ),
    )
    add(
        f"The {header} was already used for a different request.",
        _problems.key_reuse(conf.MISMATCH_STATUS),
    )
    add(
        f"A request with this {header} is still being processed.",
        _problems.in_progress(conf.RETRY_AFTER),
    )
    add(
        "The first request's response cannot be replayed: it was too large to store, or an "
        "operator marked the request as abandoned.",
        _problems.response_not_stored(),
    )
    add("", _problems.request_abandoned())
    add(
        "The idempotency store is unreachable; the request was not processed.",
        _problems.unavailable(),
    )
    return by_status


RETRY_AFTER = {
    "Retry-After": {
        "schema": {"type": "integer", "minimum": 1},
        "description": "Seconds to wait before retrying.",
        "required": True,
    }
}


#: The body of the operation status endpoint, and of an ``in_progress="accepted"`` ``202``
#: (``docs/operations.rst``).
OPERATION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "A long-running operation's state (django-idempotency).",
    "properties": {
        "id": {"type": "string", "description": "The operation's id."},
        "state": {
            "type": "string",
            "enum": ["running", "stalled", "succeeded", "failed"],
            "description": (
                "running: poll again after Retry-After. stalled: the request that started it "
                "stopped (its worker died) and nothing runs it; retry the original request "
                "(same key, same body), which resumes it. succeeded, failed: finished, with "
                "its final response."
            ),
        },
        "progress": {
            "description": (
                "While running: what its task last reported (any JSON, at most 1024 bytes); "
                "absent until it reports."
            ),
        },
        "response": {
            "description": "Once finished: the final response (null if it was not stored).",
            "properties": {
                "status": {"type": "integer"},
                "content_type": {"type": "string"},
                "location": {"type": "string"},
                "body": {"description": "JSON as JSON, other text as a string."},
            },
        },
    },
    "required": ["id", "state"],
}


def operation_status_operation(problem: dict[str, Any]) -> dict[str, Any]:
    """The status endpoint's operation (its id, tag, description and responses), as
    drf-spectacular's schema and a ninja API's (``operations_router``) publish it; ``problem``:
    a problem's schema (a ``$ref`` or the schema itself)."""
    content = {_problems.CONTENT_TYPE: {"schema": problem}}
    return {
        "operationId": "idempotency_operation_status",
        "tags": ["idempotency"],
        "description": (
            "A long-running operation's state, to its own principal only (django-idempotency): "
            "running (with Retry-After), then succeeded or failed with its final response; "
            "stalled when the request that started it stopped and must be retried."
        ),
        "responses": {
            "200": {
                "description": "The operation (while running: with Retry-After).",
                "headers": {"Retry-After": {**RETRY_AFTER["Retry-After"], "required": False}},
                "content": {"application/json": {"schema": OPERATION_SCHEMA}},
            },
            "404": {
                "description": "No operation with this id is visible to you.",
                "content": content,
            },
            "503": {
                "description": "The idempotency store is unreachable.",
                "headers": RETRY_AFTER,
                "content": content,
            },
        },
    }


#: One operation of the list endpoint's page (``docs/operations.rst``).
OPERATION_ITEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "description": "The operation's id."},
        "state": OPERATION_SCHEMA["properties"]["state"],
        "created_at": {"type": "string", "format": "date-time"},
        "url": {"type": "string", "description": "Its status endpoint (GET)."},
        "progress": OPERATION_SCHEMA["properties"]["progress"],
    },
    "required": ["id", "state", "created_at", "url"],
}

#: The list endpoint's body: a page of the principal's operations, newest first.
OPERATION_LIST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "A page of the principal's long-running operations (django-idempotency).",
    "properties": {
        "operations": {"type": "array", "items": OPERATION_ITEM_SCHEMA},
        "next": {
            "type": "string",
            "nullable": True,  # OpenAPI 3.0, which drf-spectacular and ninja publish
            "description": "The next page's URL; null on the last page.",
        },
    },
    "required": ["operations", "next"],
}


def operation_list_operation(problem: dict[str, Any]) -> dict[str, Any]:
    """The list endpoint's operation (``GET operations/``), as
    :func:`operation_status_operation` publishes the status endpoint's."""
    content = {_problems.CONTENT_TYPE: {"schema": problem}}
    query = [
        ("limit", {"type": "integer", "minimum": 1, "maximum": 100}, "Page size (default 20)."),
        # A record's primary key: a 64-bit integer (the endpoint refuses one past it).
        (
            "before",
            {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
            "From the last page's next.",
        ),
        ("state", OPERATION_SCHEMA["properties"]["state"], "Only operations in this state."),
    ]
    return {
        "operationId": "idempotency_operation_list",
        "tags": ["idempotency"],
        "description": (
            "The asking principal's unexpired long-running operations, newest first, a page "
            "at a time (django-idempotency)."
        ),
        "parameters": [
            {"name": name, "in": "query", "required": False, "schema": schema, "description": text}
            for name, schema, text in query
        ],
        "responses": {
            "200": {
                "description": "A page of operations.",
                "content": {"application/json": {"schema": OPERATION_LIST_SCHEMA}},
            },
            "400": {"description": "A query it cannot read.", "content": content},
            "503": {
                "description": "The idempotency store is unreachable.",
                "headers": RETRY_AFTER,
                "content": content,
            },
        },
    }


#: The headers of an ``in_progress="accepted"`` ``202``.
ACCEPTED_HEADERS: dict[str, Any] = {
    "Location": {
        "schema": {"type": "string"},
        "description": "The operation's status URL (GET).",
        "required": True,
    },
    # Required on the 202 of a duplicate, not on the view's own 202 replayed, whose headers
    # are the REPLAYED_HEADERS kept.
    "Retry-After": {**RETRY_AFTER["Retry-After"], "required": False},
}


def accepted(policy: Policy) -> str | None:
    """The description of the ``202`` a duplicate gets under ``in_progress="accepted"``;
    ``None``: the operation's duplicates get ``409``."""
    if policy.in_progress != "accepted":
        return None
    return (
        f"A request with this {conf.HEADER} is still running: its operation's status URL "
        "(Location), not stored."
    )
