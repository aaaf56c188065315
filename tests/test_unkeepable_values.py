"""A response's header or a recovery point's data the store cannot keep as JSON never makes a
view run again (issue 48).

PostgreSQL's ``jsonb`` refuses ``\\u0000``: a view whose ``Location`` held a NUL
(``"/items/" + user_input``) had its result write fail with ``DataError``, the record stayed
``processing``, and every retry after ``LOCK_TIMEOUT`` took it over and ran the view again (the
log said "the database did not answer"). Such headers are now kept in the body column
(:mod:`django_idempotency._store.sealing`'s ``framed`` shape) and replayed exactly, on every
database and the Redis store; recovery data holding a NUL is refused by
``set_recovery_point`` before any write, on every store.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path

from django_idempotency import idempotent
from django_idempotency._store import sealing
from django_idempotency.models import IdempotencyKey
from tests.conftest import executions
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]

LOCATION = "/items/a\x00b"


def _created(request: HttpRequest) -> HttpResponse:
    Execution.objects.create(label="order")
    response = HttpResponse(request.body, status=201, content_type="text/plain")
    response["Location"] = LOCATION
    response["ETag"] = '"e\x00"'
    return response


def _charged(request: HttpRequest) -> HttpResponse:
    Execution.objects.create(label="charge")
    request.idempotency.set_recovery_point("charged", {"note": [{"x\x00y": 1}]})
    return HttpResponse(status=201)


urlpatterns = [
    path("created/", idempotent(_created)),
    path("atomic-created/", idempotent(atomic=True)(_created)),
    path("redis-created/", idempotent(store="redis")(_created)),
    path("charged/", idempotent(_charged)),  # the key optional: REQUIRED is off
]


@pytest.fixture(params=[False, True], ids=["production", "debug"])
def debug(request: pytest.FixtureRequest) -> Iterator[bool]:
    with override_settings(DEBUG=request.param):
        yield request.param


def send(url: str, key: str, body: bytes = b"one") -> Any:
    return Client().post(url, body, "text/plain", headers={"Idempotency-Key": key})


def assert_kept(url: str, body: bytes) -> None:
    key = str(uuid.uuid4())
    first = send(url, key, body)
    assert first.status_code == 201, first.content
    for _ in range(2):
        retry = send(url, key, body)
        assert (retry.status_code, retry.content) == (201, body)
        assert retry["Idempotent-Replayed"] == "true"
        assert (retry["Location"], retry["ETag"]) == (LOCATION, '"e\x00"')
    assert executions("order") == 1


@pytest.mark.parametrize("url", ["/created/", "/atomic-created/"])
@pytest.mark.parametrize("body", [b"one", b"x" * 5000], ids=["plain", "compressed"])
def test_a_header_with_a_nul_is_stored_and_replayed_exactly(
    debug: bool, url: str, body: bytes
) -> None:
    assert_kept(url, body)
    record = IdempotencyKey.objects.get()
    assert record.status == "completed"
    assert record.response_headers == {"codec": "framed"}


def test_encrypted_it_is_sealed_as_any_header() -> None:
    with override_settings(IDEMPOTENCY={"ENCRYPTION_KEYS": [Fernet.generate_key().decode()]}):
        assert_kept("/created/", b"one")
        assert sealing.encrypted(IdempotencyKey.objects.get().response_headers)


@pytest.mark.redis
def test_the_redis_store_keeps_it_alike(debug: bool) -> None:
    assert_kept("/redis-created/", b"one")


def test_headers_without_a_nul_keep_their_shape() -> None:
    """Only a header holding a NUL is framed: every other response is stored as before."""
    assert sealing.seal([["Location", "/a"]], b"b", None) == ([["Location", "/a"]], b"b")
    assert sealing.seal([["Location", "/\x00"]], None, None) == ([], None)
    sealed = sealing.seal([["Location", "/\x00"]], b"b", None)
    assert sealed == ({"codec": "framed"}, b'{"codec":null,"headers":[["Location","/\\u0000"]]}\nb')
    assert sealing.unseal(*sealed, ("s", "k")) == ([["Location", "/\x00"]], b"b")
    with pytest.raises(sealing.Unreadable):
        sealing.unseal({"codec": "framed"}, b"{not json\nb", ("s", "k"))


def test_recovery_data_with_a_nul_is_refused_before_any_write(debug: bool) -> None:
    """A ``ValueError`` in the view (a ``500``, the record released as for any exception),
    on every database: never a ``503`` whose every retry ran the code before the point."""
    with pytest.raises(ValueError, match="its data holds a NUL character"):
        send("/charged/", "k1")
    assert executions("charge") == 1
    assert not IdempotencyKey.objects.filter(recovery_point="charged").exists()
    with pytest.raises(ValueError, match="its data holds a NUL character"):  # without a key
        Client().post("/charged/", b"", "text/plain")


def test_recovery_data_s_nul_is_found_however_deep() -> None:
    from django_idempotency._call.claim import _holds_nul

    assert not _holds_nul({"a": [1, "b", {"c": None}], "d": 1.5})
    assert _holds_nul({"a": [1, ("b\x00",)]})
    assert _holds_nul({"\x00": 1})
    assert json.loads(json.dumps({"a": "\x00"}))  # what SQLite and MySQL kept, jsonb refused
