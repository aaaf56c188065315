"""A keyed request's body is read only when its claim is due, within Django's limit, and leaves
no file open behind it (issue 48, item 4).

Before: with a key, a 200 MiB body to an ``IsAuthenticated`` DRF view was read (and 195 MiB
spooled to disk) before DRF answered ``401``; spooled files stayed open, deleted, until the
cycle collector ran. Each test counts the bytes the application took from ``wsgi.input``.
"""

from __future__ import annotations

import gc
import io
import json
import os
import select
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.handlers.asgi import ASGIHandler
from django.test import Client, RequestFactory, override_settings
from rest_framework.authtoken.models import Token

from django_idempotency._http import bodies
from django_idempotency._http.fingerprints import request_fingerprint
from tests.conftest import executions, problem_slug
from tests.servers import harness

pytestmark = [pytest.mark.urls("tests.body_urls"), pytest.mark.django_db]

LIMIT = 1000
BIG = json.dumps({"blob": "x" * 50_000}).encode()
SMALL = b'{"n": 1}'


class CountingInput:
    """``wsgi.input`` that counts the bytes the application read from it."""

    def __init__(self, inner: Any, counter: list[int]) -> None:
        self.inner, self.counter = inner, counter

    def read(self, *args: Any) -> bytes:
        data: bytes = self.inner.read(*args)
        self.counter[0] += len(data)
        return data

    def readline(self, *args: Any) -> bytes:
        data: bytes = self.inner.readline(*args)
        self.counter[0] += len(data)
        return data

    def close(self) -> None:
        pass


