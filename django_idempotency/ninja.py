"""``idempotent`` for django-ninja operations: the only module importing ninja.

Ninja calls an operation's function after its authentication, throttling and request
validation, and renders what the function returns afterwards. The decorator wraps that function
(ninja's "operation" mode), so the claim is made after ninja refused what it refuses (a ``401``
or ninja's ``422`` is never stored), and it renders the function's result with the operation's
own renderer before storing it: what is stored is the bytes the client got. The operation runs
it through a small wrapper of ``Operation.run`` (:func:`_bind`), which hands it the operation
and publishes the policy in ninja's OpenAPI schema (:mod:`._ninja_openapi`).
"""

from __future__ import annotations

import contextlib
import inspect
import numbers
import sys
from collections.abc import Callable
from dataclasses import replace
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar, overload

from asgiref.sync import async_to_sync, iscoroutinefunction
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured
from django.db.models import Model
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from ninja import Router
from ninja.decorators import decorate_view
from ninja.operation import Operation

from django_idempotency._base.errors import UnreplayableResponse
from django_idempotency._call import lifecycle, writing
from django_idempotency._call.attempt import Attempt
from django_idempotency._conf.options import (
    VIEW_OPTIONS,
    Options,
    Policy,
    ViewOptions,
    refuse_unstorable,
)
from django_idempotency._conf.settings import conf, derived
from django_idempotency._conf.values import SAFE_METHODS
from django_idempotency._http import adapter as protocol
from django_idempotency._http import framework_faults
from django_idempotency._http.operations import operation_list, operation_status
from django_idempotency._http.scopes import user_scope
from django_idempotency._publish import ninja_openapi as openapi
from django_idempotency._publish.parts import (
    PROBLEM_SCHEMA,
    operation_list_operation,
    operation_status_operation,
)
from django_idempotency._store.limits import sha256_hex

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack: Python 3.11

__all__ = ["auth_scope", "exception_handler", "idempotent", "operations_router"]

Func = TypeVar("Func", bound=Callable[..., Any])

#: The request attribute :func:`_bind` sets to the operation that runs the request.
_OPERATION = "_idempotency_ninja_operation"

_PLACEMENT = (
    "put it under the operation's decorator (@api.post(...) then @idempotent), or give it to "
    "router.add_decorator(idempotent) in ninja's default mode"
)


@overload
def idempotent(func: Func) -> Func: ...


@overload
def idempotent(func: None = None, **options: Unpack[ViewOptions]) -> Callable[[Func], Func]: ...


def idempotent(
    func: Func | None = None, **options: Unpack[ViewOptions]
) -> Func | Callable[[Func], Func]:
    """Protect a django-ninja operation with the ``Idempotency-Key`` header.

    Placed under the operation's decorator (``@api.post(...)`` then ``@idempotent``), or given
    to ``router.add_decorator(...)`` (or ``api.add_decorator``) in ninja's default mode; with
    the options of :func:`django_idempotency.idempotent`. Without a ``methods`` option it
    protects the operation's own methods (``PUT`` and ``DELETE`` too), safe ones excepted.
    When ninja authenticated the request, the key belongs to ``request.auth``
    (:func:`auth_scope`) unless a ``scope`` option says otherwise.
    """
    built = Options.build(VIEW_OPTIONS, "idempotent", **options)

    def decorate(func: Func) -> Func:
        if isinstance(getattr(func, "__self__", None), Operation):
            raise ImproperlyConfigured(
                "@idempotent was given an operation's run (decorate_view, or add_decorator in "
                "view mode), which ninja calls before its authentication and validation: "
                f"{_PLACEMENT}."
            )
        operation = _operation_being_decorated(func)
        if operation is None and hasattr(func, "_ninja_operation"):
            raise ImproperlyConfigured(
                f"@idempotent is above the operation's decorator on {func.__qualname__}, where "
                f"ninja never calls it: {_PLACEMENT}."
            )
        refuse_unstorable(built, f"{func.__module__}.{func.__qualname__}")
        wrapper = wraps(func)(_wrap(func, built))
        wrapper.idempotency_options = built  # type: ignore[attr-defined]
        wrapper.__signature__ = _signature(func)  # type: ignore[attr-defined]
        if operation is None:
            # Under @api.post: bound to each operation ninja makes of it, and to its copies.
            decorate_view(_bind)(wrapper)
        else:
            # Given to add_decorator: ninja is binding this operation now.
            operation.run = _bind(operation.run, operation)  # type: ignore[method-assign]
        return wrapper  # type: ignore[return-value]

    return decorate if func is None else decorate(func)


