"""Issue 20: unusual input from clients and settings gets a clear answer, never a 500 and never
two executions of one key. Each test goes through a public entry point (a view, a DRF view,
the settings and their checks)."""

from __future__ import annotations

import hashlib
import math
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.conf import settings
from django.core.checks import CheckMessage, Tags, run_checks
from django.core.exceptions import ImproperlyConfigured
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.handlers.asgi import ASGIHandler
from django.db import connections
from django.http import HttpRequest
from django.test import Client, override_settings
from rest_framework.views import APIView

from django_idempotency import IdempotencyKey, idempotent, idempotent_function
from django_idempotency.rest_framework import IdempotencyMixin
from tests.conftest import executions, problem_slug

pytestmark = [pytest.mark.urls("tests.hostile_urls"), pytest.mark.django_db]


def checks(tag: str) -> list[CheckMessage]:
    """The app's system check messages with ``tag``, as ``manage.py check`` finds them."""
    return [m for m in run_checks(tags=[tag]) if (m.id or "").startswith("django_idempotency.")]


def send(
    path: str, body: bytes, key: str | None, content_type: str = "application/json", **extra: Any
) -> Any:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return Client().post(path, body, content_type=content_type, headers=headers, **extra)


# --- a view's TTL shorter than its lock timeout ------------------------------------------------


def test_ttl_under_lock_timeout_is_refused_when_the_view_is_made() -> None:
    with pytest.raises(ImproperlyConfigured, match="shorter than lock_timeout"):
        idempotent(ttl=1, lock_timeout=60)
    with pytest.raises(ImproperlyConfigured, match="shorter than lock_timeout"):
        idempotent_function(key="message_id", ttl=1, lock_timeout=60)
    with pytest.raises(ImproperlyConfigured, match="shorter than lock_timeout"):

        class View(IdempotencyMixin, APIView):
            idempotency_ttl = 1
            idempotency_lock_timeout = 60


def test_ttl_under_the_settings_lock_timeout_fails_the_system_check() -> None:
    messages = checks(Tags.urls)
    assert [(m.id, "short_ttl" in m.msg) for m in messages] == [("django_idempotency.E033", True)]
    with override_settings(IDEMPOTENCY={"LOCK_TIMEOUT": 0.1}):
        assert checks(Tags.urls) == []


def test_ttl_under_lock_timeout_never_runs_a_key_twice(key: str) -> None:
    """Were the record to expire after its 0.2 s TTL, the duplicate would take it over and run."""
    response = send("/short-ttl/", b"{}", key)
    assert response.status_code == 200
    assert response.json()["duplicate"] == 409
    assert executions("short-ttl") == 1


# --- bad durations, in settings and in options -------------------------------------------------

BAD_DURATIONS = [math.nan, math.inf, -math.inf, 10**15, timedelta.max, 1e300]


@pytest.mark.parametrize("value", BAD_DURATIONS)
def test_bad_ttl_setting_is_a_check_error_not_a_crash(value: Any) -> None:
    with override_settings(IDEMPOTENCY={"TTL": value}):
        assert [m.id for m in checks(Tags.compatibility)] == ["django_idempotency.E005"]


@pytest.mark.parametrize("value", BAD_DURATIONS)
def test_bad_ttl_option_is_improperly_configured(value: Any) -> None:
    with pytest.raises(ImproperlyConfigured):
        idempotent(ttl=value)
    with pytest.raises(ImproperlyConfigured):

        class View(IdempotencyMixin, APIView):
            idempotency_ttl = value


@pytest.mark.parametrize("value", [0, -1, "1 day", True])
def test_bad_mixin_attribute_fails_when_the_class_is_made(value: Any) -> None:
    with pytest.raises(ImproperlyConfigured):

        class View(IdempotencyMixin, APIView):
            idempotency_ttl = value


