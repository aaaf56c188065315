"""The ``@idempotent`` view decorator."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar, overload

from django.http import HttpResponseBase

from django_idempotency import _http as protocol
from django_idempotency import _lifecycle as lifecycle
from django_idempotency._options import VIEW_OPTIONS, Options, ViewOptions

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
    views (``atomic=True`` needs a sync view: Django transactions are sync).
    """
    built = Options.build(VIEW_OPTIONS, "idempotent", **options)

    def decorate(view: ViewFunc) -> ViewFunc:
        asynchronous = lifecycle.is_async(view, view.__qualname__, "view", atomic=built.atomic)
        wrapper = (_async_wrapper if asynchronous else _sync_wrapper)(view, built)
        wrapper.idempotency_options = built  # type: ignore[attr-defined]
        return wraps(view)(wrapper)  # type: ignore[return-value]

    return decorate if view is None else decorate(view)


def _sync_wrapper(view: Callable[..., HttpResponseBase], options: Options) -> Callable[..., Any]:
    def wrapper(request: Any, *args: Any, **kwargs: Any) -> HttpResponseBase:
        http_request = protocol.http_request(request)
        policy = protocol.protecting(options, http_request)
        if policy is None:
            return view(request, *args, **kwargs)
        return lifecycle.run(
            protocol.HttpAdapter(http_request), policy, lambda _: view(request, *args, **kwargs)
        )

    return wrapper


def _async_wrapper(view: Callable[..., Any], options: Options) -> Callable[..., Any]:
    async def wrapper(request: Any, *args: Any, **kwargs: Any) -> HttpResponseBase:
        http_request = protocol.http_request(request)
        policy = protocol.protecting(options, http_request)
        if policy is None:
            return await view(request, *args, **kwargs)  # type: ignore[no-any-return]
        return await lifecycle.arun(
            protocol.HttpAdapter(http_request), policy, lambda _: view(request, *args, **kwargs)
        )

    return wrapper
