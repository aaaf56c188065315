"""``IdempotencyMixin`` for Django REST framework views: the only module importing DRF."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.http import HttpRequest, HttpResponseBase
from rest_framework.request import Request
from rest_framework.response import Response

from django_idempotency import bodies, protocol
from django_idempotency.claim import Claim
from django_idempotency.conf import conf
from django_idempotency.durations import Duration
from django_idempotency.options import Options, Policy

if TYPE_CHECKING:
    from collections.abc import Iterable

    from rest_framework.views import APIView

    _Base = APIView
else:
    _Base = object


class _Answer(Exception):
    """Carries the app's own response (replay, 409, 422, 400) out of ``initial()``."""

    def __init__(self, response: HttpResponseBase) -> None:
        super().__init__(response.status_code)
        self.response = response


class IdempotencyMixin(_Base):
    """Protect an ``APIView``, generic view or viewset with the ``Idempotency-Key`` header.

    The key is claimed after DRF's authentication, permissions and throttling (so the scope is
    the authenticated principal and refused requests use no key), and the response is stored
    once DRF has rendered it. Class attributes override ``settings.IDEMPOTENCY``.
    """

    idempotency_required: bool | None = None
    idempotency_ttl: Duration | None = None
    idempotency_lock_timeout: Duration | None = None
    idempotency_atomic: bool = False
    idempotency_in_progress: str | None = None
    idempotency_wait_timeout: Duration | None = None
    idempotency_methods: Iterable[str] | None = None

    _idempotency_policy: Policy | None = None
    _idempotency_claim: Claim | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Bad attributes fail at import, as the decorator's options do, not as a 500 (issue 20).
        super().__init_subclass__(**kwargs)
        cls.get_idempotency_options()

    @classmethod
    def get_idempotency_options(cls) -> Options:
        return Options.build(
            required=cls.idempotency_required,
            ttl=cls.idempotency_ttl,
            lock_timeout=cls.idempotency_lock_timeout,
            atomic=cls.idempotency_atomic,
            in_progress=cls.idempotency_in_progress,
            wait_timeout=cls.idempotency_wait_timeout,
            methods=cls.idempotency_methods,
        )

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        policy = self.get_idempotency_options().resolve()
        if not (conf.ENABLED and policy.protects(request.method)):
            protocol.attach(request, None)
            return super().dispatch(request, *args, **kwargs)
        self._idempotency_policy = policy
        self._idempotency_claim = None
        if protocol.has_key(request):
            # Before DRF's parsers or authenticators consume the stream; without a key the
            # request runs as if undecorated, and its body is the view's business.
            bodies.keep_readable(request)
        return protocol.in_transaction(
            policy, lambda: self._idempotent_dispatch(request, policy, *args, **kwargs)
        )

    def _idempotent_dispatch(
        self, request: HttpRequest, policy: Policy, *args: Any, **kwargs: Any
    ) -> HttpResponseBase:
        try:
            response = super().dispatch(request, *args, **kwargs)
        except Exception:  # a dying process (SystemExit...) is a crash: recovered later
            if self._idempotency_claim is not None:
                protocol.abort(request, self._idempotency_claim, policy, reason="exception")
            raise
        if self._idempotency_claim is None:
            return response
        return protocol.finish(request, self._idempotency_claim, response, policy)

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        if self._idempotency_policy is None or not self._handles(request.method):
            return  # dispatch() answers 405 itself, and nothing is stored
        decision = protocol.run_steps(protocol.begin(request._request, self._idempotency_policy))
        if isinstance(decision, HttpResponseBase):
            raise _Answer(decision)
        self._idempotency_claim = decision
        protocol.attach(request._request, decision)

    def _handles(self, method: str | None) -> bool:
        """Whether DRF's dispatch() finds a handler for the method (as it does, after us)."""
        name = (method or "").lower()
        return name in self.http_method_names and hasattr(self, name)

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, _Answer):
            # Not a DRF Response, but finalize_response() accepts any HttpResponseBase.
            return exc.response  # type: ignore[return-value]
        return super().handle_exception(exc)


__all__ = ["IdempotencyMixin"]
