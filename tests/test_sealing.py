"""Stored responses at rest (issue 31): compressed, encrypted with rotating Fernet keys, read
back byte for byte; what the table holds is read raw, through a cursor, never the model."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet, InvalidToken
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection
from django.test import Client, override_settings

from django_idempotency import IdempotencyError, IdempotencyKey, idempotent_function
from django_idempotency._base.keys import hash_key
from django_idempotency._ops import checks
from django_idempotency._store import sealing
from tests.conftest import REDIS_STORE, executions, only_record, redis_client, redis_raw
from tests.testapp.sealing_views import CARD, LOCATION, NAME

pytestmark = [pytest.mark.urls("tests.sealing_urls"), pytest.mark.django_db]

OLD, NEW, OTHER = (Fernet.generate_key().decode() for _ in range(3))
Post = Callable[..., Any]


def raw(key: str) -> tuple[str, bytes | None]:
    """The record's headers and body columns as the database holds them (or, on the Redis
    store, its hash's fields)."""
    if REDIS_STORE:
        return redis_raw(None if key == "only" else _hash(key))
    table = connection.ops.quote_name(IdempotencyKey._meta.db_table)
    q = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {q('response_headers')}, {q('response_body')} FROM {table} "
            f"WHERE {q('key_hash')} = %s",
            [only_record().key_hash if key == "only" else _hash(key)],
        )
        headers, body = cursor.fetchone()
    if isinstance(headers, bytes):
        headers = headers.decode()
    if not isinstance(headers, str):  # a driver that parses JSON itself
        headers = json.dumps(headers)
    return headers, None if body is None else bytes(body)


def _hash(key: str) -> str:
    return hash_key(key)


def forge(key: str, headers: str, body: bytes | None) -> None:
    """Write the record's headers and body columns as someone with write access to the table
    (or the Redis database), and no key, would."""
    if REDIS_STORE:
        client = redis_client()
        (name,) = client.scan_iter(match=f"idempotency:r:*{_hash(key)}}}")
        client.hset(name, mapping={"rh": headers, "rb": body or b""})
        return
    IdempotencyKey.objects.filter(key_hash=_hash(key)).update(
        response_headers=json.loads(headers), response_body=body
    )


def keys(*names: str) -> Any:
    return override_settings(IDEMPOTENCY={"ENCRYPTION_KEYS": list(names)})


# --- compression --------------------------------------------------------------------------


def test_a_body_over_1_kib_is_stored_compressed_and_replayed_byte_for_byte(
    post: Post, key: str
) -> None:
    first = post("/charge/?count=200", key=key)
    headers, body = raw(key)
    assert len(first.content) > 30_000
    assert body is not None and len(body) < len(first.content) / 5
    assert json.loads(headers) == {
        "codec": "zlib",
        "headers": [["Content-Type", "application/json"], ["Location", LOCATION]],
    }
    retry = post("/charge/?count=200", key=key)
    assert retry.content == first.content
    assert retry["Location"] == LOCATION and retry["Idempotent-Replayed"] == "true"
    assert executions("charge") == 1


def test_a_body_of_1_kib_or_less_and_one_compression_does_not_shrink_are_kept_as_sent(
    post: Post, key: str
) -> None:
    small = post("/charge/", key=key)
    assert len(small.content) <= sealing.COMPRESS_OVER
    headers, body = raw(key)
    assert json.loads(headers) == [["Content-Type", "application/json"], ["Location", LOCATION]]
    assert body == small.content
    noise = post("/charge/?random=5000", key=key + "-noise")
    assert raw(key + "-noise")[1] == noise.content
    assert isinstance(json.loads(raw(key + "-noise")[0]), list)
    assert post("/charge/?random=5000", key=key + "-noise").content == noise.content


def test_compression_off_stores_the_body_as_sent(post: Post, key: str) -> None:
    with override_settings(IDEMPOTENCY={"COMPRESSION": False}):
        first = post("/charge/?count=200", key=key)
    assert raw(key)[1] == first.content
    assert isinstance(json.loads(raw(key)[0]), list)