def auth_scope(auth: object) -> str:
    """The scope of a request ninja authenticated as ``auth`` (its ``request.auth``).

    A user is ``user:<pk>``, as :func:`~django_idempotency.user_scope` says, so a user's
    keys are the same through ninja and through Django views; another model instance is
    ``<app_label>.<model>:<pk>``; any other value (an API key, a token) is the SHA-256 of its
    string, ``auth:<hex>``, so that a secret is never stored in clear. Erasure
    (``idempotency_cleanup --scope``) takes the same value.
    """
    if (refusal := _nobody(auth)) is not None:
        raise TypeError(refusal)
    if isinstance(auth, Model):
        if auth._meta.label_lower == _user_label():
            return f"user:{auth.pk}"
        return f"{auth._meta.label_lower}:{auth.pk}"
    kind = type(auth)
    if kind.__str__ is object.__str__ and kind.__repr__ is object.__repr__:
        # Its string is its address in memory: every request would be a principal of its own,
        # and no retry would ever be replayed.
        raise TypeError(
            f"ninja authenticated the request as a {kind.__qualname__} whose string is its "
            "address in memory, which names no principal: give the class a __str__ naming "
            "it, return a model instance or a string, or give the operation a scope option."
        )
    return f"auth:{sha256_hex(str(auth))}"


def exception_handler(request: HttpRequest, exc: Exception) -> HttpResponse:
    """A handler for ``api.add_exception_handler(DatabaseError, exception_handler)``: a
    database fault (a lost or refused connection, a server shutting down or read-only) is
    ``503 idempotency-unavailable`` with ``Retry-After``, not Django's ``500``; any other
    database error is raised again, to Django, as ninja does without a handler.

    ninja authenticates before it calls the operation, so an ``authenticate()`` that reads the
    database (an API key's row) meets a fault before ``idempotent`` runs: nothing was claimed,
    and the client's retry is answered as a first request."""
    response = framework_faults.unavailable(exc)
    if response is None:
        raise exc
    return response


def _nobody(auth: object) -> str | None:
    """Why ``auth`` identifies nobody (``None``: it may name a principal): an ``authenticate``
    that returns ``True``, ``1`` or ``1.0`` says that the request is allowed, not who sent it,
    and its one scope would be everyone's: alice's response replayed to bob."""
    if not isinstance(auth, (bool, numbers.Number)) and auth is not None and auth is not Ellipsis:
        return None
    return (
        f"ninja authenticated the request as {auth!r}, which identifies nobody: every caller "
        "would share one scope, and one caller's response would be replayed to another. Return "
        "the principal from authenticate() (a user or model instance, an API key's string), or "
        "give the operation a scope option (idempotent(scope=...))."
    )


def _user_label() -> str:
    return get_user_model()._meta.label_lower


def _auth_scope(request: HttpRequest) -> str:
    """Each principal the API authenticated (a user, an API key) has its own keys.

    The principal is ninja's ``request.auth`` (:func:`auth_scope`); this first line is
    published in the API's schema (``x-idempotency``).
    """
    auth = getattr(request, "auth", None)
    return user_scope(request) if auth is None else auth_scope(auth)