def test_a_bad_setting_that_slipped_past_the_checks_says_which(
    key: str, caplog: pytest.LogCaptureFixture
) -> None:
    with override_settings(IDEMPOTENCY={"TTL": timedelta.max}):
        response = send("/echo/", b"{}", key)
    # A problem, not a traceback; the log names the setting (issue 38).
    assert problem_slug(response) == "idempotency-misconfigured"
    assert "IDEMPOTENCY['TTL']" in caplog.text


# --- JSON bodies -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b'{"emoji": "\\ud83d"}',  # a lone surrogate escape
        b'["\\udc80", "\\ud800\\udc00"]',
        b"[" * 50_000 + b"]" * 50_000,  # deeper than Python's recursion limit
        b'{"a": ' * 5_000 + b"1" + b"}" * 5_000,
        b"1" * 10_000,  # more digits than int() converts
        b'{"a": NaN, "b": -Infinity}',
    ],
)
def test_odd_json_is_fingerprinted_and_replayed(body: bytes, key: str) -> None:
    first = send("/echo/", body, key)
    assert first.status_code == 201
    replay = send("/echo/", body, key)
    assert replay.status_code == 201
    assert replay["Idempotent-Replayed"] == "true"
    assert replay.content == first.content
    assert executions("echo") == 1
    assert send("/echo/", body + b" 0", key).status_code == 422


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (b'{"amount": 0.1}', b'{"amount": 0.10000000000000000001}'),
        (b'{"amount": 1}', b'{"amount": 1.0}'),
        (b'{"amount": 1.0}', b'{"amount": 1.00}'),
        (b'{"amount": 100}', b'{"amount": 1e2}'),
        (b'{"n": 12345678901234567890}', b'{"n": 12345678901234567891}'),
        (b'{"a": "\\ud83d"}', b'{"a": "\\ud83e"}'),
        (b'{"a": 1, "a": 2}', b'{"a": 2}'),
    ],
)
def test_json_that_reads_differently_is_another_request(
    first: bytes, second: bytes, key: str
) -> None:
    assert send("/echo/", first, key).status_code == 201
    assert problem_slug(send("/echo/", second, key)) == "idempotency-key-reuse"
    assert executions("echo") == 1


def test_the_same_bytes_as_json_and_as_text_are_two_requests(key: str) -> None:
    """Found by tests/test_properties.py: text "[]" is not JSON " []", canonical or not."""
    assert send("/echo/", b" []", key).status_code == 201
    assert problem_slug(send("/echo/", b"[]", key, "text/plain")) == "idempotency-key-reuse"


def test_json_key_order_and_whitespace_still_do_not_count(key: str) -> None:
    assert send("/echo/", b'{"b": [1, 2.50], "a": "\\u00e9"}', key).status_code == 201
    replay = send("/echo/", '{"a":"é",\n "b":[1,2.50]}'.encode(), key)
    assert replay["Idempotent-Replayed"] == "true"


# --- the key header ----------------------------------------------------------------------------


@pytest.mark.parametrize("header", ["k1, k2", "k1,k2", '"k1", "k2"', '"k1",k2', "k1,"])
def test_two_key_values_are_400(header: str) -> None:
    response = send("/echo/", b"{}", header)
    assert problem_slug(response) == "invalid-idempotency-key"
    assert executions() == 0


def test_a_quoted_key_may_contain_a_comma() -> None:
    assert send("/echo/", b"{}", '"k1, k2"').status_code == 201


