"""Scope functions: whose keys a request's key belongs to.

A scope function takes the request and returns a short string. Two principals' keys never meet:
the same key under two scopes is two records.
"""

from __future__ import annotations

from django.http import HttpRequest

__all__ = ["user_scope"]

ANONYMOUS_SCOPE = "anonymous"


def user_scope(request: HttpRequest) -> str:
    """Each authenticated user has their own keys; anonymous requests share one scope.

    The scope is the user's primary key. The first line above is published in the API's
    schema (``x-idempotency``). Anonymous clients share a scope, so their keys must be
    unguessable (UUID4 or better).
    """
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return f"user:{user.pk}"
    return ANONYMOUS_SCOPE