@pytest.mark.parametrize("written, replayed", [(False, True), (True, False)])
def test_records_written_with_compression_on_or_off_replay_either_way(
    post: Post, key: str, written: bool, replayed: bool
) -> None:
    """Records of earlier releases are stored as with compression off: they replay too."""
    with override_settings(IDEMPOTENCY={"COMPRESSION": written}):
        first = post("/charge/?count=200", key=key)
    with override_settings(IDEMPOTENCY={"COMPRESSION": replayed}):
        assert post("/charge/?count=200", key=key).content == first.content
    assert executions("charge") == 1


# --- MAX_BODY_SIZE and MAX_STORED_BODY_SIZE -------------------------------------------------


def test_max_stored_body_size_keeps_a_large_body_that_compresses_and_not_one_that_does_not(
    post: Post, key: str
) -> None:
    limits = {"MAX_BODY_SIZE": 400_000, "MAX_STORED_BODY_SIZE": 50_000}
    with override_settings(IDEMPOTENCY=limits):
        json_body = post("/charge/?count=1000", key=key)
        assert len(json_body.content) > 150_000
        assert post("/charge/?count=1000", key=key).content == json_body.content
        post("/charge/?random=100000", key=key + "-noise")
        retry = post("/charge/?random=100000", key=key + "-noise")
    assert retry.status_code == 500
    assert retry.json()["type"].endswith("#response-not-stored")
    assert "too large to store" in retry.json()["detail"]
    assert executions("charge") == 2


def test_max_body_size_is_the_body_as_the_client_receives_it(post: Post, key: str) -> None:
    """A body over MAX_BODY_SIZE is not stored, however small it compresses."""
    with override_settings(IDEMPOTENCY={"MAX_BODY_SIZE": 10_000}):
        post("/charge/?count=200", key=key)
        assert post("/charge/?count=200", key=key).status_code == 500
    assert raw(key)[1] is None


# --- encryption at rest ---------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 200])
def test_with_keys_nothing_of_the_headers_or_body_is_readable_in_the_table(
    post: Post, key: str, count: int
) -> None:
    with keys(NEW):
        first = post(f"/charge/?count={count}", key=key)
        headers, body = raw(key)
        assert json.loads(headers) == {"codec": "fernet"}
        assert body is not None
        for secret in (CARD, NAME, LOCATION, "application/json", "ch_00000000"):
            assert secret.encode() not in body and secret not in headers
        retry = post(f"/charge/?count={count}", key=key)
    assert retry.content == first.content and retry["Location"] == LOCATION
    assert retry["Content-Type"] == "application/json"
    assert executions("charge") == 1
    # The token is the first key's, of the headers and the (compressed) body.
    plain = Fernet(NEW).decrypt(base64.urlsafe_b64encode(body))
    envelope = plain.partition(b"\n")[0]
    assert json.loads(envelope)["codec"] == ("zlib" if count > 1 else None)


def test_rotation_the_first_key_encrypts_every_key_decrypts(post: Post, key: str) -> None:
    with keys(OLD):
        old = post("/charge/?count=20", key=key)
    with keys(NEW, OLD):  # step 1: a new first key, the old one after it
        assert post("/charge/?count=20", key=key).content == old.content
        new = post("/charge/?count=20", key=key + "-new")
    token = base64.urlsafe_b64encode(raw(key + "-new")[1] or b"")
    Fernet(NEW).decrypt(token)  # written with the new key...
    with pytest.raises(InvalidToken):
        Fernet(OLD).decrypt(token)  # ...not the old one
    with keys(NEW):  # step 3: the old key dropped once its records expired
        assert post("/charge/?count=20", key=key + "-new").content == new.content
    assert executions("charge") == 2


