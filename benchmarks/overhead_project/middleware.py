"""The benchmark's authentication: one indexed query per request, as a token lookup costs.

``Authorization: Bearer <username>`` names the user; the protected views' keys are then scoped
to that user, as most real API keys are.
"""

from __future__ import annotations

from collections.abc import Callable

from django.contrib.auth.models import AnonymousUser, User
from django.http import HttpRequest, HttpResponse
from django.utils.functional import SimpleLazyObject


def bearer_user(get_response: Callable[[HttpRequest], HttpResponse]) -> Callable[..., HttpResponse]:
    def middleware(request: HttpRequest) -> HttpResponse:
        scheme, _, username = request.headers.get("Authorization", "").partition(" ")
        if scheme == "Bearer" and username:
            request.user = User.objects.get(username=username)
        else:
            request.user = AnonymousUser()
        return get_response(request)

    return middleware


def lazy_bearer_user(
    get_response: Callable[[HttpRequest], HttpResponse],
) -> Callable[..., HttpResponse]:
    """The same, read only when something reads ``request.user`` (as Django's own
    ``AuthenticationMiddleware`` does): ``overhead.py --auth lazy`` (issue 42)."""

    def middleware(request: HttpRequest) -> HttpResponse:
        scheme, _, username = request.headers.get("Authorization", "").partition(" ")
        if scheme == "Bearer" and username:
            request.user = SimpleLazyObject(lambda: User.objects.get(username=username))
        else:
            request.user = AnonymousUser()
        return get_response(request)

    return middleware