def _policy(options: Options, operation: Operation, *, authenticated: bool) -> Policy:
    """The operation's policy: its options and the settings, its own methods unless a
    ``methods`` option names others, and the scope of ``request.auth`` when ninja
    authenticated the request, unless a ``scope`` option names another."""
    return _operation_policy(options, frozenset(operation.methods), authenticated)


@derived
def _operation_policy(options: Options, methods: frozenset[str], authenticated: bool) -> Policy:
    policy = options.resolve()
    changes: dict[str, Any] = {}
    if options.get("methods") is None:
        changes["methods"] = methods - SAFE_METHODS
    if options.get("scope") is None and authenticated:
        changes["scope"] = _auth_scope
    return replace(policy, **changes) if changes else policy


def _options_of(operation: Operation) -> Options | None:
    """The options ``idempotent`` gave the operation's function (under other decorators'
    ``functools.wraps``); ``None``: the operation is not protected."""
    func: Any = operation.view_func
    while func is not None and not isinstance(getattr(func, "idempotency_options", None), Options):
        func = getattr(func, "__wrapped__", None)
    return None if func is None else func.idempotency_options


def _published_policy(operation: Operation) -> Policy | None:
    """The policy the operation's schema shows; ``None`` when it protects nothing."""
    options = _options_of(operation)
    if options is None or not conf.ENABLED:
        return None
    policy = _policy(options, operation, authenticated=bool(operation.auth_callbacks))
    return policy if any(policy.protects(method) for method in operation.methods) else None


def _operations(view: object) -> list[Operation] | None:
    """The operations behind what a URL of a ``NinjaAPI`` resolves to (ninja's ``PathView``
    makes one view function of a path's operations, which it closes over, or binds);
    ``None``: not a ninja view."""
    owners = [getattr(view, "__self__", None)]
    for cell in getattr(view, "__closure__", None) or ():
        with contextlib.suppress(ValueError):  # an empty cell
            owners.append(cell.cell_contents)
    for owner in owners:
        operations = getattr(owner, "operations", None)
        if isinstance(operations, list) and all(isinstance(op, Operation) for op in operations):
            return operations
    return None


def testing_options(view: object, method: str | None = None) -> Options | None:
    """For :mod:`django_idempotency.testing`: the options of the protected operation at a
    ninja URL's view (``method``'s, or the path's only protected one); ``None``: not a ninja
    view. ``ValueError`` when the path has no such operation."""
    operations = _operations(view)
    if operations is None:
        return None
    found = [
        (operation, options)
        for operation in operations
        if (method is None or method in operation.methods)
        and (options := _options_of(operation)) is not None
    ]
    if len({options for _, options in found}) != 1:
        methods = sorted({m for operation, _ in found for m in operation.methods})
        raise ValueError(
            f"{'No' if not found else 'More than one'} protected ninja operation answers "
            + (f"{method} here" if method else f"this path ({', '.join(methods)}): give the method")
            + "."
        )
    return found[0][1]


def testing_adapter(request: HttpRequest, view: object) -> protocol.HttpAdapter | None:
    """For :mod:`django_idempotency.testing`: the adapter of the ninja operation ``request``
    reaches through ``view`` (what its URL resolves to), with ``request.auth`` as ninja's
    authentication makes it unless the test set it; ``None``: not a ninja view. ``ValueError``
    for an operation that is not protected, or a request ninja's authentication refuses."""
    operations = _operations(view)
    if operations is None:
        return None
    method = request.method or ""
    operation = next((op for op in operations if method in op.methods), None)
    options = None if operation is None else _options_of(operation)
    if operation is None or options is None:
        raise ValueError(f"No protected ninja operation answers {method} {request.path}.")
    if getattr(request, "auth", None) is None and operation.auth_callbacks:
        refusal = operation._run_authentication(request)
        if inspect.isawaitable(refusal):  # an async operation's
            refusal = async_to_sync(_awaited)(refusal)
        if refusal is not None:
            raise ValueError(
                f"ninja's authentication refuses {method} {request.path} "
                f"({refusal.status_code}), so it would never claim a key: describe the "
                "request with the credentials the test sends (headers=...), or set "
                "request.auth."
            )
    return _Adapter(request, options, operation, {})


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


