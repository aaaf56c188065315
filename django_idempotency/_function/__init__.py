"""``idempotent_function``: exactly-once effects for message consumers and background tasks.

The same record and state machine as the ``@idempotent`` view decorator, keyed by a message id
or a provider's event id instead of a header. See ``docs/consumers.rst``.

Owns the function side, a sibling of :mod:`.._http`: the decorator (here), its adapter
(:mod:`.calls`: a call's identity from its arguments, answers as exceptions) and how a result is
stored (:mod:`.serializers`). May import :mod:`.._call` and everything below it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial, wraps
from typing import TYPE_CHECKING, Any, TypeVar

from django_idempotency._call import lifecycle
from django_idempotency._conf.options import (
    CALL_OPTIONS,
    CallOptions,
    Options,
    refuse_unstorable,
)
from django_idempotency._function import calls
from django_idempotency._function.serializers import JSONSerializer, ResultSerializer

__all__ = ["JSONSerializer", "ResultSerializer", "idempotent_function"]

Func = TypeVar("Func", bound=Callable[..., Any])

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack: Python 3.11


def idempotent_function(
    *,
    key: str | Callable[..., Any],
    scope: str | Callable[..., Any] | None = None,
    payload: Callable[..., Any] | None = None,
    fingerprint: Callable[..., str] | None = None,
    name: str | None = None,
    serializer: ResultSerializer | None = None,
    **options: Unpack[CallOptions],
) -> Callable[[Func], Func]:
    """Run the decorated function once per key; later calls return its stored result.

    ``key`` is the name of the parameter holding the key (a message id, an event id) or a
    callable taking the function's arguments and returning it. ``scope`` (a string, or a
    callable of the arguments) partitions the keys further, e.g. per tenant; keys are always
    per ``name`` (default: the function's dotted path). ``payload`` (a callable of the
    arguments) says what must match for a repeat to count as the same call; by default all the
    arguments. ``fingerprint`` (a callable of the arguments returning a ``str``) replaces
    ``payload`` when what identifies the call is already a string (a message's hash or
    signature); it is hashed with the name and the scope, as the payload is. ``key_format``
    (``"uuid"`` or a compiled regular expression) refuses other keys with
    :class:`~django_idempotency.InvalidKey`, a ``ValueError``; the ``KEY_FORMAT`` setting
    is the header's and does not apply. ``serializer`` stores results that are not plain JSON.
    The other options are those of views marked for functions (:ref:`view-options`).

    A call while another holds the key raises
    :class:`~django_idempotency.IdempotencyInProgress`; another payload under a used
    key raises :class:`~django_idempotency.IdempotencyKeyMismatch`; an exception
    releases the key and propagates. A parameter named ``idempotency`` receives the
    :class:`~django_idempotency.Claim` (recovery points, derived keys). The function may
    return ``no_store(result)`` or ``store_for(result, ttl)`` (from ``django_idempotency``);
    its caller gets the plain result.
    """
    built = Options.build(CALL_OPTIONS, "idempotent_function", **options)

    def decorate(func: Func) -> Func:
        refuse_unstorable(built, f"{func.__module__}.{func.__qualname__}")
        spec = calls.Spec.build(
            func,
            key=key,
            scope=scope,
            payload=payload,
            fingerprint=fingerprint,
            serializer=JSONSerializer() if serializer is None else serializer,
            name=name,
            options=built,
        )
        return _wrapped(func, spec)

    return decorate


def _wrapped(func: Func, spec: calls.Spec) -> Func:
    """``func`` run through the lifecycle, looking as it does to its callers: its name and
    docstring, and its signature without the claim parameter (which they never pass)."""
    wrapped = wraps(func)(
        lifecycle.wrap(
            func,
            partial(calls.CallAdapter, spec),
            label=spec.name,
            kind="function",
            atomic=spec.options.atomic,
        )
    )
    wrapped.__signature__ = spec.signature  # type: ignore[attr-defined]
    wrapped.idempotency_spec = spec  # type: ignore[attr-defined]
    return wrapped  # type: ignore[return-value]
