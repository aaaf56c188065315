"""Views protected in every order that works, under each way a framework authenticates
(tests/test_principals.py): each answers with the principal it saw, so that a response replayed
to another principal shows."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.contrib.auth.mixins import LoginRequiredMixin
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import include, path
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.csrf import csrf_exempt
from ninja import NinjaAPI, Router
from ninja.security import HttpBasicAuth, HttpBearer, django_auth
from rest_framework.authentication import (
    BasicAuthentication,
    SessionAuthentication,
    TokenAuthentication,
)
from rest_framework.authtoken.models import Token
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import idempotent
from django_idempotency import ninja as idempotent_ninja
from django_idempotency.rest_framework import IdempotencyMixin
from tests.testapp.models import Execution

DRF_AUTH = [TokenAuthentication, BasicAuthentication, SessionAuthentication]


def _answer(request: Any, user: Any) -> dict[str, Any]:
    execution = Execution.objects.create(label="principals", payload=str(user))
    claim = getattr(request, "idempotency", None)
    # Operations need the database store: asked for by the tests of the status endpoint.
    asked = request.headers.get("X-Operation") and claim is not None
    return {
        "user": getattr(user, "username", "") or "",
        "execution": execution.pk,
        "operation": claim.operation_url if asked else None,
    }


# DRF function views: @idempotent under @api_view (and under DRF's policy decorators).


@api_view(["POST"])
@authentication_classes(DRF_AUTH)
@permission_classes([IsAuthenticated])
@idempotent
def drf_inner(request: Any) -> Response:
    return Response(_answer(request, request.user), status=201)


@csrf_exempt
@api_view(["POST"])
@authentication_classes(DRF_AUTH)
@permission_classes([IsAuthenticated])
@csrf_exempt
@idempotent(atomic=True)
def drf_inner_atomic(request: Any) -> Response:
    return Response(_answer(request, request.user), status=201)


@api_view(["POST"])
@authentication_classes(DRF_AUTH)
@permission_classes([AllowAny])
@login_required
@idempotent
def drf_inner_login(request: Any) -> Response:
    return Response(_answer(request, request.user), status=201)


@api_view(["POST"])
@authentication_classes(DRF_AUTH)
@permission_classes([AllowAny])
@idempotent
def drf_inner_open(request: Any) -> Response:
    return Response(_answer(request, request.user), status=201)


class DrfHandler(APIView):
    authentication_classes = DRF_AUTH
    permission_classes = [IsAuthenticated]

    @method_decorator(idempotent)
    def post(self, request: Any) -> Response:
        return Response(_answer(request, request.user), status=201)


class DrfMixin(IdempotencyMixin, APIView):
    authentication_classes = DRF_AUTH
    permission_classes = [IsAuthenticated]

    def post(self, request: Any) -> Response:
        return Response(_answer(request, request.user), status=201)


# Django views: Django's own authentication (a session), refused above @idempotent.


@csrf_exempt
@login_required
@idempotent
def plain_login(request: HttpRequest) -> HttpResponse:
    return JsonResponse(_answer(request, request.user), status=201)


@login_required
@csrf_exempt
@idempotent
def plain_login_csrf(request: HttpRequest) -> HttpResponse:
    return JsonResponse(_answer(request, request.user), status=201)


@csrf_exempt
@idempotent
def plain_open(request: HttpRequest) -> HttpResponse:
    """Django's authentication only: a DRF token is anonymous here."""
    return JsonResponse(_answer(request, request.user), status=201)


@method_decorator(csrf_exempt, name="dispatch")
@method_decorator(login_required, name="dispatch")
@method_decorator(idempotent, name="dispatch")
class PlainStacked(View):
    def post(self, request: HttpRequest) -> HttpResponse:
        return JsonResponse(_answer(request, request.user), status=201)


@method_decorator([login_required, idempotent], name="dispatch")
class PlainListed(View):
    def post(self, request: HttpRequest) -> HttpResponse:
        return JsonResponse(_answer(request, request.user), status=201)


@method_decorator(idempotent, name="dispatch")
class _Protected(View):
    def post(self, request: HttpRequest) -> HttpResponse:
        return JsonResponse(_answer(request, request.user), status=201)


class PlainMixin(LoginRequiredMixin, _Protected):
    """The mixin refuses before the decorated dispatch of the class after it."""

    raise_exception = True


# django-ninja: the claim is made after ninja's authentication, in both of its placements.


class TokenBearer(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> Any:
        found = Token.objects.select_related("user").filter(key=token).first()
        return None if found is None else found.user


class UserBasic(HttpBasicAuth):
    def authenticate(self, request: HttpRequest, username: str, password: str) -> Any:
        from django.contrib.auth import authenticate

        return authenticate(request, username=username, password=password)


api = NinjaAPI(urls_namespace="principals", title="Principals")


@api.post("/bearer", auth=TokenBearer())
@idempotent_ninja.idempotent
def ninja_bearer(request: HttpRequest) -> dict[str, Any]:
    return _answer(request, request.auth)  # type: ignore[attr-defined]


@api.post("/basic", auth=UserBasic())
@idempotent_ninja.idempotent
def ninja_basic(request: HttpRequest) -> dict[str, Any]:
    return _answer(request, request.auth)  # type: ignore[attr-defined]


@api.post("/session", auth=django_auth)
@idempotent_ninja.idempotent
def ninja_session(request: HttpRequest) -> dict[str, Any]:
    return _answer(request, request.auth)  # type: ignore[attr-defined]


router = Router(auth=TokenBearer())


@router.post("/bearer")
def ninja_router_bearer(request: HttpRequest) -> dict[str, Any]:
    return _answer(request, request.auth)  # type: ignore[attr-defined]


router.add_decorator(idempotent_ninja.idempotent)
api.add_router("/router", router)


urlpatterns = [
    path("drf/inner/", drf_inner),
    path("drf/inner-atomic/", drf_inner_atomic),
    path("drf/inner-login/", drf_inner_login),
    path("drf/inner-open/", drf_inner_open),
    path("drf/handler/", DrfHandler.as_view()),
    path("drf/mixin/", DrfMixin.as_view()),
    path("plain/open/", plain_open),
    path("plain/login/", plain_login),
    path("plain/login-csrf/", plain_login_csrf),
    path("plain/stacked/", PlainStacked.as_view()),
    path("plain/listed/", PlainListed.as_view()),
    path("plain/mixin/", PlainMixin.as_view()),
    path("ninja/", api.urls),
    path("idempotency/", include("django_idempotency.urls")),
]
