"""The ``@idempotent`` view decorator."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import wraps
from typing import Any, TypeVar, overload

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpResponseBase

from django_idempotency import protocol
from django_idempotency.conf import conf
from django_idempotency.durations import Duration
from django_idempotency.options import Options

ViewFunc = TypeVar("ViewFunc", bound=Callable[..., Any])


@overload
def idempotent(view: ViewFunc) -> ViewFunc: ...


@overload
def idempotent(
    view: None = None,
    *,
    required: bool | None = None,
    ttl: Duration | None = None,
    lock_timeout: Duration | None = None,
    atomic: bool = False,
    in_progress: str | None = None,
    wait_timeout: Duration | None = None,
    methods: Iterable[str] | None = None,
) -> Callable[[ViewFunc], ViewFunc]: ...


def idempotent(
    view: ViewFunc | None = None,
    *,
    required: bool | None = None,
    ttl: Duration | None = None,
    lock_timeout: Duration | None = None,
    atomic: bool = False,
    in_progress: str | None = None,
    wait_timeout: Duration | None = None,
    methods: Iterable[str] | None = None,
) -> ViewFunc | Callable[[ViewFunc], ViewFunc]:
    """Protect a view with the ``Idempotency-Key`` header: its side effects run once per key.

    Usable bare (``@idempotent``) or with options, which override ``settings.IDEMPOTENCY``.
    Works on function views, on ``View.dispatch`` through ``method_decorator``, and on
    ``async def`` views (``atomic=True`` needs a sync view: Django transactions are sync).
    """
    options = Options.build(
        required=required,
        ttl=ttl,
        lock_timeout=lock_timeout,
        atomic=atomic,
        in_progress=in_progress,
        wait_timeout=wait_timeout,
        methods=methods,
    )

    def decorate(view: ViewFunc) -> ViewFunc:
        if iscoroutinefunction(view):
            if options.atomic:
                raise ImproperlyConfigured(
                    f"{view.__qualname__}: atomic=True needs a sync view; Django's "
                    "transactions cannot span an async view."
                )
            wrapper: Callable[..., Any] = _async_wrapper(view, options)
        else:
            wrapper = _sync_wrapper(view, options)
        wrapper.idempotency_options = options  # type: ignore[attr-defined]
        return wraps(view)(wrapper)  # type: ignore[return-value]

    return decorate if view is None else decorate(view)


def _sync_wrapper(view: Callable[..., HttpResponseBase], options: Options) -> Callable[..., Any]:
    def wrapper(request: Any, *args: Any, **kwargs: Any) -> HttpResponseBase:
        http_request = protocol.http_request(request)
        policy = options.resolve()
        if not (conf.ENABLED and policy.protects(http_request.method)):
            protocol.attach(http_request, None)
            return view(request, *args, **kwargs)

        def run() -> HttpResponseBase:
            decision = protocol.run_steps(protocol.begin(http_request, policy))
            if isinstance(decision, HttpResponseBase):
                return decision
            protocol.attach(http_request, decision)
            if decision is None:
                return view(request, *args, **kwargs)
            try:
                response = view(request, *args, **kwargs)
            except Exception:  # a dying process (SystemExit...) is a crash: recovered later
                protocol.abort(http_request, decision, policy, reason="exception")
                raise
            return protocol.finish(http_request, decision, response, policy)

        return protocol.in_transaction(policy, run)

    return wrapper


def _async_wrapper(view: Callable[..., Any], options: Options) -> Callable[..., Any]:
    finish = sync_to_async(protocol.finish)
    abort = sync_to_async(protocol.abort)

    async def wrapper(request: Any, *args: Any, **kwargs: Any) -> HttpResponseBase:
        http_request = protocol.http_request(request)
        policy = options.resolve()
        if not (conf.ENABLED and policy.protects(http_request.method)):
            protocol.attach(http_request, None)
            return await view(request, *args, **kwargs)  # type: ignore[no-any-return]
        decision = await protocol.arun_steps(protocol.begin(http_request, policy))
        if isinstance(decision, HttpResponseBase):
            return decision
        protocol.attach(http_request, decision)
        if decision is None:
            return await view(request, *args, **kwargs)  # type: ignore[no-any-return]
        try:
            response = await view(request, *args, **kwargs)
        except Exception:  # a dying process (SystemExit...) is a crash: recovered later
            await abort(http_request, decision, policy, reason="exception")
            raise
        return await finish(http_request, decision, response, policy)

    return wrapper
