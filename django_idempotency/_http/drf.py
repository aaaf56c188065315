"""``IdempotencyMixin`` for Django REST framework views, public as
:mod:`django_idempotency.rest_framework`: with the OpenAPI extension (:mod:`.._publish.openapi`)
and the status endpoint's authentication (:mod:`.drf_auth`), the only code importing DRF."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, cast

from django.core.exceptions import ImproperlyConfigured, RequestDataTooBig
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.views import View
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.encoders import JSONEncoder
from rest_framework.views import exception_handler as drf_exception_handler

from django_idempotency._call import lifecycle
from django_idempotency._call.lifecycle import Answer
from django_idempotency._conf.options import (
    VIEW_OPTIONS,
    Options,
    Policy,
    ViewOptions,
    refuse_unstorable,
)
from django_idempotency._conf.settings import OPTIONS
from django_idempotency._http import adapter as protocol
from django_idempotency._http import framework_faults, placement, problems

if TYPE_CHECKING:
    from rest_framework.views import APIView

    _Base = APIView
else:
    _Base = object


class _Answer(Exception):
    """Carries the app's own response (replay, 409, 422, 400) out of ``initial()``."""

    def __init__(self, response: HttpResponseBase) -> None:
        super().__init__(response.status_code)
        self.response = response


class _DispatchAdapter(protocol.HttpAdapter):
    """The claim is made in ``initial()``, inside the dispatch the lifecycle runs."""

    claims_inside = True

    def resolve(self, *, asynchronous: bool) -> Policy | None:
        policy = super().resolve(asynchronous=asynchronous)
        if policy is not None:
            # Nothing is read before DRF's authentication and permissions; but the body is
            # kept for the claim's fingerprint if SessionAuthentication's CSRF check parses it.
            protocol.keep_body(self.request)
        return policy


class IdempotencyMixin(_Base):
    """Protect an ``APIView``, generic view or viewset with the ``Idempotency-Key`` header.

    The key is claimed after DRF's authentication, permissions and throttling (so the scope is
    the authenticated principal and refused requests use no key), and the response is stored
    once DRF has rendered it. Each view option is a class attribute ``idempotency_<name>``
    (``None``: as ``settings.IDEMPOTENCY`` says); ``idempotency_scope`` and
    ``idempotency_fingerprint`` are functions, not methods: read from the class, they are
    called without ``self``.
    """

    _idempotency: _DispatchAdapter | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Bad attributes fail at import, as the decorator's options do, not as a 500.
        super().__init_subclass__(**kwargs)
        placement.refuse_plain_view_mixin(cls)
        refuse_unstorable(cls.get_idempotency_options(), f"{cls.__module__}.{cls.__qualname__}")
        _refuse_mixin_after(cls)

    @classmethod
    def get_idempotency_options(cls) -> Options:
        # Read from the class, a function attribute is the function itself (a staticmethod's
        # too), never a method bound to the view.
        given = {name: getattr(cls, attribute) for name, attribute in _ATTRIBUTES}
        return Options.build(VIEW_OPTIONS, cls.__name__, **cast(ViewOptions, given))

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        self._idempotency = _DispatchAdapter(request, self.get_idempotency_options())
        return lifecycle.run(
            self._idempotency,
            lambda _: super(IdempotencyMixin, self).dispatch(request, *args, **kwargs),
        )

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        try:
            super().initial(request, *args, **kwargs)
        except DatabaseError as exc:
            # Authentication reads the user the scope is made of: a fault there is the
            # scope's, a 503.
            answer = None if self._idempotency is None else self._idempotency.fault(exc)
            if answer is None:
                raise
            framework_faults.roll_back_request()
            raise _Answer(answer.value) from exc
        adapter = self._idempotency
        if adapter is None or adapter.policy is None or not self._handles(request.method):
            return  # unprotected, or DRF's 405 answers untouched and nothing is stored
        decision = lifecycle.run_steps(lifecycle.begin(adapter, adapter.policy))
        if isinstance(decision, Answer):
            raise _Answer(decision.value)
        adapter.hold(decision)

    def _handles(self, method: str | None) -> bool:
        """Whether the view has a handler for ``method``: if not, DRF's 405 answers first."""
        name = (method or "").lower()
        return name in self.http_method_names and hasattr(self, name)

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, _Answer):
            # Not a DRF Response, but finalize_response() accepts any HttpResponseBase.
            return exc.response  # type: ignore[return-value]
        adapter = self._idempotency
        if (
            isinstance(exc, RequestDataTooBig)
            and adapter is not None
            and adapter.policy is not None
            and adapter.key_header() is not None
        ):
            # A keyed body over the limit, met by SessionAuthentication's CSRF check reading
            # it during authentication: refused as the claim would have refused it.
            return problems.body_too_large(str(exc))  # type: ignore[return-value]
        return super().handle_exception(exc)


