"""No response crosses principals, in any decorator order and under each authentication
(issue 48): a view protected in an order that works keys its records by the principal the
framework authenticated (DRF's token, Basic and session classes, Django's session, ninja's
auth), and a request the framework refuses is never claimed or stored; an order that would read
the user before the framework authenticates it is refused before any view runs."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.decorators import login_required, permission_required, user_passes_test
from django.contrib.auth.mixins import LoginRequiredMixin
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.views import View
from django.views.decorators.csrf import (
    csrf_exempt,
    csrf_protect,
    ensure_csrf_cookie,
    requires_csrf_token,
)
from rest_framework.authtoken.models import Token
from rest_framework.decorators import api_view
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import idempotent
from django_idempotency._ops.checks import e035_idempotent_before_authentication
from tests.conftest import executions, stored

pytestmark = [pytest.mark.django_db(transaction=False), pytest.mark.urls("tests.principals_urls")]

DRF = ("token", "basic", "session")
#: (path, the credentials its framework authenticates, whether anonymous callers may run it)
VIEWS = [
    ("/drf/inner/", DRF, False),
    ("/drf/inner-atomic/", DRF, False),  # not on the Redis store: "atomic" in its name
    ("/drf/inner-login/", DRF, False),
    ("/drf/inner-open/", DRF, True),
    ("/drf/handler/", DRF, False),
    ("/drf/mixin/", DRF, False),
    ("/plain/login/", ("session",), False),
    ("/plain/login-csrf/", ("session",), False),
    ("/plain/stacked/", ("session",), False),
    ("/plain/listed/", ("session",), False),
    ("/plain/mixin/", ("session",), False),
    ("/ninja/bearer", ("bearer",), False),
    ("/ninja/basic", ("basic",), False),
    ("/ninja/session", ("session",), False),
    ("/ninja/router/bearer", ("bearer",), False),
]
KINDS = ("token", "basic", "session", "bearer")
REFUSALS = {302, 401, 403}


class Principal:
    """A user (or nobody) sending one kind of credentials from a client of their own."""

    def __init__(self, user: User | None, kind: str | None) -> None:
        self.user, self.kind = user, kind
        self.client = Client()
        self.headers: dict[str, str] = {}
        if user is None:
            return
        if kind == "session":
            self.client.force_login(user)
        elif kind in ("token", "bearer"):
            token, _ = Token.objects.get_or_create(user=user)
            self.headers["Authorization"] = f"{'Token' if kind == 'token' else 'Bearer'} {token}"
        else:
            secret = base64.b64encode(f"{user.username}:pw-{user.username}".encode()).decode()
            self.headers["Authorization"] = f"Basic {secret}"

    @property
    def name(self) -> str:
        return "" if self.user is None else self.user.username

    def post(self, path: str, key: str, **headers: str) -> Any:
        return self.client.post(
            path,
            {"amount": 10},
            content_type="application/json",
            headers={**self.headers, **headers, "Idempotency-Key": key},
        )

    def __repr__(self) -> str:
        return f"{self.name or 'anonymous'} ({self.kind})"


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    # Basic authentication checks a password at every request.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def alice() -> User:
    return User.objects.create_user("alice", password="pw-alice")


@pytest.fixture
def bob() -> User:
    return User.objects.create_user("bob", password="pw-bob")


@pytest.mark.parametrize(("path", "kinds", "open_to_anonymous"), VIEWS)
def test_no_response_crosses_principals(
    path: str, kinds: tuple[str, ...], open_to_anonymous: bool, alice: User, bob: User, key: str
) -> None:
    """Nobody first (refused, nothing claimed: the key is not squatted), then Alice and Bob with
    every kind of credentials, then nobody again: each 2xx is the sender's own, Alice's and
    Bob's first requests run and every later one of theirs replays their own."""
    senders = [Principal(None, None)]
    for kind in KINDS:
        senders += [Principal(alice, kind), Principal(bob, kind), Principal(None, kind)]
    senders.append(Principal(None, None))
    first: dict[str, Any] = {}
    for sender in senders:
        response = sender.post(path, key)
        authenticated = sender.user is not None and sender.kind in kinds
        name = sender.name if authenticated else ""
        if not authenticated and not open_to_anonymous:
            assert response.status_code in REFUSALS, (sender, response.status_code)
            continue
        assert response.status_code in (200, 201), (sender, response.status_code)
        assert json.loads(response.content)["user"] == name, sender
        if name in first:
            assert response.get("Idempotent-Replayed") == "true", sender
            assert response.content == first[name].content, sender
        else:
            assert "Idempotent-Replayed" not in response, sender
            first[name] = response
    expected = {"alice", "bob"} | ({""} if open_to_anonymous else set())
    assert set(first) == expected
    assert executions("principals") == len(expected)
    scopes = {record.scope for record in stored()}
    assert scopes == {f"user:{alice.pk}", f"user:{bob.pk}"} | (
        {"anonymous"} if open_to_anonymous else set()
    )