class CountingClient(Client):
    """A test client whose last request's body reads are counted in ``self.read``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.counter = [0]

    def _base_environ(self, **request: Any) -> dict[str, Any]:
        environ: dict[str, Any] = super()._base_environ(**request)
        self.counter[0] = 0
        environ["wsgi.input"] = CountingInput(environ["wsgi.input"], self.counter)
        return environ

    @property
    def read(self) -> int:
        return self.counter[0]


def send(client: Client, path: str, body: bytes, *, key: bool = True, **headers: str) -> Any:
    if key:
        headers["Idempotency-Key"] = str(uuid.uuid4())
    return client.post(path, body, content_type="application/json", headers=headers)


@pytest.fixture
def token() -> str:
    user = User.objects.create_user("alice", password="pw")
    return Token.objects.create(user=user).key


# --- a request the framework refuses is not read ---------------------------------------------


@pytest.mark.parametrize("path", ["/mixin/", "/function/"])
@pytest.mark.parametrize("key", [True, False], ids=["key", "no-key"])
def test_drf_refuses_an_unauthenticated_request_without_reading_it(path: str, key: bool) -> None:
    client = CountingClient()
    response = send(client, path, BIG, key=key)
    assert response.status_code in (401, 403), response.content
    assert client.read == 0
    assert executions() == 0


def test_drf_refuses_a_bad_token_without_reading_the_body() -> None:
    client = CountingClient()
    response = send(client, "/mixin/", BIG, Authorization="Token nonsense")
    assert response.status_code == 401
    assert client.read == 0


def test_ninja_auth_refuses_without_reading_the_body() -> None:
    client = CountingClient()
    response = send(client, "/ninja/raw", BIG, Authorization="Bearer bad")
    assert response.status_code == 401
    assert client.read == 0


def test_login_required_refuses_without_reading_the_body() -> None:
    client = CountingClient()
    response = send(client, "/logged-in/", BIG)
    assert response.status_code == 302
    assert client.read == 0


# --- a keyed body over the limit is refused before it is read ------------------------------------


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=LIMIT)
@pytest.mark.parametrize("path", ["/mixin/", "/function/", "/plain/", "/stream/", "/ninja/raw"])
def test_a_keyed_body_over_the_limit_is_413_before_it_is_read(path: str, token: str) -> None:
    client = CountingClient()
    if path.startswith("/ninja/"):
        token = "good"
    auth = f"Bearer {token}" if path.startswith("/ninja/") else f"Token {token}"
    response = send(client, path, BIG, Authorization=auth)
    assert response.status_code == 413, response.content
    assert problem_slug(response) == "request-body-too-large"
    assert "DATA_UPLOAD_MAX_MEMORY_SIZE (1,000 bytes)" in response.json()["detail"]
    assert client.read == 0
    # Within the limit, the same view runs, its body read once, whole.
    small = send(client, path, SMALL, Authorization=auth)
    assert small.status_code == 201, small.content
    assert client.read == len(SMALL)


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=LIMIT)
def test_without_a_key_the_view_reads_its_body_as_without_the_app() -> None:
    client = CountingClient()
    response = send(client, "/stream/", BIG, key=False)
    assert response.status_code == 201
    assert response.json() == {"length": len(BIG)}


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=LIMIT)
@pytest.mark.parametrize(
    ("path", "content_type"), [("/mixin/", "application/json"), ("/text/", "text/plain")]
)
def test_session_csrf_check_reads_the_body_once_within_the_limit(
    path: str, content_type: str
) -> None:
    """DRF's SessionAuthentication parses the body for its CSRF check, inside authentication
    (through ``request.body`` for JSON, through the stream for other parsers): the body is kept
    for the fingerprint then, and bounded as the claim would bound it."""
    User.objects.create_user("bob", password="pw")
    client = CountingClient(enforce_csrf_checks=True)
    client.login(username="bob", password="pw")
    client.cookies["csrftoken"] = "a" * 32
    headers = {"X-CSRFToken": "a" * 32, "Idempotency-Key": str(uuid.uuid4())}

    def post(body: bytes) -> Any:
        return client.post(path, body, content_type=content_type, headers=headers)

    first = post(SMALL)
    assert first.status_code == 201, first.content
    assert client.read == len(SMALL)
    replay = post(SMALL)
    assert replay["Idempotent-Replayed"] == "true"
    assert replay.content == first.content
    assert problem_slug(post(b'{"n": 2}')) == "idempotency-key-reuse"
    headers["Idempotency-Key"] = str(uuid.uuid4())
    too_big = post(BIG)
    assert too_big.status_code == 413, too_big.content
    assert problem_slug(too_big) == "request-body-too-large"
    assert client.read == 0


def test_a_body_of_unknown_length_is_read_one_byte_past_the_limit_at_most() -> None:
    """``Transfer-Encoding: chunked`` on a server that passes it on: no ``Content-Length``."""
    counter = [0]
    request = RequestFactory().post("/plain/", b"x" * 100_000, content_type="text/plain")
    del request.META["CONTENT_LENGTH"]
    request._stream = CountingInput(io.BytesIO(b"x" * 100_000), counter)  # type: ignore[attr-defined]
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=LIMIT), pytest.raises(bodies.BodyTooLarge):
        request_fingerprint(request, "scope")
    assert counter[0] == LIMIT + 1


def test_a_chunked_body_reaches_a_wsgi_view_empty_and_so_does_its_fingerprint() -> None:
    """What docs/http-contract.rst says of WSGI servers (gunicorn): without ``CONTENT_LENGTH``
    Django's ``WSGIRequest`` reads no body, so two chunked bodies are one request."""
    from django.core.handlers.wsgi import WSGIRequest

    def chunked(body: bytes) -> WSGIRequest:
        environ = RequestFactory().post("/plain/", body, content_type="text/plain").environ
        del environ["CONTENT_LENGTH"]
        environ["HTTP_TRANSFER_ENCODING"] = "chunked"
        environ["wsgi.input"] = io.BytesIO(body)
        return WSGIRequest(environ)

    first, second = chunked(b"amount=1"), chunked(b"amount=2")
    assert (first.body, second.body) == (b"", b"")
    assert request_fingerprint(chunked(b"amount=1"), "s") == request_fingerprint(
        chunked(b"amount=2"), "s"
    )


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=LIMIT)
def test_an_asgi_body_over_the_limit_is_413_without_reading_it_into_memory() -> None:
    """On ASGI Django has buffered the body before any view; its size is known, unread."""

    async def call() -> tuple[int, bytes]:
        app = ASGIHandler()
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/plain/",
            "query_string": b"",
            "headers": [(b"idempotency-key", b"k-asgi"), (b"content-type", b"text/plain")],
        }
        communicator = ApplicationCommunicator(app, scope)
        await communicator.send_input({"type": "http.request", "body": BIG, "more_body": False})
        start = await communicator.receive_output(10)
        body = await communicator.receive_output(10)
        await communicator.wait(10)
        return start["status"], body["body"]

    status, body = async_to_sync(call)()
    assert status == 413
    assert b"request-body-too-large" in body