def test_two_header_lines_over_asgi_are_400() -> None:
    """Django's ASGI handler joins repeated header lines with ","; WSGI servers do the same."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/echo/",
        "raw_path": b"/echo/",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"testserver"),
            (b"content-type", b"application/json"),
            (b"idempotency-key", b"k1"),
            (b"idempotency-key", b"k2"),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
    }

    async def call() -> tuple[int, bytes]:
        app = ApplicationCommunicator(ASGIHandler(), scope)
        await app.send_input({"type": "http.request", "body": b"{}", "more_body": False})
        start = await app.receive_output(10)
        body = await app.receive_output(10)
        return start["status"], body["body"]

    status, body = async_to_sync(call)()
    assert status == 400
    assert b"invalid-idempotency-key" in body
    assert executions() == 0


# --- form uploads and large bodies -------------------------------------------------------------


def _upload(key: str | None, content: bytes, client: Client | None = None, **fields: Any) -> Any:
    client = client or Client()
    headers = {"Idempotency-Key": key} if key is not None else {}
    data = {"note": "hello", **fields, "file": SimpleUploadedFile("a.bin", content)}
    return client.post("/upload/", data, headers=headers)


def test_form_upload_behind_csrf_protection(key: str) -> None:
    client = Client(enforce_csrf_checks=True)
    token = "a" * 32
    client.cookies["csrftoken"] = token
    first = _upload(key, b"x" * 1000, client, csrfmiddlewaretoken=token)
    assert first.status_code == 201, first.content
    replay = _upload(key, b"x" * 1000, client, csrfmiddlewaretoken=token)
    assert replay["Idempotent-Replayed"] == "true"
    assert replay.content == first.content
    changed = _upload(key, b"y" * 1000, client, csrfmiddlewaretoken=token)
    assert problem_slug(changed) == "idempotency-key-reuse"
    assert executions("upload") == 1


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000, FILE_UPLOAD_MAX_MEMORY_SIZE=500)
def test_file_over_the_memory_limit_is_accepted_and_fingerprinted(key: str) -> None:
    """Django's DATA_UPLOAD_MAX_MEMORY_SIZE does not apply to files, so nor does ours."""
    big = bytes(range(256)) * 40
    first = _upload(key, big)
    assert first.status_code == 201, first.content
    assert first.json()["files"] == {"file": hashlib.sha256(big).hexdigest()}
    assert _upload(key, big)["Idempotent-Replayed"] == "true"
    assert problem_slug(_upload(key, big[:-1] + b"!")) == "idempotency-key-reuse"
    assert problem_slug(_upload(key, big, note="other")) == "idempotency-key-reuse"
    assert executions("upload") == 1


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000, FILE_UPLOAD_MAX_MEMORY_SIZE=500)
@pytest.mark.parametrize("with_key", [True, False])
def test_drf_upload_over_the_memory_limit(with_key: bool) -> None:
    """Without a key the mixin must not read the body at all: the view runs as if undecorated."""
    headers = {"Idempotency-Key": str(uuid.uuid4())} if with_key else {}
    big = SimpleUploadedFile("a.bin", b"z" * 5000)
    response = Client().post("/drf-upload/", {"file": big}, headers=headers)
    assert response.status_code == 201, response.content
    assert response.json()["files"] == {"file": 5000}


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000, FILE_UPLOAD_MAX_MEMORY_SIZE=500)
def test_large_raw_body_is_refused_with_a_key_and_left_for_the_view_without(key: str) -> None:
    """A keyed body is read whole for its fingerprint: within Django's limit, or 413 unread
    (issue 48); without a key the view streams it as it would without the app."""
    big = bytes(range(256)) * 1000
    first = send("/stream/", big, key, "application/octet-stream")
    assert first.status_code == 413, first.content
    assert problem_slug(first) == "request-body-too-large"
    assert executions("stream") == 0
    assert not IdempotencyKey.objects.exists()
    unkeyed = send("/stream/", big, None, "application/octet-stream")
    assert unkeyed.json()["sha256"] == hashlib.sha256(big).hexdigest()
    fits = send("/stream/", big[:1000], key, "application/octet-stream")
    assert fits.json()["sha256"] == hashlib.sha256(big[:1000]).hexdigest()
    assert send("/stream/", big[:1000], key, "application/octet-stream").content == fits.content
    assert executions("stream") == 2


# --- the fingerprint function ------------------------------------------------------------------


def sha512_fingerprint(request: HttpRequest, scope: str) -> str:
    return hashlib.sha512(request.body + scope.encode()).hexdigest()


