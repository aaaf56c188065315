"""The ``@idempotent`` view decorator."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar, overload

from django_idempotency._call import lifecycle
from django_idempotency._conf.options import (
    VIEW_OPTIONS,
    Options,
    ViewOptions,
    refuse_unstorable,
)
from django_idempotency._http import adapter as protocol
from django_idempotency._http.placement import refuse_misplaced, refuse_ninja_operation

__all__ = ["idempotent"]

ViewFunc = TypeVar("ViewFunc", bound=Callable[..., Any])

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack: Python 3.11


@overload
def idempotent(view: ViewFunc) -> ViewFunc: ...


@overload
def idempotent(
    view: None = None, **options: Unpack[ViewOptions]
) -> Callable[[ViewFunc], ViewFunc]: ...


def idempotent(
    view: ViewFunc | None = None, **options: Unpack[ViewOptions]
) -> ViewFunc | Callable[[ViewFunc], ViewFunc]:
    """Protect a view with the ``Idempotency-Key`` header: its side effects run once per key.

    Usable bare (``@idempotent``) or with options (:ref:`view-options`), which override
    ``settings.IDEMPOTENCY`` for this view; a bad one is ``ImproperlyConfigured`` here. Works on
    function views, on ``View.dispatch`` through ``method_decorator``, and on ``async def``
    views (``atomic=True`` needs a sync view: Django transactions are sync). It goes under
    the decorators that authenticate or refuse the request (``@api_view``, ``login_required``):
    above them it is ``ImproperlyConfigured`` (:mod:`.placement`), as it is on a django-ninja
    operation, which needs :func:`django_idempotency.ninja.idempotent`.
    """
    built = Options.build(VIEW_OPTIONS, "idempotent", **options)

    def decorate(view: ViewFunc) -> ViewFunc:
        refuse_misplaced(view)
        refuse_unstorable(built, f"{view.__module__}.{view.__qualname__}")
        wrapper = lifecycle.wrap(
            view,
            protocol.view_adapter(built, view),
            label=view.__qualname__,
            kind="view",
            atomic=built.atomic,
        )
        wrapper.idempotency_options = built  # type: ignore[attr-defined]
        wrapped = wraps(view)(wrapper)
        # Ninja calls this when @api.post makes an operation of the view: refused at import.
        # A new list: wraps() shares the view's own.
        hooks = getattr(wrapped, "_ninja_contribute_to_operation", None) or []
        wrapped._ninja_contribute_to_operation = [*hooks, refuse_ninja_operation]  # type: ignore[attr-defined]
        return wrapped  # type: ignore[return-value]

    return decorate if view is None else decorate(view)