@pytest.mark.database_store  # operations need it
def test_an_operation_is_its_principals_through_drf(alice: User, bob: User, key: str) -> None:
    """A token user's operation is hers at the status endpoint, and nobody else's."""
    response = Principal(alice, "token").post("/drf/inner/", key, **{"X-Operation": "1"})
    location = json.loads(response.content)["operation"]
    assert location
    for other in (Principal(alice, "token"), Principal(bob, "token"), Principal(None, None)):
        expected = 200 if other.user == alice else 404
        assert other.client.get(location, headers=other.headers).status_code == expected, other


@pytest.mark.database_store  # operations need it
def test_an_operation_of_a_plain_view_is_its_token_users_too(alice: User, key: str) -> None:
    """A plain view keys a token's request by what Django saw (anonymous): the status
    endpoint, which authenticates as DRF does, still shows her the operation she started."""
    her = Principal(alice, "token")
    response = her.post("/plain/open/", key, **{"X-Operation": "1"})
    assert json.loads(response.content)["user"] == ""
    assert {record.scope for record in stored()} == {"anonymous"}
    location = json.loads(response.content)["operation"]
    assert her.client.get(location, headers=her.headers).status_code == 200
    assert Client().get(location).status_code == 200  # the anonymous scope's, as ever


def _view(request: HttpRequest) -> HttpResponse:
    return HttpResponse(status=201)


class _ApiView(APIView):
    def post(self, request: Any) -> Response:
        return Response(status=201)


class _LoginView(LoginRequiredMixin, View):
    def post(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(status=201)


@pytest.mark.parametrize(
    ("decorate", "order"),
    [
        (lambda: idempotent(api_view(["POST"])(_view)), "under @api_view"),
        (lambda: idempotent(required=True)(api_view(["POST"])(_view)), "under @api_view"),
        (lambda: idempotent(csrf_exempt(api_view(["POST"])(_view))), "under @api_view"),
        (lambda: csrf_exempt(idempotent(api_view(["POST"])(_view))), "under @api_view"),
        (lambda: idempotent(_ApiView.as_view()), "under @api_view"),
        (lambda: idempotent(login_required(_view)), "put login_required"),
        (lambda: idempotent(csrf_exempt(login_required(_view))), "put login_required"),
        (lambda: idempotent(permission_required("auth.add_user")(_view)), "put login_required"),
        (lambda: idempotent(user_passes_test(bool)(_view)), "put login_required"),
        (lambda: idempotent(_LoginView.as_view()), "put login_required"),
        (lambda: idempotent(csrf_protect(_view)), "put csrf_protect above"),
        (lambda: idempotent(csrf_protect(login_required(_view))), "put csrf_protect above"),
        (lambda: idempotent(login_required(csrf_protect(_view))), "put login_required"),
    ],
)
def test_an_order_before_the_frameworks_authentication_is_refused_when_decorated(
    decorate: Callable[[], object], order: str
) -> None:
    with pytest.raises(ImproperlyConfigured, match=order):
        decorate()


@pytest.mark.urls("tests.principals_misplaced_urls")
@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/drf-dispatch/", "dispatch of the DRF view"),
        ("/around-login-mixin/", "AccessMixin"),
        ("/around-login-required/", "above login_required"),
        ("/around-csrf-protect/", "above csrf_protect"),
    ],
)
def test_a_dispatch_decorated_before_the_frameworks_authentication_never_runs(
    path: str, says: str, alice: User, key: str
) -> None:
    """method_decorator decorates at each call: the first request is refused, unclaimed."""
    for sender in (Principal(alice, "token"), Principal(None, None)):
        with pytest.raises(ImproperlyConfigured, match=says):
            sender.post(path, key)
    assert executions() == 0
    assert stored() == []


