"""Atomic mode on a Redis ``STORE`` (no ``store=`` of the view's own) can never work: its
result cannot commit with the view's writes. It decorated fine and answered each request
``500``, and ``check`` (E061) saw it only in the URLconf. It is refused at decoration on every
entry point (the settings are loaded by then: the decorators import the models), by E061
routed or not, and before the claim when ``STORE`` changes at run time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.views import View
from rest_framework.decorators import api_view
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import idempotent, idempotent_function
from django_idempotency._ops import store_checks
from django_idempotency.models import IdempotencyKey
from django_idempotency.rest_framework import IdempotencyMixin
from tests.conftest import executions, problem_slug

#: Never reached: atomic mode is refused before any connection.
REDIS = "redis://127.0.0.1:1/0"


def on_redis() -> Any:
    return override_settings(IDEMPOTENCY={"STORE": REDIS})


def _plain() -> None:
    @idempotent(atomic=True)
    def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse()


def _drf_under() -> None:
    @api_view(["POST"])
    @idempotent(atomic=True)
    def view(request: HttpRequest) -> Response:
        return Response()


def _drf_over() -> None:
    @idempotent(atomic=True)
    @api_view(["POST"])
    def view(request: HttpRequest) -> Response:
        return Response()


def _mixin() -> None:
    class View(IdempotencyMixin, APIView):
        idempotency_atomic = True


def _ninja() -> None:
    from ninja import NinjaAPI

    from django_idempotency.ninja import idempotent as ninja_idempotent

    api = NinjaAPI(urls_namespace="atomic-on-redis")

    @api.post("/x")
    @ninja_idempotent(atomic=True)
    def operation(request: HttpRequest) -> dict[str, str]:
        return {}


def _async() -> None:
    @idempotent(atomic=True)
    async def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse()


def _function() -> None:
    @idempotent_function(key="event_id", atomic=True)
    def handle(event_id: str) -> None: ...


@pytest.mark.parametrize(
    "decorate", [_plain, _drf_under, _drf_over, _mixin, _ninja, _async, _function]
)
def test_atomic_on_a_redis_store_setting_is_refused_at_decoration(
    decorate: Callable[[], None],
) -> None:
    with on_redis(), pytest.raises(ImproperlyConfigured, match=r"atomic=True|sync|above @api_view"):
        decorate()
    if decorate not in (_drf_over, _async):  # refused on any store: above @api_view, async
        decorate()  # the database store: decorated fine


def test_a_view_of_its_own_store_is_decorated_on_a_redis_setting() -> None:
    with on_redis():

        @idempotent(atomic=True, store="database")
        def view(request: HttpRequest) -> HttpResponse:
            return HttpResponse()

        @idempotent
        def two_phase(request: HttpRequest) -> HttpResponse:
            return HttpResponse()


def test_e061_names_an_atomic_view_the_urlconf_does_not_route() -> None:
    @idempotent(atomic=True)
    def unrouted_atomic(request: HttpRequest) -> HttpResponse:
        return HttpResponse()

    class UnroutedDispatch(View):
        from django.utils.decorators import method_decorator

        @method_decorator(idempotent(atomic=True))
        def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            return HttpResponse()

    with on_redis():
        errors = store_checks.e061_atomic_on_redis()
    messages = [error.msg for error in errors]
    assert any("unrouted_atomic" in message for message in messages), messages
    assert all(error.id == "django_idempotency.E061" for error in errors)
    # Each routed view once, though the registry holds it too.
    assert len([m for m in messages if m.startswith("tests.testapp.views.atomic:")]) == 1
    with override_settings(IDEMPOTENCY={"STORE": "database"}):
        assert store_checks.e061_atomic_on_redis() == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("path", "label"), [("/atomic/", "atomic"), ("/drf-atomic/", "drf-atomic")]
)
def test_a_store_changed_at_run_time_is_refused_before_the_claim(
    path: str, label: str, key: str
) -> None:
    """``override_settings`` after decoration: ``500 idempotency-misconfigured``, the view's
    body not run, nothing claimed."""
    with on_redis():
        response = Client().post(
            path, {}, content_type="application/json", headers={"Idempotency-Key": key}
        )
    assert response.status_code == 500, response.content
    assert problem_slug(response) == "idempotency-misconfigured"
    assert executions(label) == 0
    assert not IdempotencyKey.objects.exists()
