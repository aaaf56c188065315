"""OpenAPI for protected views through drf-spectacular, with no work from the user.

The app config imports this module only when drf-spectacular is installed. Its view extension
gives each protected DRF view (``IdempotencyMixin``, or ``@idempotent`` on an ``@api_view``
function or on a handler) a schema class whose operations publish the view's idempotency policy
(:func:`document`). The policy comes from the view's options and ``settings.IDEMPOTENCY`` when
the schema is generated.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from drf_spectacular.extensions import OpenApiViewExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ComponentRegistry, ResolvedComponent, get_class, get_doc
from rest_framework.views import APIView

from django_idempotency._conf.options import Options, Policy
from django_idempotency._conf.settings import conf
from django_idempotency._http.drf import IdempotencyMixin
from django_idempotency._http.operations import operation_list, operation_status
from django_idempotency._http.problems import CONTENT_TYPE
from django_idempotency._http.responses import REPLAYED_HEADER
from django_idempotency._publish import parts
from django_idempotency._publish import policy as published

if TYPE_CHECKING:
    from drf_spectacular.utils import _SchemaType

PROBLEM_COMPONENT = "IdempotencyProblem"


class IdempotencyViewExtension(OpenApiViewExtension):  # type: ignore[no-untyped-call]
    """Swaps a protected view's schema class for one that documents the protection.

    It matches every DRF view (drf-spectacular shows an extension only the view class, while
    ``@idempotent`` marks the function around it) and leaves unprotected ones alone. Its
    priority is below the default, so any other view extension, the project's own included,
    takes precedence on the views it targets.
    """

    target_class = "rest_framework.views.APIView"
    match_subclasses = True
    priority = -1

    def view_replacement(self) -> type[APIView]:
        view_class: type[APIView] = self.target
        callback_options = _options_of(self.target_callback)
        handler_names = _handler_names(view_class, self.target_callback)
        if not (
            callback_options is not None
            or issubclass(view_class, IdempotencyMixin)
            or any(_handler_options(getattr(view_class, name, None)) for name in handler_names)
        ):
            return view_class
        base_schema = view_class.schema
        if not isinstance(base_schema, AutoSchema):
            return view_class  # not drf-spectacular's: nothing we can add to
        attributes: dict[str, Any] = {
            "schema": _schema_class(type(base_schema), callback_options)(),
            "__module__": view_class.__module__,
            "__qualname__": view_class.__qualname__,
        }
        # drf-spectacular gives a handler decorated with @extend_schema its own schema class,
        # which would drop ours: hand it a subclass of that class which documents us too.
        for name in handler_names:
            handler = getattr(view_class, name, None)
            action_schema = getattr(handler, "kwargs", {}).get("schema") if handler else None
            if handler is not None and action_schema is not None:
                attributes[name] = _with_schema(
                    handler, _schema_class(get_class(action_schema), callback_options)
                )
        return type(view_class.__name__, (view_class,), attributes)


class _IdempotencySchema(AutoSchema):
    """Mixed into the view's own schema class by :class:`IdempotencyViewExtension`."""

    #: Options of an ``@idempotent`` wrapping the whole view function (``@api_view``).
    idempotency_callback_options: Options | None = None

    def get_operation(
        self,
        path: str,
        path_regex: str,
        path_prefix: str,
        method: str,
        registry: ComponentRegistry,
    ) -> _SchemaType | None:
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        options = self.idempotency_callback_options or _view_options(self.view, method)
        if operation is None or options is None:
            return operation
        policy = options.resolve()
        if conf.ENABLED and policy.protects(method.upper()):
            document(operation, policy, registry)
        return operation

    def get_description(self) -> str:  # type: ignore[override]  # as drf-spectacular's
        description = super().get_description()
        # drf-spectacular falls back on the docstrings of a view's bases, ours among them.
        return "" if description == get_doc(IdempotencyMixin) else description


def document(operation: dict[str, Any], policy: Policy, registry: ComponentRegistry) -> None:
    """Publish the view's idempotency policy on one of its operations.

    The header parameter with the format the server accepts, every problem the app may answer,
    the replay header on each status a replay can have, the policy as ``x-idempotency``
    (:func:`~django_idempotency._publish.policy.policy_document`) and as a paragraph of the
    description.
    """
    parameters: list[dict[str, Any]] = operation.setdefault("parameters", [])
    if not any(
        p.get("in") == "header" and str(p.get("name", "")).lower() == conf.HEADER.lower()
        for p in parameters
    ):
        parameters.append(parts.key_parameter(policy))
    component = ResolvedComponent(  # type: ignore[no-untyped-call]
        name=PROBLEM_COMPONENT,
        type=ResolvedComponent.SCHEMA,
        object=PROBLEM_COMPONENT,
        schema=parts.PROBLEM_SCHEMA,
    )
    registry.register_on_missing(component)
    responses: dict[str, Any] = operation.setdefault("responses", {})
    # Whatever the view answers itself is stored and replayed, unless its status is released.
    replayable = {code for code in responses if parts.replayable(code)}
    if "requestBody" in operation:
        # DRF's own 400s (validation and parse errors), stored and replayed like the view's.
        validation = responses.setdefault("400", {"description": _VALIDATION})
        validation.setdefault("content", {}).setdefault("application/json", {"schema": {}})
        replayable.add("400")
    _add_problems(responses, policy, component.ref)
    if (running := parts.accepted(policy)) is not None:
        _add_accepted(responses, running)
    for code in replayable:
        responses[code].setdefault("headers", {}).setdefault(REPLAYED_HEADER, parts.REPLAYED)
    operation["responses"] = dict(sorted(responses.items()))
    operation["x-idempotency"] = published.policy_document(policy)
    paragraph = published.summary(policy)
    operation["description"] = "\n\n".join(filter(None, [operation.get("description"), paragraph]))


