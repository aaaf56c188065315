"""Where ``@idempotent`` may stand among a view's other decorators.

The scope is the principal the framework authenticated, so the claim must come after the
authentication and the refusals (``401``, ``403``, a redirect to the login page) that guard the
view. Above DRF's ``@api_view`` (or on an ``APIView``'s ``dispatch``), ``@idempotent`` would read
``request.user`` before DRF authenticated a token or Basic credentials: every caller's key
would be the anonymous scope's, and one user's response replayed to another. Above
``login_required`` (or ``permission_required``, ``user_passes_test``, an ``AccessMixin`` such as
``LoginRequiredMixin``), a refused caller's redirect would be claimed and stored. Each such order
is refused where it is written, with the order that works: a function view's when it is
decorated (at import); ``method_decorator`` decorates a method anew at each call, so a class's at
its first request, and by system check E035 at startup. DRF is looked up, never imported from
here, nor ``django.contrib.auth``'s modules (which need the app registry): a view that uses one
has imported it.

On a django-ninja operation the plain ``@idempotent`` is refused too, whichever way ninja gets
it: ninja calls the function with its parsed arguments and renders what it returns (a ``dict``,
a schema) afterwards, so nothing could be stored and each retry would run the operation again.
Ninja's own hook (``_ninja_contribute_to_operation``) refuses it when ``@api.post`` makes the
operation (at import); ``add_decorator`` when ``api.urls`` binds it; and, for a wrapper that
hid the hook, the view's first call finds ``Operation.run`` among its callers, before the claim.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from functools import partial
from types import FrameType
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils import decorators as django_decorators

__all__ = [
    "api_view_class",
    "misplaced_dispatch",
    "refuse_misplaced",
    "refuse_ninja_caller",
    "refuse_ninja_operation",
    "refuse_plain_view_mixin",
]

API_VIEW_ORDER = (
    "put @idempotent under @api_view (@api_view([...]) then @idempotent), where DRF has "
    "authenticated the request, or use IdempotencyMixin on a class-based view"
)
DISPATCH_ORDER = (
    "use IdempotencyMixin, or method_decorator(idempotent) on the handler (post, put...), "
    "which DRF calls after its authentication"
)
LOGIN_ORDER = (
    "put login_required (or permission_required, user_passes_test) above @idempotent "
    "(method_decorator([login_required, idempotent], name='dispatch') on a class, with an "
    "AccessMixin such as LoginRequiredMixin before the class whose dispatch is decorated), "
    "so that it refuses before a key is claimed"
)
NINJA = (
    "django_idempotency.idempotent is on the django-ninja operation {name}: ninja calls it with "
    "its parsed arguments and renders what it returns afterwards, so its response could not be "
    "stored and each retry would run it again. Use django_idempotency.ninja.idempotent "
    "(from django_idempotency.ninja import idempotent), under the operation's decorator."
)
CSRF_ORDER = (
    "put csrf_protect above @idempotent (method_decorator([csrf_protect, idempotent], "
    "name='dispatch') on a class), so that it refuses before a key is claimed"
)


def refuse_misplaced(view: Callable[..., Any]) -> None:
    """``ImproperlyConfigured`` when ``view`` is one ``@idempotent`` must not wrap: a DRF view
    (``@api_view``, ``APIView.as_view()``, an ``APIView``'s ``dispatch`` through
    ``method_decorator``) or a view guarded by ``django.contrib.auth``'s decorators or
    mixins."""
    name = getattr(view, "__qualname__", None) or repr(view)
    if (operation := _ninja_operation(view, sys._getframe(1))) is not None:
        refuse_ninja_operation(operation)
    for layer in _layers(view):
        if (cls := api_view_class(layer)) is not None:
            raise ImproperlyConfigured(
                f"@idempotent is above @api_view (or a DRF view's as_view()) on "
                f"{cls.__module__}.{cls.__name__}: it would read the request's user before "
                f"DRF's authentication, so every caller would share the anonymous scope: "
                f"{API_VIEW_ORDER}."
            )
        owner = getattr(layer, "__self__", None)
        if owner is not None and getattr(layer, "__name__", None) == "dispatch":
            if _is_api_view(type(owner)):
                raise ImproperlyConfigured(
                    f"@idempotent is on the dispatch of the DRF view "
                    f"{type(owner).__qualname__}, which runs before DRF's authentication, so "
                    f"every caller would share the anonymous scope: {DISPATCH_ORDER}."
                )
            if _access_mixin_inside(type(owner), getattr(layer, "__func__", None)):
                raise ImproperlyConfigured(
                    f"@idempotent is on the dispatch of {type(owner).__qualname__}, around its "
                    f"AccessMixin (LoginRequiredMixin...): a refused caller's redirect or 403 "
                    f"would be claimed and stored: {LOGIN_ORDER}."
                )
        view_class = getattr(layer, "view_class", None)
        if isinstance(view_class, type) and _is_access_mixin(view_class):
            raise ImproperlyConfigured(
                f"@idempotent is above {view_class.__qualname__}.as_view(), whose AccessMixin "
                f"(LoginRequiredMixin...) refuses callers: a refused caller's redirect or 403 "
                f"would be claimed and stored: {LOGIN_ORDER}."
            )
        if _auth_guard(layer):
            raise ImproperlyConfigured(
                f"@idempotent is above login_required (or permission_required, "
                f"user_passes_test) on {name}: a refused caller's redirect or 403 would be "
                f"claimed and stored: {LOGIN_ORDER}."
            )
        if _csrf_guard(layer):
            raise ImproperlyConfigured(
                f"@idempotent is above csrf_protect on {name}: a request it refuses (403, "
                f"CSRF verification failed) would be claimed and stored, and replayed to the "
                f"retry with a valid token: {CSRF_ORDER}."
            )


def refuse_plain_view_mixin(cls: type) -> None:
    """``ImproperlyConfigured`` when ``IdempotencyMixin`` is on a Django ``View`` that is not
    a DRF ``APIView``: the mixin claims in ``initial()``, which only DRF's dispatch calls, so
    such a view would run with nothing claimed."""
    base = sys.modules.get("django.views.generic.base")
    if base is None or not issubclass(cls, base.View) or _is_api_view(cls):
        return
    raise ImproperlyConfigured(
        f"IdempotencyMixin is on {cls.__module__}.{cls.__qualname__}, a Django View that is "
        "not a DRF APIView: the mixin claims in DRF's initial(), which a plain View never "
        "calls, so nothing would be claimed. Use "
        "method_decorator(idempotent, name='dispatch') on a plain View (or on its post, put...)."
    )


def misplaced_dispatch(cls: type) -> str | None:
    """Why ``@idempotent`` on ``cls``'s ``dispatch`` (through ``method_decorator``) runs before
    the framework's authentication or refusals, and the order that works; ``None``: it does
    not (system check E035)."""
    for index, owner in enumerate(cls.__mro__):
        dispatch = owner.__dict__.get("dispatch")
        if dispatch is None or getattr(dispatch, "idempotency_options", None) is None:
            continue
        if _is_api_view(cls):
            return (
                "@idempotent is on the dispatch of a DRF view, before DRF's authentication: "
                f"every caller would share the anonymous scope. {_sentence(DISPATCH_ORDER)}"
            )
        if any(_is_access_mixin(later) for later in cls.__mro__[index:]):
            return (
                "@idempotent is on a dispatch around an AccessMixin (LoginRequiredMixin...): a "
                f"refused caller's redirect or 403 would be claimed and stored. "
                f"{_sentence(LOGIN_ORDER)}"
            )
        for layer in _under_idempotent(dispatch):
            if _auth_guard(layer):
                return (
                    "@idempotent is on a dispatch above login_required (or "
                    "permission_required, user_passes_test): a refused caller's redirect or "
                    f"403 would be claimed and stored. {_sentence(LOGIN_ORDER)}"
                )
            if _csrf_guard(layer):
                return (
                    "@idempotent is on a dispatch above csrf_protect: a request it refuses "
                    f"(403) would be claimed and stored. {_sentence(CSRF_ORDER)}"
                )
        return None
    return None


def _under_idempotent(dispatch: object) -> Iterator[object]:
    """What ``@idempotent`` wraps in a ``dispatch`` that ``method_decorator`` decorated: the
    decorators applied before it (inside it) and the method under them, layer by layer, as
    :func:`refuse_misplaced` sees them at the first request."""
    method: object = dispatch
    while (cells := _multi_decorated(getattr(method, "__func__", method))) is not None:
        decorators = list(cells.get("decorators") or ())  # applied in this order: inner first
        index = next((i for i, dec in enumerate(decorators) if _is_idempotent(dec)), None)
        method = cells.get("method")
        if index is not None:
            for inner in [*decorators[:index], method]:
                yield from _layers(inner)
            return


def _is_idempotent(decorator: object) -> bool:
    """Whether ``decorator`` is ``idempotent`` (bare, or as ``idempotent(...)`` made it)."""
    return getattr(decorator, "__module__", None) == "django_idempotency._http.decorators"


def _sentence(order: str) -> str:
    return f"{order[:1].upper()}{order[1:]}."


def api_view_class(view: object) -> type | None:
    """The DRF ``APIView`` class behind a view function (``@api_view``'s, ``as_view()``'s),
    else ``None``."""
    view_class = getattr(view, "cls", None) or getattr(view, "view_class", None)
    return view_class if isinstance(view_class, type) and _is_api_view(view_class) else None


def _is_api_view(cls: type) -> bool:
    views = sys.modules.get("rest_framework.views")
    return views is not None and issubclass(cls, views.APIView)


def _layers(view: object) -> Iterator[object]:
    """``view`` and what it wraps: ``functools.wraps``' ``__wrapped__``, a partial's function
    (``method_decorator`` decorates a partial of the bound method), and for a method that
    ``method_decorator`` decorated, the decorators it applies at each call (as functions of
    theirs: what each decorator's code is) and the method under them."""
    seen: set[int] = set()
    pending: list[object] = [view]
    while pending:
        layer = pending.pop()
        if layer is None or id(layer) in seen:
            continue
        seen.add(id(layer))
        yield layer
        if isinstance(layer, partial):
            pending.append(layer.func)
            continue
        cells = _multi_decorated(getattr(layer, "__func__", layer))
        if cells is not None:
            pending.extend(cells.get("decorators") or ())
            pending.append(cells.get("method"))
        else:
            pending.append(getattr(layer, "__wrapped__", None))


def _multi_decorated(function: object) -> dict[str, Any] | None:
    """The closure (``decorators``, ``method``) of a method ``method_decorator`` made, else
    ``None``."""
    code = getattr(function, "__code__", None)
    if code is None or code.co_filename != django_decorators.__file__:
        return None
    cells = _cells(function)
    return cells if "method" in cells else None


def _cells(function: object) -> dict[str, Any]:
    """The values of ``function``'s closure, by name (none for what is not a function)."""
    code = getattr(function, "__code__", None)
    cells: dict[str, Any] = {}
    closure = getattr(function, "__closure__", None) or ()
    for name, cell in zip(getattr(code, "co_freevars", ()), closure, strict=False):
        try:
            cells[name] = cell.cell_contents
        except ValueError:  # an empty cell
            continue
    return cells


def _auth_guard(view: object) -> bool:
    """Whether ``view`` is ``django.contrib.auth``'s ``login_required``, ``permission_required``
    or ``user_passes_test``, one of the decorators they make, or the wrapper those make (none
    carries a mark but its code's); ``login_not_required`` guards nothing."""
    code = getattr(view, "__code__", None)
    module = sys.modules.get("django.contrib.auth.decorators")
    return (
        code is not None
        and module is not None
        and code.co_filename == module.__file__
        and code.co_name != "login_not_required"
    )


def _csrf_guard(view: object) -> bool:
    """Whether ``view`` is ``csrf_protect`` or the wrapper it makes (Django's middleware
    decorator around ``CsrfViewMiddleware``, whose rejection is not overridden as
    ``requires_csrf_token``'s and ``ensure_csrf_cookie``'s are), unless the view it wraps is
    ``csrf_exempt``."""
    function = getattr(view, "__func__", view)
    code = getattr(function, "__code__", None)
    csrf = sys.modules.get("django.middleware.csrf")
    if code is None or csrf is None or code.co_filename != django_decorators.__file__:
        return False
    cells = _cells(function)
    middleware_class = cells.get("middleware_class")  # csrf_protect itself
    if middleware_class is None:  # the wrapper csrf_protect made of a view
        if getattr(cells.get("view_func"), "csrf_exempt", False):
            return False
        middleware = _cells(cells.get("_pre_process_request")).get("middleware")
        middleware_class = None if middleware is None else type(middleware)
    return (
        isinstance(middleware_class, type)
        and issubclass(middleware_class, csrf.CsrfViewMiddleware)
        and getattr(middleware_class, "_reject", None) is csrf.CsrfViewMiddleware._reject
    )


def _is_access_mixin(cls: type) -> bool:
    mixins = sys.modules.get("django.contrib.auth.mixins")
    return mixins is not None and issubclass(cls, mixins.AccessMixin)


def _access_mixin_inside(cls: type, dispatch: object) -> bool:
    """Whether the class whose ``dispatch`` ``method_decorator`` decorated (with ``dispatch``
    as the method under it) reaches an ``AccessMixin``'s ``dispatch`` from inside it: the
    mixin comes after that class in ``cls``'s MRO."""
    mro = cls.__mro__
    for index, owner in enumerate(mro):
        cells = _multi_decorated(owner.__dict__.get("dispatch"))
        if cells is not None and _unwrapped(cells.get("method")) is _unwrapped(dispatch):
            return any(_is_access_mixin(later) for later in mro[index:])
    return False


def _unwrapped(method: object) -> object:
    """The function under ``method_decorator``'s wrappers of one method."""
    seen: set[int] = set()
    while (cells := _multi_decorated(method)) is not None and id(method) not in seen:
        seen.add(id(method))
        method = cells.get("method")
    return method


def refuse_ninja_operation(operation: Any) -> None:
    """Ninja's ``_ninja_contribute_to_operation`` hook, which ninja calls when ``@api.post``
    (or a router's) makes an operation of a function the plain ``@idempotent`` decorated."""
    view = getattr(operation, "view_func", None)
    raise ImproperlyConfigured(
        NINJA.format(name=getattr(view, "__qualname__", None) or repr(operation))
    )


def refuse_ninja_caller(view: object, frame: FrameType | None) -> None:
    """``ImproperlyConfigured`` when ``frame`` (the decorated view's caller) or one of the few
    above it runs a django-ninja operation (``Operation.run``): checked once per view, at its
    first call, for a wrapper above ``@idempotent`` that hid ninja's hook."""
    operation = sys.modules.get("ninja.operation")
    if operation is None:
        return
    runs = {operation.Operation.run.__code__, operation.AsyncOperation.run.__code__}
    for _ in range(_CALLERS):
        if frame is None:
            return
        if frame.f_code in runs:
            name = getattr(view, "__qualname__", None) or repr(view)
            raise ImproperlyConfigured(NINJA.format(name=name))
        frame = frame.f_back


#: How many frames above a view's wrapper may stand between it and ``Operation.run``: other
#: decorators' wrappers.
_CALLERS = 6


def _ninja_operation(view: object, frame: FrameType | None) -> Any:
    """The django-ninja operation ``view`` is being bound to, if it is: ``add_decorator`` in
    view mode decorates the operation's ``run`` (a method of it), in operation mode its
    function, in a loop whose ``operation`` is the operation (``frame``: the decorator's)."""
    module = sys.modules.get("ninja.operation")
    if module is None:
        return None
    owner = getattr(view, "__self__", None)
    if isinstance(owner, module.Operation):
        return owner
    for _ in range(_CALLERS):
        if frame is None:
            return None
        operation = frame.f_locals.get("operation")
        if isinstance(operation, module.Operation) and operation.view_func is view:
            return operation
        frame = frame.f_back
    return None