# --- no file outlives its request ----------------------------------------------------------------


def open_deleted_files() -> int:
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").endswith(" (deleted)"):
                count += 1
        except OSError:
            continue
    return count


@pytest.fixture
def no_cycle_collector() -> Iterator[None]:
    """What is left to the cycle collector stays open: 550 MiB after 8 requests, before."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=LIMIT, FILE_UPLOAD_MAX_MEMORY_SIZE=500)
def test_no_temporary_file_stays_open_after_its_request(
    token: str, no_cycle_collector: None
) -> None:
    before = open_deleted_files()
    client = Client()
    auth = {"Authorization": f"Token {token}"}
    for _ in range(8):
        for path in ("/mixin/", "/function/", "/stream/"):
            send(client, path, BIG, **auth)  # 413 now; spooled to disk before
            assert send(client, path, b"[" + b"1," * 400 + b"1]", **auth).status_code == 201
        upload = SimpleUploadedFile("a.bin", b"z" * 5000)  # on disk: over 500 bytes
        headers = {"Idempotency-Key": str(uuid.uuid4())}
        response = client.post("/upload/", {"file": upload}, headers=headers)
        assert response.json() == {"files": {"file": 5000}}
    assert open_deleted_files() == before


# --- under gunicorn, counted by a client that streams the body ---------------------------------


@pytest.fixture(scope="module")
def gunicorn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Server]:
    """One sync worker; its requests never reach the database, which need not exist."""
    database = str(tmp_path_factory.mktemp("gunicorn") / "unused.sqlite3")
    server = harness.gunicorn(database, workers=1)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        server.discard_log()


def stream_body(server: harness.Server, length: int, **headers: str) -> tuple[int, int]:
    """POST a body of ``length`` bytes, sending it while the server takes it; stop when the
    server answers. The status, and how many bytes of the body the client got to send: what
    the server read, plus what the kernel buffers hold."""
    lines = [
        "POST /protected/ HTTP/1.1",
        f"Host: 127.0.0.1:{server.port}",
        "Content-Type: application/json",
        f"Content-Length: {length}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    chunk = b"x" * 65536
    sent = 0
    answer = b""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        sock.setblocking(False)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            want_write = [sock] if sent < length else []
            readable, writable, _ = select.select([sock], want_write, [], 5)
            if readable:
                try:
                    data = sock.recv(65536)
                except ConnectionResetError:
                    break
                if not data:
                    break
                answer += data
                if b"\r\n\r\n" in answer:
                    break
            elif writable:
                try:
                    sent += sock.send(chunk[: length - sent])
                except (BlockingIOError, InterruptedError):
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    break
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0
    return status, sent


HUGE = 200 * 1024 * 1024
#: Loopback's socket buffers take a few MiB before the server reads a byte.
UNREAD = 32 * 1024 * 1024


@pytest.mark.parametrize("key", [True, False], ids=["key", "no-key"])
def test_gunicorn_answers_401_to_a_huge_body_without_reading_it(
    gunicorn: harness.Server, key: bool
) -> None:
    headers = {"Idempotency-Key": str(uuid.uuid4())} if key else {}
    status, sent = stream_body(gunicorn, HUGE, **headers)
    assert status == 401, gunicorn.log()
    assert sent < UNREAD, f"{sent:,} bytes sent before the 401"


def test_gunicorn_answers_413_to_a_huge_keyed_body_without_reading_it(
    gunicorn: harness.Server,
) -> None:
    headers = {"Idempotency-Key": str(uuid.uuid4()), "Authorization": "Bearer good"}
    status, sent = stream_body(gunicorn, HUGE, **headers)
    assert status == 413, gunicorn.log()
    assert sent < UNREAD, f"{sent:,} bytes sent before the 413"