class _Adapter(protocol.HttpAdapter):
    """A request to a protected operation: its policy from the operation too, its result
    rendered by the operation before it is stored."""

    def __init__(
        self, request: HttpRequest, options: Options, operation: Operation, kwargs: dict[str, Any]
    ) -> None:
        super().__init__(request, options)
        self.operation = operation
        self.kwargs = kwargs

    def resolve(self, *, asynchronous: bool) -> Policy | None:
        protocol.refuse_nested(self.request)
        if conf.ENABLED:
            auth = getattr(self.request, "auth", None)
            authenticated = auth is not None
            policy = _policy(self.options, self.operation, authenticated=authenticated)
            if policy.protects(self.request.method):
                if policy.scope is _auth_scope and (refusal := _nobody(auth)) is not None:
                    raise ImproperlyConfigured(refusal)  # the misconfigured problem, unclaimed
                return protocol.answerable(policy)
        protocol.attach(self.request, None)
        return None

    def key_header(self) -> str | None:
        """Ninja's ``TestClient`` puts headers in ``META`` as given (``HTTP_Idempotency_Key``),
        where Django's handlers upper-case them; ``request.headers`` reads both spellings, and
        the request is left as it came."""
        header = super().key_header()
        return self.request.headers.get(conf.HEADER) if header is None else header

    def finish(self, attempt: Attempt, result: Any) -> HttpResponseBase:
        try:
            response = self._render(result)
        except Exception:  # a dying process (SystemExit...) is a crash: recovered later
            writing.release(attempt, reason="unrenderable result", raised=True)
            raise
        return super().finish(attempt, response)

    def _render(self, result: Any) -> HttpResponseBase:
        """The response ninja would make of ``result``, made now so that it can be stored."""
        operation = self.operation
        if operation.stream_format is not None:
            raise UnreplayableResponse(
                f"The ninja operation {operation.view_func.__qualname__} streams its response, "
                "which cannot be stored and replayed: remove @idempotent from it."
            )
        argument = operation.signature.response_arg
        temporal = self.kwargs.get(argument) if argument else None
        if temporal is None:
            temporal = operation.api.create_temporal_response(self.request)
        return operation._result_to_response(self.request, result, temporal)


