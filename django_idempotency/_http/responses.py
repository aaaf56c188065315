"""Turning a view's response into a stored record and back, byte for byte."""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import timedelta
from typing import Any

from django.http import HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.http.response import FileResponse

from django_idempotency._base.errors import UnreplayableResponse
from django_idempotency._conf.values import NEVER_STORED
from django_idempotency._store.writes import StoredResponse as StoredResponse

REPLAYED_HEADER = "Idempotent-Replayed"


def check_replayable(response: HttpResponseBase) -> None:
    if not isinstance(response, HttpResponseBase):
        # The view ran; its claim is released, so a retry runs it again: said so, not an
        # AttributeError.
        raise UnreplayableResponse(
            f"An idempotent view returned a {type(response).__name__}, not an HttpResponse: it "
            "ran, but there is no response to store, so its key was released and a retry with "
            "the same key runs it again. Return an HttpResponse; on a django-ninja operation "
            "use django_idempotency.ninja.idempotent."
        )
    if isinstance(response, (StreamingHttpResponse, FileResponse)) or response.streaming:
        raise UnreplayableResponse(
            f"An idempotent view returned a {type(response).__name__}; streaming responses "
            "cannot be stored and replayed. Return a regular HttpResponse, or remove the "
            "idempotency protection from this view."
        )


def needs_deferred_render(response: HttpResponseBase) -> bool:
    """A DRF ``Response`` returned below ``@api_view`` has no renderer yet: store it later."""
    return (
        not getattr(response, "is_rendered", True)
        and hasattr(response, "data")
        and getattr(response, "accepted_renderer", None) is None
    )


def finalize(response: HttpResponseBase, request: Any) -> bool:
    """Give a DRF ``Response`` returned below ``@api_view`` its renderer now, as the view's
    ``finalize_response()`` will (a second call there changes nothing): atomic mode stores it
    inside the view's transaction, before DRF's dispatch returns. ``request`` is the view's
    first argument, DRF's ``Request``, whose parser context names the view; ``False``: no view
    to ask."""
    context = getattr(request, "parser_context", None) or {}
    view = context.get("view")
    if view is None or not hasattr(view, "finalize_response"):
        return False
    view.finalize_response(request, response, *context.get("args", ()), **context.get("kwargs", {}))
    return True


def render(response: HttpResponseBase) -> None:
    if not getattr(response, "is_rendered", True):
        response.render()  # type: ignore[attr-defined]


def capture(
    response: HttpResponseBase,
    allowed: Collection[str],
    max_body: int,
    ttl: timedelta | None = None,
    owner: tuple[str, str] | None = None,
) -> StoredResponse:
    """What a record keeps of ``response``, for the record of ``owner`` (scope, key hash)."""
    assert isinstance(response, HttpResponse)
    headers = [
        [name, value]
        for name, value in response.items()
        if name.lower() in allowed and name.lower() not in NEVER_STORED
    ]
    body = response.content
    kept = body if len(body) <= max_body else None
    return StoredResponse(response.status_code, headers, kept, ttl, owner)


def replay(status: int, headers: list[list[str]], body: bytes) -> HttpResponse:
    """The stored response again. Its headers are given to the constructor, which sets them
    as ``response[name] = value`` would, in order (checked as any header is), and makes no
    default ``Content-Type`` for the stored one to replace."""
    return HttpResponse(bytes(body), status=status, headers=[*headers, _REPLAYED])


_REPLAYED = (REPLAYED_HEADER, "true")


def add_post_render_callback(
    response: HttpResponseBase, callback: Callable[[HttpResponseBase], Any]
) -> None:
    response.add_post_render_callback(callback)  # type: ignore[attr-defined]
