"""``idempotent_function``: exactly-once effects for message consumers and background tasks.

The same record and state machine as the ``@idempotent`` view decorator, keyed by a message id
or a provider's event id instead of a header. See ``docs/consumers.rst``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.core.exceptions import ImproperlyConfigured

from django_idempotency import engine
from django_idempotency.conf import conf
from django_idempotency.durations import Duration
from django_idempotency.functions import calls
from django_idempotency.functions.serializers import JSONSerializer, ResultSerializer
from django_idempotency.options import Options

__all__ = ["JSONSerializer", "ResultSerializer", "idempotent_function"]

Func = TypeVar("Func", bound=Callable[..., Any])


def idempotent_function(
    *,
    key: str | Callable[..., Any],
    scope: str | Callable[..., Any] | None = None,
    payload: Callable[..., Any] | None = None,
    name: str | None = None,
    serializer: ResultSerializer | None = None,
    ttl: Duration | None = None,
    lock_timeout: Duration | None = None,
    atomic: bool = False,
    in_progress: str | None = None,
    wait_timeout: Duration | None = None,
) -> Callable[[Func], Func]:
    """Run the decorated function once per key; later calls return its stored result.

    ``key`` is the name of the parameter holding the key (a message id, an event id) or a
    callable taking the function's arguments and returning it. ``scope`` (a string, or a
    callable of the arguments) partitions the keys further, e.g. per tenant; keys are always
    per ``name`` (default: the function's dotted path). ``payload`` (a callable of the
    arguments) says what must match for a repeat to count as the same call; by default all the
    arguments. ``serializer`` stores results that are not plain JSON. ``ttl``,
    ``lock_timeout``, ``atomic``, ``in_progress`` and ``wait_timeout`` are as for views.

    A call while another holds the key raises
    :class:`~django_idempotency.exceptions.IdempotencyInProgress`; another payload under a used
    key raises :class:`~django_idempotency.exceptions.IdempotencyKeyMismatch`; an exception
    releases the key and propagates. A parameter named ``idempotency`` receives the
    :class:`~django_idempotency.claim.Claim` (recovery points, derived keys).
    """
    options = Options.build(
        ttl=ttl,
        lock_timeout=lock_timeout,
        atomic=atomic,
        in_progress=in_progress,
        wait_timeout=wait_timeout,
    )

    def decorate(func: Func) -> Func:
        spec = calls.Spec.build(
            func,
            key=key,
            scope=scope,
            payload=payload,
            serializer=JSONSerializer() if serializer is None else serializer,
            name=name,
            options=options,
        )
        if iscoroutinefunction(func):
            if options.atomic:
                raise ImproperlyConfigured(
                    f"{spec.name}: atomic=True needs a sync function; Django's transactions "
                    "cannot span an async one."
                )
            wrapper: Callable[..., Any] = _async_wrapper(func, spec)
        else:
            wrapper = _sync_wrapper(func, spec)
        wrapped = wraps(func)(wrapper)
        wrapped.__signature__ = spec.signature  # type: ignore[attr-defined]
        wrapped.idempotency_spec = spec  # type: ignore[attr-defined]
        return wrapped  # type: ignore[return-value]

    return decorate


def _sync_wrapper(func: Callable[..., Any], spec: calls.Spec) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not conf.ENABLED:
            return func(*args, **spec.call_kwargs(kwargs, None))
        attempt = spec.attempt(args, kwargs)
        policy = calls.resolve(spec)

        def run() -> Any:
            outcome = engine.run_steps(calls.begin(attempt, spec, policy))
            if isinstance(outcome, calls.Replayed):
                return outcome.value
            try:
                result = func(*args, **spec.call_kwargs(kwargs, outcome))
            except Exception:  # a dying process (SystemExit...) is a crash: taken over later
                calls.abort(outcome, policy, reason="exception")
                raise
            return calls.finish(spec, outcome, result, policy)

        return calls.in_transaction(policy, run)

    return wrapper


def _async_wrapper(func: Callable[..., Any], spec: calls.Spec) -> Callable[..., Any]:
    finish = sync_to_async(calls.finish)
    abort = sync_to_async(calls.abort)

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not conf.ENABLED:
            return await func(*args, **spec.call_kwargs(kwargs, None))
        attempt = spec.attempt(args, kwargs)
        policy = spec.options.resolve()  # always two-phase: no transaction spans an await
        outcome = await engine.arun_steps(calls.begin(attempt, spec, policy))
        if isinstance(outcome, calls.Replayed):
            return outcome.value
        try:
            result = await func(*args, **spec.call_kwargs(kwargs, outcome))
        except Exception:  # a dying process (SystemExit...) is a crash: taken over later
            await abort(outcome, policy, reason="exception")
            raise
        return await finish(spec, outcome, result, policy)

    return wrapper
