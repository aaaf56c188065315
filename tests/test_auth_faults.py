"""A database fault in a framework's own authentication, before ``@idempotent`` runs: with the
app's exception handler (DRF's ``EXCEPTION_HANDLER``, ninja's ``add_exception_handler``) it is
``503 idempotency-unavailable`` with ``Retry-After``, nothing is claimed and the view does not
run; once the database answers, the client's retry runs as a first request. Without the
handler it is the framework's uncaught exception, Django's ``500`` (the control). The fault is
real: the token table is read from a database that refuses connections (a SQLite file that
cannot be opened)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError, OperationalError, ProgrammingError, connections
from django.db.utils import load_backend
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client, override_settings
from django.urls import path
from ninja import NinjaAPI, Router
from ninja.security import APIKeyHeader
from rest_framework.authentication import TokenAuthentication
from rest_framework.authtoken.models import Token
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import IdempotencyKey, idempotent
from django_idempotency import ninja as idempotent_ninja
from django_idempotency._store import served
from django_idempotency.rest_framework import IdempotencyMixin, exception_handler
from tests.conftest import executions, unreachable
from tests.test_fault_answers import assert_unavailable
from tests.testapp.models import Execution

pytestmark = [
    pytest.mark.urls(__name__),
    pytest.mark.django_db(databases=["default", "unreachable"]),
]


def _ran(request: Any) -> dict[str, Any]:
    return {"execution": Execution.objects.create(label="auth-faults").pk}


@api_view(["POST"])
@idempotent
def drf_under(request: Request) -> Response:
    """``@idempotent`` under ``@api_view``: DRF's default classes (a token first)."""
    return Response(_ran(request), status=201)


@api_view(["POST"])
@authentication_classes([TokenAuthentication])
@permission_classes([IsAuthenticated])
@idempotent
def drf_policy(request: Request) -> Response:
    """The other order that works: DRF's policy decorators between."""
    return Response(_ran(request), status=201)


@api_view(["POST"])
def drf_wrong_statement(request: Request) -> Response:
    raise ProgrammingError("no such column: nope")


@api_view(["POST"])
@idempotent
def drf_beside(request: Request) -> Response:
    """Reads a table the database beside the project's lacks (a SQLite file's ``no such
    table``, an ``OperationalError`` without a SQLSTATE): a bug, never a fault to retry."""
    return Response({"rows": Execution.objects.using(BESIDE).count()}, status=201)


BESIDE = "beside"


class KeyInTheDatabase(APIKeyHeader):
    """An API key read from the token table, as most projects keep theirs."""

    param_name = "X-API-Key"

    def authenticate(self, request: HttpRequest, key: str | None) -> Any:
        found = Token.objects.select_related("user").filter(key=key).first()
        return None if found is None else found.user


class WritesThenReadsToken(TokenAuthentication):
    """Authentication that writes in the request's transaction before the token is read."""

    def authenticate(self, request: Any) -> Any:
        Execution.objects.create(label="before-the-fault")
        return super().authenticate(request)


class WritesThenReadsKey(KeyInTheDatabase):
    def authenticate(self, request: HttpRequest, key: str | None) -> Any:
        Execution.objects.create(label="before-the-fault")
        return super().authenticate(request, key)


@api_view(["POST"])
@authentication_classes([WritesThenReadsToken])
@permission_classes([IsAuthenticated])
@idempotent
def drf_writes(request: Request) -> Response:
    return Response(_ran(request), status=201)


class MixinWrites(IdempotencyMixin, APIView):
    authentication_classes = [WritesThenReadsToken]
    permission_classes = [IsAuthenticated]

    def post(self, request: Request) -> Response:
        return Response(_ran(request), status=201)


def _api(name: str, *, handled: bool) -> NinjaAPI:
    api = NinjaAPI(urls_namespace=name)
    if handled:
        api.add_exception_handler(DatabaseError, idempotent_ninja.exception_handler)

    @api.post("/operation", auth=KeyInTheDatabase())
    @idempotent_ninja.idempotent
    def operation(request: HttpRequest) -> dict[str, Any]:
        return _ran(request)

    router = Router(auth=KeyInTheDatabase())

    @router.post("/decorated")
    def decorated(request: HttpRequest) -> dict[str, Any]:
        return _ran(request)

    router.add_decorator(idempotent_ninja.idempotent)  # ninja's default mode
    api.add_router("/router", router)

    @api.post("/writes", auth=WritesThenReadsKey())
    @idempotent_ninja.idempotent
    def writes(request: HttpRequest) -> dict[str, Any]:
        return _ran(request)

    @api.post("/beside", auth=KeyInTheDatabase())
    @idempotent_ninja.idempotent
    def beside(request: HttpRequest) -> dict[str, Any]:
        return {"rows": Execution.objects.using(BESIDE).count()}

    return api