def _add_problems(responses: dict[str, Any], policy: Policy, ref: dict[str, Any]) -> None:
    """Each problem the app may answer, merged into the view's own responses: a status the view
    documents already keeps its description, the app's added after an "Or:"."""
    for status, description, examples, headers in parts.problems(policy):
        response = responses.setdefault(str(status), {"description": description})
        if not response.get("description"):
            response["description"] = description
        elif description not in response["description"]:
            response["description"] += f" Or: {description}"
        response.setdefault("content", {}).setdefault(
            CONTENT_TYPE, {"schema": ref, "examples": examples}
        )
        if headers:
            response.setdefault("headers", {}).update(headers)


def _add_accepted(responses: dict[str, Any], running: str) -> None:
    """The ``202`` of an operation handed on, with the status URL's headers and body: merged
    as a problem is, the view's own ``202`` described first."""
    response = responses.setdefault("202", {"description": running})
    if response.get("description") != running:
        response["description"] = f"{response.get('description', '')} Or: {running}"
    response.setdefault("headers", {}).update(parts.ACCEPTED_HEADERS)
    response.setdefault("content", {}).setdefault(
        "application/json", {"schema": parts.OPERATION_SCHEMA}
    )


_VALIDATION = "The request is invalid (the view's own validation, in DRF's format)."


def _options_of(value: object) -> Options | None:
    options = getattr(value, "idempotency_options", None)
    return options if isinstance(options, Options) else None


def _handler_names(view_class: type[APIView], callback: object) -> list[str]:
    actions: dict[str, str] = getattr(callback, "actions", None) or {}
    return sorted({*view_class.http_method_names, *actions.values(), "dispatch"})


def _view_options(view: APIView, method: str) -> Options | None:
    if isinstance(view, IdempotencyMixin):
        return view.get_idempotency_options()
    handler_name = getattr(view, "action", None) or method.lower()
    for name in (handler_name, "dispatch"):
        if (options := _handler_options(getattr(view, name, None))) is not None:
            return options
    return None


def _handler_options(handler: object) -> Options | None:
    if handler is None:
        return None
    if (options := _options_of(handler)) is not None:
        return options
    # Our copy of an @extend_schema handler (below) wraps the original.
    if (wrapped := getattr(handler, "__wrapped__", None)) is not None:
        return _handler_options(wrapped)
    # @api_view's handler calls the view function it closes over: @idempotent under @api_view.
    for cell in getattr(handler, "__closure__", None) or ():
        try:
            contents = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if (options := _options_of(contents)) is not None:
            return options
    return None


_schema_classes: dict[tuple[type[AutoSchema], Options | None], type[AutoSchema]] = {}


def _schema_class(base: type[AutoSchema], callback_options: Options | None) -> type[AutoSchema]:
    key = (base, callback_options)
    if key not in _schema_classes:
        attributes = {"idempotency_callback_options": callback_options}
        name = f"Idempotency{base.__name__}"
        bases = (base,) if issubclass(base, _IdempotencySchema) else (_IdempotencySchema, base)
        _schema_classes[key] = type(name, bases, attributes)
    return _schema_classes[key]


def _with_schema(handler: Callable[..., Any], schema: type[AutoSchema]) -> Callable[..., Any]:
    """A copy of ``handler`` whose drf-spectacular schema is ``schema``, the original untouched."""

    @functools.wraps(handler)
    def copy(*args: Any, **kwargs: Any) -> Any:
        return handler(*args, **kwargs)

    copy.kwargs = {**handler.kwargs, "schema": schema}  # type: ignore[attr-defined]
    return copy


class _OperationStatusSchema(AutoSchema):
    """The status endpoint's operation, as ``docs/operations.rst`` defines it."""

    describe = staticmethod(parts.operation_status_operation)

    def get_request_serializer(self) -> Any:
        return None  # a GET: no body (and no serializer for drf-spectacular to guess)

    def get_response_serializers(self) -> Any:
        return None  # the responses are written below

    def get_operation(
        self,
        path: str,
        path_regex: str,
        path_prefix: str,
        method: str,
        registry: ComponentRegistry,
    ) -> _SchemaType | None:
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        component = ResolvedComponent(  # type: ignore[no-untyped-call]
            name=PROBLEM_COMPONENT,
            type=ResolvedComponent.SCHEMA,
            object=PROBLEM_COMPONENT,
            schema=parts.PROBLEM_SCHEMA,
        )
        registry.register_on_missing(component)
        operation.update(self.describe(component.ref))
        return operation


class _OperationListSchema(_OperationStatusSchema):
    """The list endpoint's operation (``GET operations/``)."""

    describe = staticmethod(parts.operation_list_operation)


class OperationStatusView(APIView):
    """What drf-spectacular (and DRF's own generator) sees of the operation status endpoint,
    a plain Django view: its schema only. :func:`publish_operation_status` hands it
    to the view as DRF's ``as_view()`` would (``cls``), so the generators, which document DRF
    views alone, include the endpoint; requests never reach it."""

    schema = _OperationStatusSchema()

    def get(self, request: Any, operation_id: str) -> Any:  # pragma: no cover: never routed
        raise NotImplementedError


class OperationListView(APIView):
    """The list endpoint's schema, as :class:`OperationStatusView` is the status endpoint's."""

    schema = _OperationListSchema()

    def get(self, request: Any) -> Any:  # pragma: no cover: never routed
        raise NotImplementedError


def publish_operation_status() -> None:
    """Show the status and list endpoints to drf-spectacular: called once, when the app is
    ready."""
    for function, cls in (
        (operation_status, OperationStatusView),
        (operation_list, OperationListView),
    ):
        view: Any = function
        view.cls = cls
        view.initkwargs = {}
