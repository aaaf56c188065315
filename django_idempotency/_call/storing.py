"""A view's or a function's say over its own stored result: :func:`no_store` and
:func:`store_for`, exported by the package.

Some results must not be replayed (a one-time download link, a short-lived token), or only for
a while. A response is marked with a private attribute and returned as is, so a view returns it
whether or not its request is protected (no key, a safe method, ``ENABLED`` off), and the mark
survives DRF's ``finalize_response()`` and rendering, which keep the same object. A function's
result may be ``None`` or an ``int``, which carry no attributes: it is wrapped instead, and
``idempotent_function`` unwraps it, so the function's caller always gets the plain value.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, TypeVar, cast

from django.http import HttpResponseBase

from django_idempotency._base import durations
from django_idempotency._base.durations import Duration

T = TypeVar("T")

#: The attribute a marked response carries its :class:`Storage` in.
_ATTRIBUTE = "_idempotency_storage"


@dataclass(frozen=True)
class Storage:
    """How one result is stored, where the view or function said so."""

    #: ``False``: not at all; the key is released, as for a ``5xx``.
    stored: bool
    #: The result's own TTL, counted from when it is stored (``None``: the policy's).
    ttl: timedelta | None = None


NOT_STORED = Storage(stored=False)
#: The ``reason`` of the release (log line, ``key_released`` signal) when a result was marked.
NO_STORE_REASON = "no_store"


@dataclass(frozen=True)
class Marked(Generic[T]):
    """A function's result marked by :func:`no_store` or :func:`store_for`."""

    value: T
    storage: Storage


def no_store(response: T) -> T:
    """Do not store this response: the key is released (as for a ``5xx``) and the client's
    retry runs the view again. The response itself is returned to the client as is.

    Returns the response, marked. From an ``idempotent_function``, pass the function's result
    and return what this returns; the function's caller receives the plain result.
    """
    return _mark(response, NOT_STORED)


def store_for(response: T, ttl: Duration) -> T:
    """Store this response for ``ttl`` (a ``timedelta`` or seconds) instead of the view's TTL.

    The TTL counts from when the result is stored, so it may be shorter than ``lock_timeout``:
    the record is complete by then and ``expires_at`` is never before it is written. Raises
    ``TypeError`` or ``ValueError`` here, at the call, for a TTL that is not a positive
    duration. Returns the response, marked; from an ``idempotent_function`` as for
    :func:`no_store`.
    """
    return _mark(response, Storage(stored=True, ttl=durations.positive(ttl, "store_for() ttl")))


def _mark(result: T, storage: Storage) -> T:
    """Mark a response in place, or wrap a function's result; the last mark decides."""
    if isinstance(result, HttpResponseBase):
        setattr(result, _ATTRIBUTE, storage)
        return result
    if isinstance(result, Marked):
        result = result.value
    # Typed as the result itself: the wrapper is only ever returned to idempotent_function,
    # which unwraps it, so the function's declared return type is what its callers get.
    return cast(T, Marked(result, storage))


def storage(response: Any) -> Storage | None:
    """A response's mark; ``None``: stored as the policy says."""
    return getattr(response, _ATTRIBUTE, None)


def unwrap(result: Any) -> tuple[Any, Storage | None]:
    """A function's plain result and its mark."""
    if isinstance(result, Marked):
        return result.value, result.storage
    return result, storage(result)


def plain(result: Any) -> Any:
    """A function's result as its caller gets it, marked or not."""
    return unwrap(result)[0]