def _chained_api() -> NinjaAPI:
    """docs/ninja.rst's chain: the project's own handler of every exception still answers the
    database errors that are no fault."""
    api = NinjaAPI(urls_namespace="auth-faults-chained")

    @api.exception_handler(Exception)
    def server_error(request: HttpRequest, exc: Exception) -> HttpResponse:
        return JsonResponse({"error": type(exc).__name__}, status=500)

    @api.exception_handler(DatabaseError)
    def database_error(request: HttpRequest, exc: Exception) -> HttpResponse:
        try:
            return idempotent_ninja.exception_handler(request, exc)  # a 503 for a fault
        except DatabaseError:
            return server_error(request, exc)  # any other: your handler's, as without it

    @api.post("/operation", auth=KeyInTheDatabase())
    @idempotent_ninja.idempotent
    def operation(request: HttpRequest) -> dict[str, Any]:
        return _ran(request)

    @api.post("/wrong-statement")
    def wrong_statement(request: HttpRequest) -> dict[str, Any]:
        raise ProgrammingError("no such column: nope")

    return api


urlpatterns = [
    path("drf/under/", drf_under),
    path("drf/policy/", drf_policy),
    path("drf/wrong-statement/", drf_wrong_statement),
    path("drf/writes/", drf_writes),
    path("drf/mixin-writes/", MixinWrites.as_view()),
    path("drf/beside/", drf_beside),
    path("ninja/", _api("auth-faults", handled=True).urls),
    path("ninja-unhandled/", _api("auth-faults-unhandled", handled=False).urls),
    path("ninja-chained/", _chained_api().urls),
]

DRF_PATHS = ["/drf/under/", "/drf/policy/"]
NINJA_PATHS = ["/ninja/operation", "/ninja/router/decorated"]


class TokensUnreachable:
    """The token table is read from the database that is down (the rest is up)."""

    def db_for_read(self, model: type, **hints: Any) -> str | None:
        return "unreachable" if model._meta.app_label == "authtoken" else None


@pytest.fixture
def token() -> str:
    return Token.objects.create(user=User.objects.create_user("reader")).key


@contextmanager
def tokens_unreachable() -> Iterator[None]:
    with unreachable(), override_settings(DATABASE_ROUTERS=[f"{__name__}.TokensUnreachable"]):
        yield


def _headers(path: str, token: str, key: str) -> dict[str, str]:
    ninja = path.startswith("/ninja")
    credential = {"X-API-Key": token} if ninja else {"Authorization": f"Token {token}"}
    return {"Idempotency-Key": key, **credential}


def _post(client: Client, path: str, token: str, key: str) -> Any:
    headers = _headers(path, token, key)
    return client.post(path, {}, content_type="application/json", headers=headers)


HANDLED = {"EXCEPTION_HANDLER": "django_idempotency.rest_framework.exception_handler"}


@pytest.mark.parametrize("path", DRF_PATHS + NINJA_PATHS)
def test_a_fault_in_authentication_is_503_and_the_retry_runs_once_it_is_over(
    client: Client, token: str, path: str
) -> None:
    key = str(uuid.uuid4())
    with override_settings(REST_FRAMEWORK=HANDLED), tokens_unreachable():
        assert_unavailable(_post(client, path, token, key))
        assert executions() == 0
        assert not IdempotencyKey.objects.exists()
    with override_settings(REST_FRAMEWORK=HANDLED):
        first = _post(client, path, token, key)
        replay = _post(client, path, token, key)
    assert first.status_code in (200, 201), first.content
    assert replay.content == first.content and replay["Idempotent-Replayed"] == "true"
    assert executions() == 1


@pytest.mark.parametrize("path", [*DRF_PATHS, "/ninja-unhandled/operation"])
def test_without_the_handler_the_fault_is_the_frameworks_uncaught_exception(
    client: Client, token: str, path: str
) -> None:
    """The control: DRF's default handler and ninja without one let it through (a ``500``)."""
    with tokens_unreachable(), pytest.raises(OperationalError):
        _post(client, path, token, str(uuid.uuid4()))


def test_other_errors_are_drfs_default_handlers(client: Client, token: str) -> None:
    """A wrong statement stays an uncaught exception; DRF's own exceptions keep their
    answers (a token it does not know: ``401``)."""
    with override_settings(REST_FRAMEWORK=HANDLED):
        with pytest.raises(ProgrammingError):
            client.post("/drf/wrong-statement/", {}, content_type="application/json")
        refused = _post(client, "/drf/policy/", "not-a-token", str(uuid.uuid4()))
    assert refused.status_code == 401
    assert exception_handler(ProgrammingError("x"), {}) is None


