"""The values the hot path makes its own way (issue 28), each the same as the slow way's: the
lock token made as text, times sent as microseconds since the epoch, durations as intervals,
the JSON written by a C encoder made once, the body's encoding, the request's path."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from django.db import connection
from django.test import RequestFactory, override_settings

from django_idempotency import Claim, IdempotencyKey
from django_idempotency._base import json as _json
from django_idempotency._base.durations import microseconds
from django_idempotency._call.identity import Identity
from django_idempotency._http import canonical_json as _canonical_json
from django_idempotency._http.fingerprints import full_path
from django_idempotency._store.claims import ClaimValues, new_token
from django_idempotency._store.postgresql import POSTGRESQL_TIME, interval
from tests import factories


def test_a_new_token_is_a_random_uuid4_as_str_writes_it() -> None:
    tokens = [new_token() for _ in range(2000)]
    assert len(set(tokens)) == len(tokens)
    for token in tokens:
        parsed = uuid.UUID(token)
        assert str(parsed) == token
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
    # Every hex digit of the random part takes every value (no digit is stuck).
    assert {token[0] for token in tokens} == set("0123456789abcdef")
    assert {token[19] for token in tokens} == set("89ab")


def test_microseconds_are_exact_for_aware_and_naive_times() -> None:
    aware = datetime(2026, 11, 26, 11, 47, 51, 684331, tzinfo=timezone.utc)
    assert microseconds(aware) == 1795693671684331
    assert microseconds(datetime(1970, 1, 1, tzinfo=timezone.utc)) == 0
    naive_local = aware.astimezone().replace(tzinfo=None)  # USE_TZ = False: local time
    assert microseconds(naive_local) == microseconds(aware)


@pytest.mark.parametrize("use_tz", [True, False])
def test_a_claims_time_is_its_clock(use_tz: bool) -> None:
    identity = Identity(
        key="k", scope="s", key_hash="h", fingerprint="f", method="POST", path="/p/"
    )
    with override_settings(USE_TZ=use_tz):
        values = ClaimValues(identity, new_token(), timedelta(seconds=5), timedelta(hours=1))
        assert (values.now.tzinfo is not None) is use_tz
        assert microseconds(values.now) == values.clock
        assert values.unlock_at - values.now == timedelta(seconds=5)
        assert values.expires_at - values.now == timedelta(hours=1)


def test_a_claims_lock_token_reads_as_a_uuid() -> None:
    token = new_token()
    claim = Claim(
        identity=Identity("k", "s", "h", "f", "POST", "/"),
        pk=1,
        token_text=token,
        attempt=1,
        recovery_point="",
        recovery_data=None,
        alias="default",
        lock_timeout=timedelta(seconds=60),
    )
    assert claim.lock_token == uuid.UUID(token)


@pytest.mark.parametrize(
    "document",
    [
        [["Content-Type", "application/json"], ["X-Thing", "caf\u00e9 \u2603"]],
        {"b": [1, 2, {"z": None, "a": True}], "a": "\ud83d\ude00 \ud800", "c": False},
        [],
        "text",
        12345678901234567890,
    ],
)
@pytest.mark.parametrize(
    "encoder",
    [
        json.JSONEncoder(),
        json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), sort_keys=True),
        json.JSONEncoder(ensure_ascii=False, separators=(",", ":")),
    ],
)
def test_the_acyclic_encoder_writes_what_the_encoder_writes(
    document: Any, encoder: json.JSONEncoder
) -> None:
    assert _json.acyclic_encoder(encoder)(document) == encoder.encode(document)


def test_without_the_c_encoder_it_is_the_encoders_own(monkeypatch: pytest.MonkeyPatch) -> None:
    encoder = json.JSONEncoder()
    monkeypatch.setattr(json.encoder, "c_make_encoder", None)
    assert _json.acyclic_encoder(encoder) == encoder.encode
    indented = json.JSONEncoder(indent=2)
    monkeypatch.undo()
    assert _json.acyclic_encoder(indented) == indented.encode


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{}",
        b' {"a": 1}',
        '{"a": "\u00e9"}'.encode("utf-8-sig"),
        '{"a": 1}'.encode("utf-16"),
        '{"a": 1}'.encode("utf-16-le"),
        '{"a": 1}'.encode("utf-16-be"),
        '{"a": 1}'.encode("utf-32"),
        '{"a": 1}'.encode("utf-32-le"),
        '{"a": 1}'.encode("utf-32-be"),
        b"1",
        b"\x001",
        b"1\x00",
    ],
)
def test_the_bodys_encoding_is_what_json_detects(body: bytes) -> None:
    assert _canonical_json._encoding(body) == json.detect_encoding(body)


def test_the_full_path_is_read_once_and_is_djangos() -> None:
    request = RequestFactory().post("/caf%C3%A9/a b/?x=1&y=%20")
    assert full_path(request) == request.get_full_path()
    request.path = "/changed/"  # read once: the identity and the fingerprint see one path
    assert full_path(request) != request.get_full_path()


@pytest.mark.postgresql
@pytest.mark.django_db
@pytest.mark.parametrize(
    "duration",
    [timedelta(microseconds=1), timedelta(seconds=5), timedelta(days=400, microseconds=7)],
)
def test_postgresql_reads_the_times_and_durations_exactly(duration: timedelta) -> None:
    when = datetime(2026, 11, 26, 11, 47, 51, 684331, tzinfo=timezone.utc)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {POSTGRESQL_TIME}, ({POSTGRESQL_TIME}) + %s::interval",
            [microseconds(when), microseconds(when), interval(duration)],
        )
        read, later = cursor.fetchone()
    assert read == when
    assert later - read == duration


@pytest.mark.django_db
def test_a_claims_times_are_its_clock_and_its_durations() -> None:
    ttl, lock_timeout = timedelta(days=3, microseconds=11), timedelta(seconds=61, microseconds=3)
    claimed = factories.claim(str(uuid.uuid4()), ttl=ttl, lock_timeout=lock_timeout)
    assert isinstance(claimed, Claim)
    record = IdempotencyKey.objects.get(pk=claimed.pk)
    assert record.lock_token == claimed.lock_token
    assert record.updated_at == record.created_at
    assert record.unlock_at is not None
    assert record.unlock_at - record.created_at == lock_timeout
    assert record.expires_at - record.created_at == ttl