def exception_handler(exc: Exception, context: dict[str, Any]) -> HttpResponseBase | None:
    """DRF's ``EXCEPTION_HANDLER``: a database fault (a lost or refused connection, a server
    shutting down or read-only) is ``503 idempotency-unavailable`` with ``Retry-After``, not
    DRF's uncaught exception (Django's ``500``); everything else is DRF's default handler's.

    DRF authenticates a function view's token or session before ``@idempotent`` (under
    ``@api_view``) runs, so a fault there never reaches the app; nothing was claimed, and the
    client's retry is answered as a first request. A fault raised by a protected view itself
    has released its claim already (the ``503`` is never stored)."""
    response = framework_faults.unavailable(exc)  # which rolls ATOMIC_REQUESTS back
    if response is None:
        return drf_exception_handler(exc, context)
    return _Problem.of(response)


class _Problem(Response):
    """The handler's ``503`` as DRF's handlers answer: a ``Response`` whose ``data`` a handler
    of the project's may read and change (``response.data["status_code"] = ...``, as DRF's
    docs show; a plain ``HttpResponse`` raised ``AttributeError`` there, a ``500``), always
    rendered as the problem JSON it is, whichever renderer DRF negotiated."""

    @classmethod
    def of(cls, problem: HttpResponse) -> _Problem:
        headers = {name: value for name, value in problem.items() if name != "Content-Type"}
        answer = cls(json.loads(problem.content), status=problem.status_code, headers=headers)
        # Still the app's own problem: never stored as a protected view's response.
        answer.idempotency_problem = problem.idempotency_problem  # type: ignore[attr-defined]
        return answer

    @property
    def rendered_content(self) -> str:
        self["Content-Type"] = problems.CONTENT_TYPE
        return json.dumps(self.data, cls=JSONEncoder)


def _refuse_mixin_after(cls: type) -> None:
    """``ImproperlyConfigured`` when a view class before ``IdempotencyMixin`` in ``cls``'s MRO
    (not one of its subclasses) has its own ``dispatch`` or ``initial``: ``APIView``'s, which
    never call the mixin's, so the view would run unprotected (``class V(APIView,
    IdempotencyMixin)``). A mixin before it (``LoginRequiredMixin``) calls ``super()``."""
    for owner in cls.__mro__:
        if owner is IdempotencyMixin:
            return
        if issubclass(owner, IdempotencyMixin) or not issubclass(owner, View):
            continue
        if "dispatch" in owner.__dict__ or "initial" in owner.__dict__:
            raise ImproperlyConfigured(
                f"{cls.__module__}.{cls.__qualname__}: IdempotencyMixin comes after "
                f"{owner.__module__}.{owner.__qualname__}, whose dispatch() and initial() "
                "never call the mixin's, so the view would run unprotected. Put the mixin "
                f"first: class {cls.__name__}(IdempotencyMixin, {owner.__name__})."
            )


# One attribute per view option, declared with the settings (._conf).
_ATTRIBUTES = [(option.name, option.attribute) for option in OPTIONS]
for _option in OPTIONS:
    setattr(IdempotencyMixin, _option.attribute, _option.default)
