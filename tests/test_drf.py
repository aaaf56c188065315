"""IdempotencyMixin on APIView and viewsets, and @idempotent around DRF views."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.authtoken.models import Token

from django_idempotency import IdempotencyKey
from django_idempotency.testing import assert_replayed, key_records
from tests.conftest import executions, only_record, problem_slug, stored

pytestmark = pytest.mark.django_db

Post = Callable[..., Any]


def test_viewset_create_runs_once_and_replays_rendered_bytes(post: Post, key: str) -> None:
    first = post("/api/executions/", {"label": "x", "payload": "p"}, key=key)
    retry = post("/api/executions/", {"payload": "p", "label": "x"}, key=key)
    assert first.status_code == retry.status_code == 201
    assert retry.content == first.content
    assert retry["Idempotent-Replayed"] == "true"
    assert retry["Content-Type"] == first["Content-Type"] == "application/json"
    assert executions("x") == 1


def test_viewset_key_required(post: Post) -> None:
    response = post("/api/executions/", {"label": "x"}, key=None)
    assert response.status_code == 400
    assert problem_slug(response) == "missing-idempotency-key"
    assert executions() == 0


def test_viewset_safe_methods_pass_through(client: Client) -> None:
    assert client.get("/api/executions/").status_code == 200
    assert not bool(stored())


def test_viewset_partial_update_is_protected(client: Client, post: Post, key: str) -> None:
    created = post("/api/executions/", {"label": "x"}, key="create-1").json()
    for label in ("y", "y"):
        client.patch(
            f"/api/executions/{created['id']}/",
            {"label": label},
            content_type="application/json",
            headers={"Idempotency-Key": key},
        )
    other = client.patch(
        f"/api/executions/{created['id']}/",
        {"label": "z"},
        content_type="application/json",
        headers={"Idempotency-Key": key},
    )
    assert other.status_code == 422
    assert IdempotencyKey.objects.filter(method="PATCH").count() == 1


def test_validation_error_is_stored_as_failed_and_replayed(post: Post, key: str) -> None:
    first = post("/api/executions/", {"label": ""}, key=key)
    retry = post("/api/executions/", {"label": ""}, key=key)
    assert first.status_code == retry.status_code == 400
    assert retry.content == first.content
    assert retry["Idempotent-Replayed"] == "true"
    assert only_record().status == IdempotencyKey.Status.FAILED


def test_apiview_with_mixin(post: Post, key: str) -> None:
    first = post("/drf/", {"a": [1, 2]}, key=key)
    retry = post("/drf/", {"a": [1, 2]}, key=key)
    assert first.status_code == 201
    assert first.json()["data"] == {"a": [1, 2]}  # DRF still parses the body we read first
    assert retry.content == first.content
    assert post("/drf/", {"a": [2]}, key=key).status_code == 422
    assert executions("drf") == 1


def test_scope_is_the_drf_authenticated_user(client: Client, key: str) -> None:
    alice = User.objects.create_user("alice")
    bob = User.objects.create_user("bob")
    contents = []
    for user in (alice, bob, alice):
        token, _ = Token.objects.get_or_create(user=user)
        response = client.post(
            "/drf/",
            {"a": 1},
            content_type="application/json",
            headers={"Idempotency-Key": key, "Authorization": f"Token {token.key}"},
        )
        contents.append(response.content)
    assert executions("drf") == 2
    assert contents[2] == contents[0] != contents[1]
    assert set(IdempotencyKey.objects.values_list("scope", flat=True)) == {
        f"user:{alice.pk}",
        f"user:{bob.pk}",
    }


def test_refused_authentication_uses_no_key(client: Client, key: str) -> None:
    response = client.post(
        "/drf/",
        {"a": 1},
        content_type="application/json",
        headers={"Idempotency-Key": key, "Authorization": "Token not-a-token"},
    )
    assert response.status_code == 401
    assert not bool(stored())


def test_decorated_apiview_post_is_protected(post: Post, key: str) -> None:
    """Regression: an existing package left a decorated ``APIView.post`` silently unprotected."""
    first = post("/decorated-apiview/", {"a": 1}, key=key)
    retry = post("/decorated-apiview/", {"a": 1}, key=key)
    assert first.status_code == 201
    assert retry["Idempotent-Replayed"] == "true"
    assert retry.content == first.content
    assert executions("decorated-apiview") == 1


def test_idempotent_straight_on_a_method_fails_loudly(post: Post, key: str) -> None:
    """The message names what works on a DRF view, never ``name='dispatch'`` (check E035
    refuses it there)."""
    with pytest.raises(TypeError, match="method_decorator") as raised:
        post("/misdecorated-apiview/", key=key)
    assert "name='dispatch'" not in str(raised.value)
    assert "IdempotencyMixin, or method_decorator(idempotent) on the handler" in str(raised.value)
    assert executions() == 0


def test_drf_response_below_api_view_is_stored_after_rendering(post: Post, key: str) -> None:
    """Regression: a DRF ``Response`` stored before rendering gave a 500 and a stuck key."""
    first = post("/api-view-inner/", {"a": 1}, key=key)
    retry = post("/api-view-inner/", {"a": 1}, key=key)
    assert first.status_code == retry.status_code == 201
    assert first.json()["body"] == {"a": 1}
    assert_replayed(retry, first)
    stored = key_records(key).get()
    assert stored.status == IdempotencyKey.Status.COMPLETED
    assert bytes(stored.response_body) == first.content


def test_class_view_with_method_decorator(client: Client, post: Post, key: str) -> None:
    assert post("/class/", key=None).status_code == 400
    first = post("/class/", key=key)
    retry = post("/class/", key=key)
    assert first.status_code == 201
    assert_replayed(retry, first)
    assert executions("class") == 1


@pytest.mark.parametrize("key", [None, "k-405"])
def test_a_method_the_route_does_not_handle_is_405_before_the_key(
    post: Post, key: str | None
) -> None:
    # A viewset's detail route has no POST: DRF's 405 answers, not "missing key" (found by
    # schemathesis), and nothing is stored.
    created = post("/api/executions/", {"label": "x"}, key="create-405").json()
    response = post(f"/api/executions/{created['id']}/", {"label": "y"}, key=key)
    assert response.status_code == 405
    assert len(stored()) == 1


@pytest.mark.parametrize("base", ["APIView", "GenericAPIView", "ViewSet"])
def test_the_mixin_after_a_drf_view_is_an_error_at_class_definition(base: str) -> None:
    """``class V(APIView, IdempotencyMixin)``: ``APIView.dispatch`` never calls the mixin's, so
    a key was never claimed (the same key ran twice, a required key was not enforced)."""
    from django.core.exceptions import ImproperlyConfigured
    from rest_framework import generics, views, viewsets

    from django_idempotency.rest_framework import IdempotencyMixin

    view = {
        "APIView": views.APIView,
        "GenericAPIView": generics.GenericAPIView,
        "ViewSet": viewsets.ViewSet,
    }[base]
    with pytest.raises(ImproperlyConfigured, match="Put the mixin first"):
        type("MixinLast", (view, IdempotencyMixin), {"idempotency_required": True})


def test_a_mixin_that_calls_super_may_come_before_it() -> None:
    from django.contrib.auth.mixins import LoginRequiredMixin
    from rest_framework.views import APIView

    from django_idempotency.rest_framework import IdempotencyMixin

    class Guarded(LoginRequiredMixin, IdempotencyMixin, APIView):
        pass

    class Subclass(Guarded):
        def dispatch(self, request: Any, *args: Any, **kwargs: Any) -> Any:
            return super().dispatch(request, *args, **kwargs)

    assert Subclass.__mro__.index(IdempotencyMixin) < Subclass.__mro__.index(APIView)


def test_the_mixin_on_a_plain_django_view_is_refused_at_class_definition() -> None:
    """A plain View never calls DRF's initial(), where the mixin claims: the view ran with
    nothing claimed, silently (issue 48)."""
    from django.core.exceptions import ImproperlyConfigured
    from django.http import HttpResponse
    from django.views import View
    from django.views.generic import FormView
    from rest_framework import generics, viewsets
    from rest_framework.views import APIView

    from django_idempotency.rest_framework import IdempotencyMixin

    for base in (View, FormView):
        with pytest.raises(ImproperlyConfigured, match=r"not a DRF APIView.*method_decorator"):
            type("Plain", (IdempotencyMixin, base), {"post": lambda self, r: HttpResponse()})

    class Options(IdempotencyMixin):  # a mixin of the project's own: no view yet
        idempotency_required = True

    for drf in (APIView, generics.CreateAPIView, viewsets.ViewSet):
        type("Drf", (Options, drf), {})