def _wrap(func: Callable[..., Any], options: Options) -> Callable[..., Any]:
    def adapter(args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Adapter:
        request = protocol.http_request(args[0] if args else kwargs.get("request"))
        operation = getattr(request, _OPERATION, None)
        if not isinstance(operation, Operation):
            raise ImproperlyConfigured(
                f"{func.__qualname__} was called outside a ninja operation, which "
                f"django_idempotency.ninja.idempotent protects: {_PLACEMENT}."
            )
        return _Adapter(request, options, operation, kwargs)

    return lifecycle.wrap(
        func, adapter, label=func.__qualname__, kind="operation", atomic=options.atomic
    )


def _signature(func: Callable[..., Any]) -> inspect.Signature:
    """The function's signature with its parameters' annotations evaluated where it was
    written.

    Ninja reads a function's parameters from its signature but evaluates annotations written
    as strings (``from __future__ import annotations``) in the globals of the function it is
    given: the wrapper's, this module's, where the operation's schemas are unknown. One that
    cannot be evaluated (a name imported for type checkers only) is left for ninja to report;
    the return annotation is not ninja's business.
    """
    signature = inspect.signature(func)
    namespace = getattr(inspect.unwrap(func), "__globals__", {})
    parameters = []
    for parameter in signature.parameters.values():
        annotation = parameter.annotation
        if isinstance(annotation, str):
            with contextlib.suppress(Exception):
                # What inspect.signature(eval_str=True) does, one annotation at a time.
                annotation = eval(annotation, namespace)
        parameters.append(parameter.replace(annotation=annotation))
    return signature.replace(parameters=parameters, return_annotation=inspect.Signature.empty)


def _bind(run: Callable[..., Any], operation: Operation | None = None) -> Callable[..., Any]:
    """Wrap one operation's ``run`` (as ``decorate_view`` does, so that ninja does it again on
    each copy of the operation it mounts): the request learns its operation, and the schema
    the operation's policy."""
    operation = operation or _operation_of(run)
    openapi.publish(operation, _published_policy)
    if iscoroutinefunction(run):

        async def async_run(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            setattr(request, _OPERATION, operation)
            return await run(request, *args, **kwargs)

        return async_run

    def sync_run(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        setattr(request, _OPERATION, operation)
        return run(request, *args, **kwargs)

    return sync_run


def _operation_of(run: Callable[..., Any]) -> Operation:
    """The operation whose ``run`` this is, under the ``functools.wraps`` of other view
    decorators."""
    seen: Callable[..., Any] | None = run
    while seen is not None:
        owner = getattr(seen, "__self__", None)
        if isinstance(owner, Operation):
            return owner
        seen = getattr(seen, "__wrapped__", None)
    raise ImproperlyConfigured(
        f"{run!r} wraps a ninja operation's run without functools.wraps, so "
        "django_idempotency.ninja.idempotent cannot find the operation it protects."
    )


def _operation_being_decorated(func: Callable[..., Any]) -> Operation | None:
    """The operation ninja's ``add_decorator`` is decorating, if it is: its binding loop
    assigns ``operation.view_func = decorator(operation.view_func)``.

    Ninja gives a decorator nothing but the function; this is how the decorator tells
    ``add_decorator`` (the operation's function, being bound) from a place where ninja never
    calls it (above ``@api.post``, on a function that already is an operation).
    """
    frame = sys._getframe(1)
    for _ in range(4):
        frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            return None
        operation = frame.f_locals.get("operation")
        if isinstance(operation, Operation) and operation.view_func is func:
            return operation
    return None


def operations_router() -> Router:
    """A django-ninja ``Router`` serving the operation status endpoint (``GET
    operations/{operation_id}``, :doc:`operations`) and the principal's list (``GET
    operations/``), so that they are in your ``NinjaAPI``'s OpenAPI schema (operation ids
    ``idempotency_operation_status`` and ``idempotency_operation_list``, tag ``idempotency``:
    ``200`` with the state or a page, and their problems). Add it where you include
    ``django_idempotency.urls``, so that the schema's path is the ``Location`` clients are
    given: with the API at ``api/`` and ``path("api/idempotency/",
    include("django_idempotency.urls"))``, ``api.add_router("/idempotency/",
    operations_router())``. It answers as the status endpoint does (its own principal check:
    ``OPERATION_SCOPE_FUNCTION``, not the API's ``auth``). A new router per call: ninja attaches
    a router to one API."""
    published = operation_status_operation(PROBLEM_SCHEMA)
    router = Router(tags=published["tags"])

    @router.get(
        "/operations/{operation_id}",
        auth=None,
        operation_id=published["operationId"],
        description=published["description"],
        openapi_extra={"responses": published["responses"]},
        include_in_schema=True,
    )
    def idempotency_operation_status(request: HttpRequest, operation_id: str) -> HttpResponseBase:
        return operation_status(request, operation_id)

    listed = operation_list_operation(PROBLEM_SCHEMA)

    @router.get(
        "/operations/",
        auth=None,
        operation_id=listed["operationId"],
        description=listed["description"],
        openapi_extra={"parameters": listed["parameters"], "responses": listed["responses"]},
        include_in_schema=True,
    )
    def idempotency_operation_list(request: HttpRequest) -> HttpResponseBase:
        return operation_list(request)

    return router
