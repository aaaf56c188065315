"""Erasure of one principal's records now (issue 31): ``erase_scope()`` and
``idempotency_cleanup --scope``, with a request of that principal in flight on a real thread."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connections
from django.http import HttpResponse
from django.test import Client, RequestFactory
from django.utils import timezone

from django_idempotency import (
    Erasure,
    IdempotencyKey,
    erase_scope,
    idempotent,
    idempotent_function,
    late_result_refused,
)
from django_idempotency._base.keys import hash_key
from django_idempotency._store.limits import bounded_scope
from tests.conftest import executions, stored
from tests.testapp import sealing_views

pytestmark = [pytest.mark.urls("tests.sealing_urls"), pytest.mark.django_db(transaction=True)]


def client_of(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def send(client: Client, path: str, key: str) -> Any:
    return client.post(path, {}, content_type="application/json", headers={"Idempotency-Key": key})


@pytest.fixture
def people() -> tuple[Client, Client]:
    """Two principals, each with three finished records (one expired, one failed)."""
    clients = tuple(client_of(User.objects.create_user(name)) for name in ("erased", "kept"))
    for client in clients:
        for key in ("a", "b", "expired"):
            assert send(client, "/charge/?count=20", key).status_code == 201
    IdempotencyKey.objects.filter(key_hash__in=_hashes("expired")).update(
        expires_at=timezone.now() - timedelta(minutes=1)
    )
    IdempotencyKey.objects.filter(key_hash__in=_hashes("b")).update(
        status=IdempotencyKey.Status.FAILED
    )
    return clients  # type: ignore[return-value]


def _hashes(*keys: str) -> list[str]:
    return [hash_key(key) for key in keys]


def scope_of(name: str) -> str:
    return f"user:{User.objects.get(username=name).pk}"


@pytest.fixture
def in_flight(people: tuple[Client, Client]) -> Iterator[threading.Thread]:
    """A request of the erased principal held in its view on a thread of its own."""
    sealing_views.entered.clear()
    sealing_views.leave.clear()
    answers: list[Any] = []

    def run() -> None:
        try:
            answers.append(send(people[0], "/hold/", "held"))
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.answers = answers  # type: ignore[attr-defined]
    thread.start()
    assert sealing_views.entered.wait(30), "the held request never reached its view"
    yield thread
    sealing_views.leave.set()
    thread.join(30)


def test_erase_scope_deletes_every_finished_record_of_the_scope_now_and_leaves_one_in_flight(
    people: tuple[Client, Client], in_flight: threading.Thread
) -> None:
    erased, kept = scope_of("erased"), scope_of("kept")
    assert erase_scope(erased, dry_run=True) == Erasure(erased, 3, 1, dry_run=True)
    assert IdempotencyKey.objects.filter(scope=erased).count() == 4

    assert erase_scope(erased) == Erasure(erased, 3, 1)

    assert list(IdempotencyKey.objects.filter(scope=erased).values_list("status", flat=True)) == [
        "processing"
    ]
    assert IdempotencyKey.objects.filter(scope=kept).count() == 3
    # The request in flight finishes as usual: its result is stored, and replayed.
    sealing_views.leave.set()
    in_flight.join(30)
    (answer,) = in_flight.answers  # type: ignore[attr-defined]
    assert answer.status_code == 200
    replay = send(people[0], "/hold/", "held")
    assert replay.content == answer.content and replay["Idempotent-Replayed"] == "true"
    assert executions("hold") == 1
    # An erased key is a new key: its retry runs the view again.
    assert send(people[0], "/charge/?count=20", "a").status_code == 201
    assert executions("charge") == 7
    # Once the request in flight has finished, erasing again takes its record too.
    assert erase_scope(erased) == Erasure(erased, 2, 0)


def test_the_command_erases_a_scope_counts_with_dry_run_and_reports_records_in_flight(
    people: tuple[Client, Client], in_flight: threading.Thread
) -> None:
    erased = scope_of("erased")
    out = StringIO()
    call_command("idempotency_cleanup", "--scope", erased, "--dry-run", stdout=out)
    assert f"Would delete 3 finished idempotency records of scope {erased!r}." in out.getvalue()
    assert "1 record of the scope is still processing" in out.getvalue()
    assert IdempotencyKey.objects.filter(scope=erased).count() == 4

    out = StringIO()
    call_command("idempotency_cleanup", "--scope", erased, "--batch-size", "2", stdout=out)
    assert f"Deleted 3 finished idempotency records of scope {erased!r}." in out.getvalue()
    assert "1 record of the scope is still processing" in out.getvalue()
    assert IdempotencyKey.objects.filter(scope=erased).count() == 1
    assert IdempotencyKey.objects.filter(scope=scope_of("kept")).count() == 3


def test_erasure_refuses_what_it_cannot_do() -> None:
    with pytest.raises(CommandError, match="do not apply"):
        call_command("idempotency_cleanup", "--scope", "user:1", "--limit", "5")
    with pytest.raises(CommandError, match="non-empty string"):
        call_command("idempotency_cleanup", "--scope", "")
    with pytest.raises(ValueError, match="batch_size"):
        erase_scope("user:1", batch_size=0)


def _finished(scope: str, key_hash: str = "0" * 64) -> None:
    IdempotencyKey.objects.create(
        scope=bounded_scope(scope),
        key_hash=key_hash,
        method="POST",
        path="/",
        request_hash="",
        status=IdempotencyKey.Status.COMPLETED,
        expires_at=timezone.now() + timedelta(hours=1),
    )


def test_a_scope_that_matches_nothing_says_so() -> None:
    """It exits 0 (a principal without records has nothing to erase) but says so, where it
    said "Deleted 0" (issue 38)."""
    for dry_run in ((), ("--dry-run",)):
        out = StringIO()
        call_command("idempotency_cleanup", "--scope", "user:404", *dry_run, stdout=out)
        assert out.getvalue() == "No idempotency record has scope 'user:404': nothing to delete.\n"


@pytest.mark.parametrize("padded", ["user:7 ", " user:7", "user:7\n", "\tuser:7"])
def test_no_scope_has_whitespace_around_it(padded: str) -> None:
    """MySQL and MariaDB compare text without its trailing spaces: ``--scope 'user:7 '`` erased
    user:7's records there, and matched nothing elsewhere. The app never makes such a scope
    (a scope function returning one is refused before the claim), so erasing one is refused,
    and nothing is deleted (issue 38)."""
    _finished("user:7")
    with pytest.raises(CommandError, match="with whitespace around it, which no scope may have"):
        call_command("idempotency_cleanup", "--scope", padded)
    with pytest.raises(ValueError, match="no record has such a scope"):
        erase_scope(padded, dry_run=True)
    assert IdempotencyKey.objects.filter(scope="user:7").count() == 1

    @idempotent(scope=lambda request: padded)
    def view(request: Any) -> HttpResponse:
        raise AssertionError("never runs")

    request = RequestFactory().post("/", {}, headers={"Idempotency-Key": "k"})
    refused = view(request)  # a client can send it (``/t/acme%20/``): its 400 (issue 48)
    assert refused.status_code == 400
    assert json.loads(refused.content)["type"].endswith("invalid-scope")
    assert "with whitespace around it" in json.loads(refused.content)["detail"]

    @idempotent_function(key="event_id", scope=padded.strip() + " ")
    def handle(event_id: str) -> None:
        raise AssertionError("never runs")

    with pytest.raises(ValueError, match="its scope was given with whitespace around it"):
        handle("e-1")
    assert len(stored()) == 1


def test_a_long_scope_is_cut_in_the_output() -> None:
    long = "tenant:" + "x" * 100_000
    _finished(long)
    for scope, verb in ((long, "Deleted 1 finished"), (long + "y", "No idempotency record")):
        out = StringIO()
        call_command("idempotency_cleanup", "--scope", scope, stdout=out)
        assert verb in out.getvalue()
        assert f"… ({len(scope):,} characters)" in out.getvalue()
        assert len(out.getvalue()) < 300


def test_a_scope_longer_than_the_column_is_erased_by_its_stored_hash() -> None:
    long = "tenant:" + "x" * 300
    IdempotencyKey.objects.create(
        scope=bounded_scope(long),
        key_hash="0" * 64,
        method="POST",
        path="/",
        request_hash="",
        status=IdempotencyKey.Status.COMPLETED,
        expires_at=timezone.now() + timedelta(hours=1),
    )
    assert erase_scope(long).deleted == 1


def test_a_scope_spelled_as_a_long_scopes_stored_hash_is_a_principal_of_its_own(key: str) -> None:
    """A long scope is stored as ``sha256:<hex>``; a scope that was literally that text was
    stored as it is, the same record: each was replayed the other's response, and erasing one
    erased the other's (issue 48)."""
    from django.http import HttpRequest

    from django_idempotency import idempotent
    from tests.testapp.models import Execution

    long = "tenant:" + "x" * 300
    spelled = bounded_scope(long)
    assert spelled.startswith("sha256:") and len(spelled) == 71

    @idempotent(
        scope=lambda request: request.headers["X-Tenant"],
        fingerprint=lambda request, scope: "the same request",
    )
    def create(request: HttpRequest) -> HttpResponse:
        Execution.objects.create(label="tenant", payload=request.headers["X-Tenant"])
        return HttpResponse(request.headers["X-Tenant"], status=201)

    def send(scope: str) -> Any:
        request = RequestFactory().post(
            "/orders/", headers={"Idempotency-Key": key, "X-Tenant": scope}
        )
        return create(request)

    assert send(long).content == long.encode()
    other = send(spelled)
    assert other.content == spelled.encode() and "Idempotent-Replayed" not in other
    assert executions("tenant") == 2
    assert erase_scope(spelled).deleted == 1
    again = send(long)
    assert again.content == long.encode() and again["Idempotent-Replayed"] == "true"
    assert executions("tenant") == 2


