"""The benchmark's authentication: one indexed query per request, as a token lookup costs.

``Authorization: Bearer <username>`` names the user; the protected views' keys are then scoped
to that user, as most real API keys are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.contrib.auth.models import AnonymousUser, User
from django.http import HttpRequest, HttpResponse
from django.utils.decorators import sync_and_async_middleware
from django.utils.functional import SimpleLazyObject


@sync_and_async_middleware
def bearer_user(get_response: Callable[[HttpRequest], Any]) -> Callable[..., Any]:
    """Sync under WSGI; async under ASGI (benchmarks/scale.py's uvicorn), so that an async
    view's request never crosses to a thread and back for its user."""
    if iscoroutinefunction(get_response):

        async def async_middleware(request: HttpRequest) -> HttpResponse:
            username = _bearer(request)
            request.user = (
                await User.objects.aget(username=username) if username else AnonymousUser()
            )
            return await get_response(request)  # type: ignore[no-any-return]

        return async_middleware

    def middleware(request: HttpRequest) -> HttpResponse:
        username = _bearer(request)
        request.user = User.objects.get(username=username) if username else AnonymousUser()
        return get_response(request)  # type: ignore[no-any-return]

    return middleware


def _bearer(request: HttpRequest) -> str:
    scheme, _, username = request.headers.get("Authorization", "").partition(" ")
    return username if scheme == "Bearer" else ""


def lazy_bearer_user(
    get_response: Callable[[HttpRequest], HttpResponse],
) -> Callable[..., HttpResponse]:
    """The same, read only when something reads ``request.user`` (as Django's own
    ``AuthenticationMiddleware`` does): ``overhead.py --auth lazy`` (issue 42)."""

    def middleware(request: HttpRequest) -> HttpResponse:
        username = _bearer(request)
        if username:
            request.user = SimpleLazyObject(lambda: User.objects.get(username=username))
        else:
            request.user = AnonymousUser()
        return get_response(request)

    return middleware
