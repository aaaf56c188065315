"""The operation status endpoint authenticated as a DRF view would be: imported
only when DRF is installed; it imports DRF and nothing of the app (no import cycle)."""

from __future__ import annotations

from typing import cast

from django.http import HttpRequest
from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import APIException
from rest_framework.request import Request
from rest_framework.settings import api_settings

__all__ = ["authenticate"]


def authenticate(request: HttpRequest) -> bool:
    """Authenticate a plain view's ``request`` as a DRF view with the default authentication
    classes would (the operation status endpoint): a token's user becomes
    ``request.user``. ``False``: credentials were sent and refused. A request none of them
    authenticates keeps the user Django's middleware gave it (a session)."""
    before = getattr(request, "user", None)
    classes = cast("list[type[BaseAuthentication]]", api_settings.DEFAULT_AUTHENTICATION_CLASSES)
    wrapped = Request(request, authenticators=[auth() for auth in classes])
    try:
        user = wrapped.user
    except APIException:
        return False
    if before is not None and not getattr(user, "is_authenticated", False):
        request.user = before
    return True