@pytest.mark.parametrize("path", ["/drf/writes/", "/drf/mixin-writes/", "/ninja/writes"])
def test_under_atomic_requests_the_503_rolls_the_requests_transaction_back(
    client: Client, token: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Answered rather than raised, the fault would leave ``ATOMIC_REQUESTS``' transaction to
    commit: on a lost connection the commit raised, a ``500`` after the ``503`` (ninja's
    handler, and the mixin's own answer, seen on PostgreSQL with a terminated session), and
    what the request wrote before the fault was kept. DRF's handler rolled back already."""
    monkeypatch.setitem(connections["default"].settings_dict, "ATOMIC_REQUESTS", True)
    with override_settings(REST_FRAMEWORK=HANDLED), tokens_unreachable():
        assert_unavailable(_post(client, path, token, str(uuid.uuid4())))
    assert not Execution.objects.filter(label="before-the-fault").exists()
    assert not IdempotencyKey.objects.exists()


@contextmanager
def sqlite_beside() -> Iterator[None]:
    """A SQLite database beside the project's own, under an alias of its own (a local or a
    legacy one; its tables not made), as the project's settings would name it."""
    given = {"default": {}, BESIDE: {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
    settings = connections.configure_settings(given)[BESIDE]
    beside = load_backend(settings["ENGINE"]).DatabaseWrapper(settings, BESIDE)
    # Connected before the test case sees the alias, which it would refuse as not its own (an
    # in-memory database stays connected between requests).
    beside.ensure_connection()
    connections[BESIDE] = beside
    connections.settings[BESIDE] = settings
    try:
        yield
    finally:
        connections[BESIDE].close()
        del connections[BESIDE]
        del connections.settings[BESIDE]


@pytest.mark.parametrize("path", ["/drf/beside/", "/ninja/beside"])
def test_another_databases_wrong_statement_is_no_fault(
    client: Client, token: str, path: str
) -> None:
    """A store judges only its own driver's errors: PostgreSQL's driver raises an
    ``OperationalError`` without a SQLSTATE only for a lost connection, but SQLite's ``no
    such table`` (and MySQL's unknown column) is one too; with a PostgreSQL store it was a
    ``503`` that asked the client to retry a bug forever. It stays the ``500`` it is; the
    SQLite store's own judgement is unchanged (a file it cannot open is a fault)."""
    with override_settings(REST_FRAMEWORK=HANDLED), sqlite_beside():
        with pytest.raises(OperationalError, match="no such table"):
            _post(client, path, token, str(uuid.uuid4()))
        with pytest.raises(OperationalError) as raised:
            Execution.objects.using(BESIDE).count()
        assert not any(
            (store := served(alias)) is not None and store.is_transient(raised.value)
            for alias in connections
        )
    assert not IdempotencyKey.objects.exists()


def test_a_handler_of_the_projects_reads_and_changes_the_503s_data(
    client: Client, token: str
) -> None:
    """DRF's docs' custom handler sets ``response.data["status_code"]``: on the ``503`` (a plain
    ``HttpResponse``, no ``data``) it raised ``AttributeError``, a ``500``. The ``503`` has its
    problem as ``data``, what the handler adds is rendered, always as problem JSON."""
    chained = {"EXCEPTION_HANDLER": f"{__name__}.handler_of_the_project"}
    with override_settings(REST_FRAMEWORK=chained), tokens_unreachable():
        response = _post(client, "/drf/under/", token, str(uuid.uuid4()))
        browser = client.post(
            "/drf/under/",
            {},
            content_type="application/json",
            headers={**_headers("/drf/under/", token, str(uuid.uuid4())), "Accept": "text/html"},
        )
    for answer in (response, browser):
        assert_unavailable(answer)
        assert answer["Content-Type"] == "application/problem+json"
        assert answer.json()["status_code"] == 503
        assert answer["Cache-Control"] == "no-store"
    assert executions() == 0


def handler_of_the_project(exc: Exception, context: dict[str, Any]) -> Any:
    response = exception_handler(exc, context)
    if response is not None:
        response.data["status_code"] = response.status_code
    return response


def test_the_projects_own_handler_answers_other_database_errors(client: Client, token: str) -> None:
    """docs/ninja.rst's chain: ninja looks a handler up by the exception's class, so the app's
    handler for ``DatabaseError`` comes before the project's for ``Exception``; it raises a
    wrong statement again, which the chain hands to the project's handler."""
    wrong = client.post("/ninja-chained/wrong-statement", {}, content_type="application/json")
    assert wrong.status_code == 500 and wrong.json() == {"error": "ProgrammingError"}
    with tokens_unreachable():
        assert_unavailable(_post(client, "/ninja-chained/operation", token, str(uuid.uuid4())))
    assert executions() == 0