def test_erasure_racing_a_principals_requests_never_takes_a_record_from_its_owner(
    people: tuple[Client, Client],
) -> None:
    """Requests of the erased principal start and finish on four threads while the scope is
    erased again and again: every request is answered, and no owner finds its record gone
    when it stores its result (which would be a ``late_result_refused``)."""
    erased = scope_of("erased")
    refused: list[Any] = []
    answers: list[int] = []
    done = threading.Event()

    def on_refused(**kwargs: Any) -> None:
        refused.append(kwargs)

    def requests(worker: int) -> None:
        try:
            client = client_of(User.objects.get(username="erased"))
            for index in range(8):
                answers.append(send(client, "/charge/?count=20", f"{worker}-{index}").status_code)
        finally:
            connections.close_all()

    late_result_refused.connect(on_refused)
    threads = [threading.Thread(target=requests, args=(worker,)) for worker in range(4)]
    try:
        for thread in threads:
            thread.start()
        erasures = 0
        while any(thread.is_alive() for thread in threads) or not done.is_set():
            erase_scope(erased)
            erasures += 1
            if not any(thread.is_alive() for thread in threads):
                done.set()
    finally:
        for thread in threads:
            thread.join(60)
        late_result_refused.disconnect(on_refused)
    assert answers == [201] * 32 and not refused
    assert erasures > 1
    assert erase_scope(erased).in_progress == 0
    assert not IdempotencyKey.objects.filter(scope=erased).exists()


