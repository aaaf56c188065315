"""Classes whose ``dispatch`` ``@idempotent`` wraps around the framework's authentication or
refusals (tests/test_principals.py): refused by check E035, and at their first request."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.contrib.auth.mixins import LoginRequiredMixin
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.csrf import csrf_protect
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import idempotent
from tests.principals_urls import DRF_AUTH, _answer


@method_decorator(idempotent, name="dispatch")
class DrfDispatch(APIView):
    authentication_classes = DRF_AUTH

    def post(self, request: Any) -> Response:
        return Response(_answer(request, request.user), status=201)


@method_decorator(idempotent, name="dispatch")
class AroundLoginMixin(LoginRequiredMixin, View):
    def post(self, request: HttpRequest) -> HttpResponse:
        return JsonResponse(_answer(request, request.user), status=201)


@method_decorator(idempotent, name="dispatch")
@method_decorator(login_required, name="dispatch")
class AroundLoginRequired(View):
    def post(self, request: HttpRequest) -> HttpResponse:
        return JsonResponse(_answer(request, request.user), status=201)


@method_decorator(idempotent, name="dispatch")
@method_decorator(csrf_protect, name="dispatch")
class AroundCsrfProtect(View):
    def post(self, request: HttpRequest) -> HttpResponse:
        return JsonResponse(_answer(request, request.user), status=201)


urlpatterns = [
    path("drf-dispatch/", DrfDispatch.as_view()),
    path("around-login-mixin/", AroundLoginMixin.as_view()),
    path("around-login-required/", AroundLoginRequired.as_view()),
    path("around-csrf-protect/", AroundCsrfProtect.as_view()),
]