@pytest.mark.parametrize(
    "guard",
    [csrf_exempt, requires_csrf_token, ensure_csrf_cookie, lambda v: csrf_protect(csrf_exempt(v))],
)
def test_a_csrf_decorator_that_refuses_nothing_may_stand_under_idempotent(
    guard: Callable[[Any], Any],
) -> None:
    idempotent(guard(_view))


def test_check_e035_refuses_a_dispatch_decorated_before_authentication() -> None:
    with override_settings(ROOT_URLCONF="tests.principals_misplaced_urls"):
        errors = e035_idempotent_before_authentication()
    assert [error.id for error in errors] == ["django_idempotency.E035"] * 4
    assert "DrfDispatch: @idempotent is on the dispatch of a DRF view" in errors[0].msg
    assert "IdempotencyMixin" in (errors[0].hint or "") + errors[0].msg
    assert "AroundLoginMixin: @idempotent is on a dispatch around an AccessMixin" in errors[1].msg
    # Stacked through method_decorator: refused at startup, not only at the first request.
    assert "AroundLoginRequired: @idempotent is on a dispatch above login_required" in (
        errors[2].msg
    )
    assert "AroundCsrfProtect: @idempotent is on a dispatch above csrf_protect" in errors[3].msg
    # The orders that work are not refused.
    with override_settings(ROOT_URLCONF="tests.principals_urls"):
        assert e035_idempotent_before_authentication() == []


# --- a request protected twice (issue 48) -----------------------------------------------------


def _posted(view: Callable[..., Any], key: str) -> Any:
    from django.test import RequestFactory

    response = view(RequestFactory().post("/twice/", headers={"Idempotency-Key": key}))
    if hasattr(response, "render") and not getattr(response, "is_rendered", True):
        response.render()
    return response


def _slug(response: Any) -> str:
    assert response["Content-Type"] == "application/problem+json"
    return str(json.loads(response.content)["type"].rsplit("#", 1)[1])


def test_two_stacked_idempotent_are_refused_before_the_inner_claim(key: str) -> None:
    """The inner claim met the outer's record (409), and the outer stored that 409: the key
    answered 409 until it expired."""
    runs: list[int] = []

    def view(request: HttpRequest) -> HttpResponse:
        runs.append(1)
        return HttpResponse(status=201)

    twice = idempotent(idempotent(required=True)(view))
    for _ in range(2):
        response = _posted(twice, key)
        assert response.status_code == 500
        assert _slug(response) == "idempotency-misconfigured"
    assert runs == []
    assert stored() == []


def test_the_mixin_and_an_idempotent_handler_are_refused_before_the_inner_claim(key: str) -> None:
    from django.utils.decorators import method_decorator
    from rest_framework.permissions import AllowAny

    from django_idempotency.rest_framework import IdempotencyMixin

    runs: list[int] = []

    class Twice(IdempotencyMixin, APIView):
        authentication_classes: list[Any] = []
        permission_classes = [AllowAny]

        @method_decorator(idempotent)
        def post(self, request: Any) -> Response:
            runs.append(1)
            return Response({"ran": True}, status=201)

    for _ in range(2):
        response = _posted(Twice.as_view(), key)
        assert response.status_code == 500
        assert _slug(response) == "idempotency-misconfigured"
    assert runs == []
    assert stored() == []


@pytest.mark.parametrize("status", [409, 422, 400])
def test_the_apps_own_problem_is_never_stored_as_a_views_response(status: int, key: str) -> None:
    """A problem of the app's own reaching an outer layer (a protected call inside the view
    answered it) is not the view's answer: never stored, the retry runs again."""
    from django_idempotency._http import problems

    runs: list[int] = []

    def view(request: HttpRequest) -> HttpResponse:
        runs.append(1)
        if status == 409:
            return problems.in_progress(1)
        if status == 422:
            return problems.key_reuse(422)
        return problems.invalid_key("inner")

    protected = idempotent(view)
    for _ in range(2):
        assert _posted(protected, key).status_code == status
    assert runs == [1, 1]
    assert stored() == []