def test_the_stored_form_the_admin_shows_is_erased_with_stored(caplog: Any) -> None:
    """``sha256:<hex>`` copied from the admin named the scope ``sha256:<hex>``, itself stored
    as its own hash: "Erased 0", silently (issue 48). It is still that scope (a tenant named
    so must not erase another's records), says what to do when it finds nothing, and
    ``stored=True`` (``--stored``) erases the records stored under exactly it."""
    long = "tenant:" + "x" * 300
    shown = bounded_scope(long)  # what the admin shows
    _finished(long)
    _finished("user:7")
    assert erase_scope(shown).deleted == 0
    assert "pass stored=True" in caplog.text
    out = StringIO()
    call_command("idempotency_cleanup", "--scope", shown, stdout=out)
    assert "add --stored" in out.getvalue()
    assert IdempotencyKey.objects.count() == 2

    assert erase_scope(shown, stored=True, dry_run=True).deleted == 1
    out = StringIO()
    call_command("idempotency_cleanup", "--scope", shown, "--stored", stdout=out)
    assert out.getvalue().startswith("Deleted 1 finished")
    assert list(IdempotencyKey.objects.values_list("scope", flat=True)) == ["user:7"]
    assert erase_scope("user:7", stored=True).deleted == 1  # a scope stored as it is


@pytest.mark.parametrize(
    "text", ["sha256:" + "A" * 64, "sha256:" + "a" * 63, "sha256:x", "t:" + "x" * 300]
)
def test_stored_refuses_what_no_record_is_stored_as(text: str) -> None:
    _finished(text)
    with pytest.raises(ValueError, match="no record is stored as"):
        erase_scope(text, stored=True)
    with pytest.raises(CommandError, match="no record is stored as"):
        call_command("idempotency_cleanup", "--scope", text, "--stored")
    with pytest.raises(CommandError, match="goes with --scope"):
        call_command("idempotency_cleanup", "--stored")
    assert IdempotencyKey.objects.count() == 1


def test_the_log_line_counts_what_every_store_erased(caplog: Any) -> None:
    """On a Redis store the line said "Erased 0 ..." while ``deleted`` was 2: it counted the
    database's records alone."""
    client = client_of(User.objects.create_user("logged"))
    for key in ("a", "b"):
        assert send(client, "/charge/?count=20", key).status_code == 201
    with caplog.at_level("WARNING", logger="django_idempotency"):
        assert erase_scope(scope_of("logged")) == Erasure(scope_of("logged"), 2, 0)
    assert "Erased 2 finished idempotency records of a scope; 0 in progress" in caplog.text
