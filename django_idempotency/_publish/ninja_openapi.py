"""The idempotency policy of protected ninja operations, in the OpenAPI schema ninja generates.

Ninja merges each operation's ``openapi_extra`` into the operation's schema when it generates
one. A protected operation's is a mapping computed then (:class:`Published`), from the
operation's options and ``settings.IDEMPOTENCY`` as they are: the header parameter, the
problem responses and the replay header that drf-spectacular's extension publishes for DRF
views (:mod:`._openapi_parts`), with anything the operation's own ``openapi_extra`` says on top.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from http.client import responses as reasons
from typing import Any

from ninja.operation import Operation

from django_idempotency._conf.options import Policy
from django_idempotency._conf.settings import conf
from django_idempotency._http.problems import CONTENT_TYPE
from django_idempotency._http.responses import REPLAYED_HEADER
from django_idempotency._publish import parts
from django_idempotency._publish import policy as published

PolicyOf = Callable[[Operation], "Policy | None"]

#: Ninja's own answers to a request it refuses before the operation runs, never stored:
#: (status, description, schema of its ``application/json`` body).
_NINJA_VALIDATION = (
    422,
    "The request is invalid (ninja's validation); not stored.",
    {
        "type": "object",
        "properties": {"detail": {"type": "array", "items": {"type": "object"}}},
        "required": ["detail"],
    },
)
_NINJA_PARSE_ERROR = (
    400,
    "The request body cannot be parsed (ninja); not stored.",
    {"type": "object", "properties": {"detail": {"type": "string"}}, "required": ["detail"]},
)
_BODY_SOURCES = ("body", "form", "file")


def publish(operation: Operation, policy_of: PolicyOf) -> None:
    """Publish the policy of ``operation`` (``policy_of(operation)``, ``None``: unprotected)
    in the schemas ninja generates of it."""
    extra = operation.openapi_extra
    base = extra.base if isinstance(extra, Published) else extra
    operation.openapi_extra = Published(operation, policy_of, base)  # type: ignore[assignment]


class Published(Mapping[str, Any]):
    """An operation's ``openapi_extra``, computed each time ninja reads it.

    Ninja copies an operation's ``openapi_extra`` when it mounts a router; an operation not
    mounted yet has no API, and gives only its own extra (``base``).
    """

    def __init__(self, operation: Operation, policy_of: PolicyOf, base: dict[str, Any] | None):
        self.operation = operation
        self.policy_of = policy_of
        self.base = base or {}

    def _current(self) -> dict[str, Any]:
        policy = self.policy_of(self.operation) if self.operation.api is not None else None
        if policy is None:
            return self.base
        extra = document(self.operation, policy)
        _merge(extra, copy.deepcopy(self.base))
        return extra

    def __getitem__(self, key: str) -> Any:
        return self._current()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._current())

    def __len__(self) -> int:
        return len(self._current())


def document(operation: Operation, policy: Policy) -> dict[str, Any]:
    """What ninja merges into the operation's schema: its key header, every problem the app
    may answer, ninja's own refusals (never stored), the replay header on each status a replay
    can have, the policy as ``x-idempotency`` and as a paragraph of the description."""
    declared = [code for code in operation.response_models if code is not Ellipsis]
    responses: dict[int, dict[str, Any]] = {
        code: {"headers": {REPLAYED_HEADER: parts.REPLAYED}}
        for code in declared
        if parts.replayable(code)
    }
    for status, description, examples, headers in parts.problems(policy):
        _add(
            responses,
            status,
            description,
            declared,
            {CONTENT_TYPE: {"schema": parts.PROBLEM_SCHEMA, "examples": examples}},
            headers,
        )
    for status, description, schema in _refusals(operation):
        _add(responses, status, description, declared, {"application/json": {"schema": schema}})
    if (running := parts.accepted(policy)) is not None:
        _add(
            responses,
            202,
            running,
            declared,
            {"application/json": {"schema": parts.OPERATION_SCHEMA}},
            parts.ACCEPTED_HEADERS,
        )
    extra: dict[str, Any] = {
        "responses": responses,
        "x-idempotency": published.policy_document(policy),
        "description": "\n\n".join(
            filter(None, [operation.description, published.summary(policy)])
        ),
    }
    if not _has_header(operation, policy):
        extra["parameters"] = [parts.key_parameter(policy)]
    return extra


def _refusals(operation: Operation) -> list[tuple[int, str, dict[str, Any]]]:
    """Ninja's own refusals of requests to the operation (never stored)."""
    sources = {getattr(model, "__ninja_param_source__", None) for model in operation.models}
    refusals = [_NINJA_VALIDATION] if sources else []
    if sources & set(_BODY_SOURCES):
        refusals.append(_NINJA_PARSE_ERROR)
    return refusals


def _add(
    responses: dict[int, dict[str, Any]],
    status: int,
    description: str,
    declared: list[Any],
    content: dict[str, Any],
    headers: dict[str, Any] | None = None,
) -> None:
    """One more answer of ``status``, beside what the operation declares itself."""
    response = responses.setdefault(status, {})
    response.setdefault("content", {}).update(content)
    if headers:
        response.setdefault("headers", {}).update(headers)
    previous = response.get("description") or (
        reasons.get(status, "") if status in declared else ""
    )
    response["description"] = f"{previous} Or: {description}" if previous else description


def _has_header(operation: Operation, policy: Policy) -> bool:
    """Whether the operation declares the key's header itself (``Header(alias=...)``)."""
    wanted = conf.HEADER.lower()
    for model in operation.models:
        if getattr(model, "__ninja_param_source__", None) != "header":
            continue
        for name, field in model.model_fields.items():
            if (field.alias or name).lower() == wanted:
                return True
    return False


def _merge(into: dict[Any, Any], update: Mapping[Any, Any]) -> None:
    """Ninja's own merge of ``openapi_extra``: dictionaries merged, lists extended."""
    for key, value in update.items():
        current = into.get(key)
        if isinstance(current, dict) and isinstance(value, dict):
            _merge(current, value)
        elif isinstance(current, list) and isinstance(value, list):
            current.extend(value)
        else:
            into[key] = value
