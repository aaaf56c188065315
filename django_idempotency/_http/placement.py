"""Where ``@idempotent`` may stand among a view's other decorators.

The scope is the principal the framework authenticated, so the claim must come after the
authentication and the refusals (``401``, ``403``, a redirect to the login page) that guard the
view. Above DRF's ``@api_view`` (or on an ``APIView``'s ``dispatch``), ``@idempotent`` would read
``request.user`` before DRF authenticated a token or Basic credentials: every caller's key
would be the anonymous scope's, and one user's response replayed to another. Above
``login_required`` (or ``permission_required``, ``user_passes_test``), a refused caller's
redirect would be claimed and stored. Each such order is refused where it is written, with the
order that works; DRF is looked up, never imported from here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from django.contrib.auth import decorators as auth_decorators
from django.core.exceptions import ImproperlyConfigured

__all__ = ["api_view_class", "refuse_misplaced"]

API_VIEW_ORDER = (
    "put @idempotent under @api_view (@api_view([...]) then @idempotent), where DRF has "
    "authenticated the request, or use IdempotencyMixin on a class-based view"
)
DISPATCH_ORDER = (
    "use IdempotencyMixin, or method_decorator(idempotent) on the handler (post, put...), "
    "which DRF calls after its authentication"
)


def refuse_misplaced(view: Callable[..., Any]) -> None:
    """``ImproperlyConfigured`` when ``view`` is one ``@idempotent`` must not wrap: a DRF view
    (``@api_view``, ``APIView.as_view()``, an ``APIView``'s ``dispatch`` through
    ``method_decorator``) or a view guarded by ``django.contrib.auth``'s decorators."""
    name = getattr(view, "__qualname__", None) or repr(view)
    for layer in _layers(view):
        if (cls := api_view_class(layer)) is not None:
            raise ImproperlyConfigured(
                "@idempotent is above @api_view (or a DRF view's as_view()) on "
                f"{cls.__module__}.{cls.__name__}: it "
                "would read the request's user before DRF's authentication, so every caller "
                f"would share the anonymous scope: {API_VIEW_ORDER}."
            )
        owner = getattr(layer, "__self__", None)
        if (
            owner is not None
            and getattr(layer, "__name__", None) == "dispatch"
            and _is_api_view(type(owner))
        ):
            raise ImproperlyConfigured(
                f"@idempotent is on the dispatch of the DRF view {type(owner).__qualname__}, "
                "which runs before DRF's authentication, so every caller would share the "
                f"anonymous scope: {DISPATCH_ORDER}."
            )
        if _auth_guard(layer):
            raise ImproperlyConfigured(
                f"@idempotent is above login_required (or permission_required, "
                f"user_passes_test) on {name}: a refused caller's redirect or 403 would be "
                "claimed and stored. Put @login_required above @idempotent, so that it refuses "
                "before a key is claimed."
            )


def api_view_class(view: object) -> type | None:
    """The DRF ``APIView`` class behind a view function (``@api_view``'s, ``as_view()``'s),
    else ``None``."""
    view_class = getattr(view, "cls", None) or getattr(view, "view_class", None)
    return view_class if isinstance(view_class, type) and _is_api_view(view_class) else None


def _is_api_view(cls: type) -> bool:
    views = sys.modules.get("rest_framework.views")
    return views is not None and issubclass(cls, views.APIView)


def _layers(view: object) -> Iterator[object]:
    """``view`` and what it wraps (``functools.wraps``' ``__wrapped__``, a partial's function:
    ``method_decorator`` decorates a partial of the bound method)."""
    seen: set[int] = set()
    layer: object = view
    while layer is not None and id(layer) not in seen:
        seen.add(id(layer))
        yield layer
        layer = layer.func if isinstance(layer, partial) else getattr(layer, "__wrapped__", None)


def _auth_guard(view: object) -> bool:
    """Whether ``view`` is the wrapper ``django.contrib.auth``'s ``user_passes_test`` makes
    (``login_required``, ``permission_required``): it carries no mark but its code's."""
    code = getattr(view, "__code__", None)
    return (
        code is not None
        and code.co_name == "_view_wrapper"
        and code.co_filename == auth_decorators.__file__
    )
