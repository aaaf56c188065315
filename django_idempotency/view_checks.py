"""System checks over the protected views the URLconf reaches.

A view's options are checked against the settings as early as the settings themselves: a TTL
shorter than the lock timeout lets a duplicate take over a record whose owner still runs, and
both execute (issue 20). Options given together (``ttl`` and ``lock_timeout`` on one view) are
refused at once, when the decorator or the class is made; this check covers one given and the
other from the settings.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.core.checks import CheckMessage, Error
from django.urls import URLPattern, URLResolver, get_resolver

from django_idempotency.options import Options, ttl_under_lock

HINT = "Give the view a ttl at least as long as its lock_timeout (docs: 'Settings')."


def check_views(**kwargs: Any) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    seen: set[str] = set()
    for name, found in _protected_views():
        if name in seen:
            continue
        seen.add(name)
        options = found() if callable(found) else found
        if error := ttl_under_lock(options):
            errors.append(Error(f"{name}: {error}", hint=HINT, id="django_idempotency.E030"))
    return errors


def _protected_views() -> Iterator[tuple[str, Any]]:
    """(name, Options or a callable building them) for every protected view in the URLconf."""
    try:
        patterns = get_resolver().url_patterns
    except Exception:  # a broken URLconf is reported by Django's own checks
        return
    for callback in _callbacks(patterns):
        options = getattr(callback, "idempotency_options", None)
        view_class = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
        if options is None and view_class is not None:
            options = getattr(view_class, "get_idempotency_options", None)
            options = options or getattr(view_class.dispatch, "idempotency_options", None)
        if isinstance(options, Options) or callable(options):
            name = getattr(view_class or callback, "__qualname__", repr(callback))
            yield f"{getattr(view_class or callback, '__module__', '')}.{name}", options


def _callbacks(patterns: Any) -> Iterator[Any]:
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _callbacks(pattern.url_patterns)
        elif isinstance(pattern, URLPattern):
            yield pattern.callback