@pytest.mark.parametrize("configured", [[OTHER], []], ids=["another key", "no key"])
def test_a_record_no_configured_key_reads_answers_response_not_stored_and_never_runs_again(
    post: Post, key: str, configured: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    with keys(OLD):
        post("/charge/?count=20", key=key)
    with keys(*configured):
        retry = post("/charge/?count=20", key=key)
        again = post("/charge/?count=20", key=key)
    assert retry.status_code == again.status_code == 500
    problem = retry.json()
    assert problem["type"].endswith("#response-not-stored")
    assert "can no longer be read" in problem["detail"]
    assert executions("charge") == 1
    assert "never run again" in caplog.text
    assert "unreadable" in {getattr(line, "idempotency_outcome", "") for line in caplog.records}
    with keys(OLD):  # the key put back: readable again
        assert post("/charge/?count=20", key=key).status_code == 201


def test_a_token_copied_into_another_record_does_not_open_there(post: Post, key: str) -> None:
    """A token is bound to its record's scope and key hash: copied into a record of the
    attacker's own (write access to the table, no key), its replay was the victim's response
    in the clear (issue 48). It is now a record no key reads: ``response-not-stored``."""
    with keys(NEW):
        victim = post("/charge/?count=3", key=key)
        post("/charge/?count=1", key=key + "-mine")
        forge(key + "-mine", *raw(key))
        stolen = post("/charge/?count=1", key=key + "-mine")
        assert post("/charge/?count=3", key=key).content == victim.content
    assert stolen.status_code == 500
    assert stolen.json()["type"].endswith("#response-not-stored")
    assert CARD.encode() not in stolen.content and NAME.encode() not in stolen.content
    assert executions("charge") == 2


def test_a_token_sealed_before_tokens_were_bound_still_opens(post: Post, key: str) -> None:
    """Version 1.1 sealed ``{"codec", "headers"}`` with no binding: such a record replays
    (docs/storage.rst says what that leaves open, and how dropping its key closes it)."""
    with keys(NEW):
        first = post("/charge/?count=3", key=key)
        headers, body = raw(key)
        plain = Fernet(NEW).decrypt(base64.urlsafe_b64encode(body or b""))
        envelope, _, packed = plain.partition(b"\n")
        unbound = {k: v for k, v in json.loads(envelope).items() if k != "for"}
        old = Fernet(NEW).encrypt(json.dumps(unbound).encode() + b"\n" + packed)
        forge(key, headers, base64.urlsafe_b64decode(old))
        retry = post("/charge/?count=3", key=key)
    assert retry.status_code == 201 and retry.content == first.content
    assert retry["Idempotent-Replayed"] == "true"


def test_a_function_result_is_encrypted_and_an_unreadable_one_raises(key: str) -> None:
    calls: list[str] = []

    @idempotent_function(key="message_id")
    def handle(message_id: str) -> dict[str, str]:
        calls.append(message_id)
        return {"card": CARD}

    with keys(NEW):
        assert handle(key) == {"card": CARD}
        assert CARD.encode() not in (raw("only")[1] or b"")
        assert handle(key) == {"card": CARD}
    with keys(OTHER), pytest.raises(IdempotencyError, match="cannot be read"):
        handle(key)
    assert calls == [key]


# --- the admin ------------------------------------------------------------------------------


def _page(client: Client) -> str:
    record = only_record()
    response = client.get(f"/admin/django_idempotency/idempotencykey/{record.pk}/change/")
    assert response.status_code == 200
    return response.content.decode()


def _staff(*codenames: str) -> Client:
    user = User.objects.create_user(f"staff-{uuid.uuid4()}", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.database_store
def test_the_admin_shows_the_decrypted_response_to_staff_allowed_to_see_it(
    post: Post, key: str
) -> None:
    with keys(NEW):
        post("/charge/?count=3", key=key)
        allowed = _staff("view_idempotencykey", "view_stored_response")
        page = _page(allowed)
        assert NAME in page and LOCATION in page
        superuser = Client()
        superuser.force_login(User.objects.create_superuser("admin", "a@example.com", None))
        assert NAME in _page(superuser)
        hidden = _page(_staff("view_idempotencykey"))
        assert NAME not in hidden and LOCATION not in hidden
        assert "Can view stored responses" in hidden and "Encrypted;" in hidden
    with keys(OTHER):
        page = _page(allowed)
    assert "Cannot decrypt" in page and NAME not in page


@pytest.mark.database_store
def test_the_admin_hides_recovery_data_and_outbox_arguments_as_it_hides_responses(
    key: str,
) -> None:
    """A card number in a recovery point's data and in a message's arguments was shown in the
    clear to view-only staff while the response was hidden (issue 48)."""
    from django_idempotency import Claim
    from django_idempotency.models import OutboxMessage
    from tests.testapp.outbox_tasks import receipt

    @idempotent_function(key="order_id", name="tests.sealing.charge")
    def pay(order_id: str, *, idempotency: Claim) -> str:
        idempotency.set_recovery_point("charged", {"card": CARD})
        return idempotency.enqueue(receipt, card=CARD)

    def pages(client: Client) -> str:
        record = only_record()
        message = OutboxMessage.objects.get()
        shown = ""
        for url in (
            f"/admin/django_idempotency/idempotencykey/{record.pk}/change/",
            f"/admin/django_idempotency/outboxmessage/{message.pk}/change/",
        ):
            response = client.get(url)
            assert response.status_code == 200
            shown += response.content.decode()
        return shown

    with keys(NEW):
        pay(key)
        hidden = pages(_staff("view_idempotencykey", "view_outboxmessage"))
        assert CARD not in hidden
        assert hidden.count("Can view stored responses") >= 3
        allowed = _staff("view_idempotencykey", "view_outboxmessage", "view_stored_response")
        assert pages(allowed).count(CARD) == 2
    assert pages(_staff("view_idempotencykey", "view_outboxmessage")).count(CARD) == 2


@pytest.mark.database_store
def test_the_admin_says_a_record_stored_before_the_keys_is_in_the_clear(
    post: Post, key: str
) -> None:
    """Hidden from staff without the permission, as every response once keys are set, but not
    called "Encrypted": it is not (issue 38)."""
    post("/charge/?count=3", key=key)
    with keys(NEW):
        hidden = _page(_staff("view_idempotencykey"))
    assert NAME not in hidden and LOCATION not in hidden
    assert "Stored in the clear (before ENCRYPTION_KEYS were set)" in hidden
    assert "Encrypted;" not in hidden


@pytest.mark.database_store
def test_without_keys_the_admin_shows_a_compressed_response_to_whoever_views_records(
    post: Post, key: str
) -> None:
    post("/charge/?count=200", key=key)
    page = _page(_staff("view_idempotencykey"))
    assert NAME in page and LOCATION in page


# --- system checks --------------------------------------------------------------------------


def _errors(**settings: Any) -> list[str]:
    with override_settings(IDEMPOTENCY=settings):
        return [error.id for error in checks.check_settings()]


def test_checks_of_the_storage_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _errors(COMPRESSION="yes") == ["django_idempotency.E002"]
    assert _errors(MAX_STORED_BODY_SIZE=0) == ["django_idempotency.E040"]
    assert _errors(MAX_STORED_BODY_SIZE=None, ENCRYPTION_KEYS=[NEW, OLD]) == []
    assert _errors(ENCRYPTION_KEYS=NEW) == ["django_idempotency.E041"]
    assert _errors(ENCRYPTION_KEYS=[NEW, "not-a-key"]) == ["django_idempotency.E041"]
    with override_settings(IDEMPOTENCY={"ENCRYPTION_KEYS": [NEW, NEW[:-4]]}):
        (error,) = checks.check_settings()
    assert "ENCRYPTION_KEYS'][1]" in error.msg and NEW[:-4] not in error.msg
    monkeypatch.setitem(sys.modules, "cryptography", None)
    assert _errors(ENCRYPTION_KEYS=[NEW]) == ["django_idempotency.E042"]
    assert _errors(ENCRYPTION_KEYS=[]) == []


def test_the_check_command_reports_a_malformed_key() -> None:
    with (
        override_settings(IDEMPOTENCY={"ENCRYPTION_KEYS": ["short"]}),
        pytest.raises(SystemCheckError, match="E041"),
    ):
        call_command("check")


# --- the figures of docs/storage.rst --------------------------------------------------------


def test_the_storage_benchmark_gives_the_documented_room() -> None:
    """``benchmarks/storage.py sizes`` runs, and its figures are those ``docs/storage.rst``
    shows: the example's responses left as they are, the 200 KB body in 15%."""
    root = Path(__file__).resolve().parents[1]
    own = ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")  # it runs the example on SQLite
    env = {name: value for name, value in os.environ.items() if name not in own}
    result = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "storage.py"), "sizes"],
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
        env=env,
        timeout=300,
    )
    rows = {line[:40].strip(): line[40:].split() for line in result.stdout.splitlines()[3:]}
    examples = [cells for name, cells in rows.items() if name.startswith("POST ")]
    assert len(examples) == 4
    for cells in examples:  # body, as sent (n, "(", "100%)"), compressed: left as sent
        assert cells[1] == cells[4] and cells[6] == "100%)"
    big = rows["a 200 KB JSON body"]
    assert big[5:7] == ["(", "15%)"] and big[11:] == ["(", "15%)"]
    documented = (root / "docs" / "storage.rst").read_text()
    assert "200 KB JSON body is stored in 15% of its size" in documented