@override_settings(IDEMPOTENCY={"FINGERPRINT_FUNCTION": sha512_fingerprint})
def test_a_longer_fingerprint_is_fitted_to_the_column(key: str) -> None:
    first = send("/echo/", b'{"a": 1}', key)
    assert first.status_code == 201
    (stored,) = IdempotencyKey.objects.values_list("request_hash", flat=True)
    assert len(stored) == 64
    assert send("/echo/", b'{"a": 1}', key)["Idempotent-Replayed"] == "true"
    assert problem_slug(send("/echo/", b'{"a": 2}', key)) == "idempotency-key-reuse"


# --- DRF ---------------------------------------------------------------------------------------


@pytest.fixture
def atomic_requests() -> Iterator[None]:
    """ATOMIC_REQUESTS on the claims' database, as a project whose protected views are all
    atomic has it: with E019 silenced, which otherwise stops the app (docs/checks.rst)."""
    settings_dict = connections["default"].settings_dict
    settings_dict["ATOMIC_REQUESTS"] = True
    try:
        with override_settings(SILENCED_SYSTEM_CHECKS=["django_idempotency.E019"]):
            yield
    finally:
        settings_dict["ATOMIC_REQUESTS"] = False


def test_drf_atomic_400_under_atomic_requests(atomic_requests: None, key: str) -> None:
    """DRF marks the request's transaction for rollback: nothing of the attempt is kept."""
    response = send("/drf-atomic-validating/", b"{}", key)
    assert response.status_code == 400
    assert "name" in response.json()
    assert IdempotencyKey.objects.count() == 0
    assert executions() == 0
    retried = send("/drf-atomic-validating/", b'{"name": "x"}', key)
    assert retried.status_code == 201
    assert send("/drf-atomic-validating/", b'{"name": "x"}', key)["Idempotent-Replayed"] == "true"


def test_drf_atomic_5xx_under_atomic_requests(atomic_requests: None, key: str) -> None:
    """A retryable status in a transaction DRF marked for rollback: released with it, never a
    query in the broken transaction (a TransactionManagementError, a 500 of ours)."""
    response = send("/drf-atomic-unavailable/", b'{"fail": true}', key)
    assert response.status_code == 503
    assert response.json() == {"detail": "downstream down"}
    assert IdempotencyKey.objects.count() == 0
    assert executions() == 0  # rolled back with the request's transaction
    retried = send("/drf-atomic-unavailable/", b'{"fail": true}', key)
    assert retried.status_code == 503
    assert "Idempotent-Replayed" not in retried


def test_drf_method_not_allowed_is_untouched(key: str) -> None:
    assert send("/drf-get-only/", b"{}", key=None).status_code == 405
    with_key = send("/drf-get-only/", b"{}", key)
    assert with_key.status_code == 405
    assert "Idempotent-Replayed" not in send("/drf-get-only/", b"{}", key)
    assert IdempotencyKey.objects.count() == 0
    assert send("/drf-post-only/", b"{}", key).status_code == 201
    patch = Client().patch(
        "/drf-post-only/", b"{}", content_type="application/json", headers={"Idempotency-Key": key}
    )
    assert patch.status_code == 405


# --- SQLite under ATOMIC_REQUESTS --------------------------------------------------------------


@override_settings(IDEMPOTENCY={"DATABASE_ALIAS": "idempotency"})
def test_sqlite_atomic_requests_with_a_second_alias_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The request's transaction would hold the file's only write lock: every claim waits."""
    sqlite = {"ENGINE": "django.db.backends.sqlite3", "NAME": "/tmp/app.sqlite3"}
    # Not override_settings(DATABASES=...), which warns: only the check reads them here.
    databases = {"default": {**sqlite, "ATOMIC_REQUESTS": True}, "idempotency": sqlite}
    monkeypatch.setattr(settings, "DATABASES", databases)
    assert [m.id for m in checks(Tags.compatibility)] == ["django_idempotency.E032"]
    databases["idempotency"] = {**sqlite, "NAME": "/tmp/other.sqlite3"}
    assert checks(Tags.compatibility) == []
