"""The outbox on the Redis store: messages released by the script that writes the kept result
(or a recovery point), never by a write the fence refuses or an attempt that keeps nothing,
delivered at least once by the fast path or ``idempotency_relay --store``, and taken again
once a dead relay's lease has passed. Against the Redis server at
``IDEMPOTENCY_TEST_REDIS_STORE_URL`` (its own db number), never a stand-in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client, override_settings
from django.urls import path
from django.utils import timezone

from django_idempotency import idempotent
from django_idempotency._call import outbox
from django_idempotency._conf.settings import conf
from django_idempotency._conf.values import display_name, store_alias
from django_idempotency._ops import store_checks
from django_idempotency._ops.relay import Relay, backlog
from django_idempotency._store import StoredResponse, using
from django_idempotency._store.outbox import Message, Release
from django_idempotency.management import store_option
from django_idempotency.testing import outbox_sent
from tests.conftest import REDIS_STORE_NAME, flush_redis, redis_client
from tests.relaying import relay_here
from tests.testapp.outbox_tasks import receipt
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.redis,
    pytest.mark.urls("tests.outbox_urls"),
    pytest.mark.django_db(transaction=True),
]

#: The ``redis`` cache alias, or on the cluster lane the cluster's URL (tests/conftest.py).
STORE = REDIS_STORE_NAME
ALIAS = store_alias(STORE, "default")
#: How messages and commands name it.
SHOWN = display_name(STORE)
Post = Callable[..., Any]


def on_redis(**more: Any) -> Any:
    return override_settings(IDEMPOTENCY={"STORE": STORE, **more})


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    flush_redis()
    receipt.reset()
    yield
    receipt.reset()


@pytest.fixture
def post(client: Client) -> Post:
    def send(path: str, spec: dict[str, Any] | None = None, *, key: str) -> Any:
        headers = {"Idempotency-Key": key, "X-Spec": json.dumps(spec or {})}
        try:
            return client.post(path, {}, content_type="application/json", headers=headers)
        finally:
            assert outbox.sender.settle(), "the fast path's thread is stuck"

    return send


def raw() -> Any:
    """The tests' Redis server, or the cluster (every primary scanned)."""
    return redis_client()


def due() -> int:
    """How many messages wait in the outbox's due queues: the store's one, or every slot's."""
    client = raw()
    return sum(int(client.zcard(name)) for name in client.scan_iter(match="idempotency:o:due*"))


def sent_ids() -> list[str]:
    outbox_sent()
    return [task_id for task_id, _, _ in receipt.sent]


def messages() -> dict[str, str]:
    """Every message the store holds: id -> state."""
    client = raw()
    found = {}
    for name in client.scan_iter(match="idempotency:o:m:*"):
        id_, state = client.hmget(name, "id", "st")
        found[id_.decode()] = state.decode()
    return found


def relay_once() -> Any:
    with relay_here():
        return Relay(ALIAS).run(once=True)


def test_a_views_messages_are_released_with_the_result_and_delivered_once(
    post: Post, key: str
) -> None:
    with on_redis():
        response = post("/order/", {"order": "1"}, key=key)
        assert response.status_code == 201
        ids = response.json()["messages"]
        assert sent_ids() == ids
        assert messages() == dict.fromkeys(ids, "sent")
        assert post("/order/", {"order": "1"}, key=key).json()["messages"] == ids  # replayed
        assert relay_once().sent == 0
    assert sent_ids() == ids
    assert due() == 0


def test_without_the_fast_path_the_relay_delivers_once(post: Post, key: str) -> None:
    with on_redis(OUTBOX_FAST_PATH=False):
        ids = post("/order/", {"order": "1"}, key=key).json()["messages"]
        assert sent_ids() == []
        assert messages() == dict.fromkeys(ids, "pending")
        assert backlog(ALIAS)["outbox_pending"] == 2
        assert relay_once().sent == 2
        assert relay_once().sent == 0
        assert backlog(ALIAS)["outbox_pending"] == 0
    assert sent_ids() == ids
    assert [kwargs["kind"] for _, _, kwargs in receipt.sent] == ["first", "second"]


@pytest.mark.parametrize(
    "ending",
    [{"status": 500}, {"status": 503}, {"raise": True}, {"no_store": True}, {"steal": True}],
    ids=["500", "503", "raised", "no_store", "fenced_owner"],
)
def test_an_attempt_whose_result_is_not_kept_releases_nothing(
    post: Post, key: str, ending: dict[str, Any]
) -> None:
    """``steal``: the record's token changed under its owner (a takeover): the script's fence
    refuses the owner's late result, and its messages with it."""
    with on_redis(OUTBOX_FAST_PATH=False):
        try:
            post("/order/", {"order": "1", **ending}, key=key)
        except RuntimeError:
            assert ending.get("raise")
        assert messages() == {}
        assert relay_once().sent == 0
    assert receipt.sent == []


def test_a_recovery_point_releases_what_was_staged_before_it(post: Post, key: str) -> None:
    with on_redis(OUTBOX_FAST_PATH=False):
        response = post("/order/", {"order": "1", "point": True, "status": 500}, key=key)
        assert response.status_code == 500  # kept nothing: only the point's message is out
        (first,) = messages()
        # The retry resumes after the point: it stages the second message only.
        response = post("/order/", {"order": "1", "point": True}, key=key)
        assert response.status_code == 201
        assert relay_once().sent == 2
    assert [kwargs["kind"] for _, _, kwargs in receipt.sent] == ["first", "second"]
    assert receipt.sent[0][0] == first


def _claim(store: Any, key: str) -> Any:
    from django_idempotency._base.keys import hash_key
    from django_idempotency._call.identity import Identity

    identity = Identity(
        key=key, scope="s", key_hash=hash_key(key), fingerprint="f", method="POST", path="/p"
    )
    return store.claim(identity, ttl=timedelta(hours=1), lock_timeout=timedelta(seconds=30))


def _release(*ids: str) -> Release:
    found = [Message(id_, outbox.CELERY, receipt.name, '{"args":[],"kwargs":{}}') for id_ in ids]
    return Release(0, found, timedelta(0), notify=False)


def test_a_fenced_out_owners_messages_are_never_released(key: str) -> None:
    """The owner's lock taken over (its lock lapsed: another token claimed the record): its
    result write, and the messages in it, are refused by the script's fence."""
    with on_redis():
        store: Any = using(ALIAS)
        claim = _claim(store, key)
        key_name = store._handles.records[claim.pk][0]
        raw().hset(key_name, "tok", "the-new-owner")
        release = _release("m1")
        stored = StoredResponse(status=201, headers={}, body=b"{}")
        assert not store.store_response(claim.pk, claim.token_text, stored, release=release)
        assert release.inserted == []
        assert messages() == {}
        assert due() == 0


def test_a_message_released_again_by_a_takeover_inserts_nothing(key: str) -> None:
    with on_redis():
        store: Any = using(ALIAS)
        claim = _claim(store, key)
        first = _release("m1")
        store.save_recovery_point(
            claim.pk, claim.token_text, "a", None, timedelta(seconds=30), release=first
        )
        assert first.inserted == ["m1"]
        again = _release("m1", "m2")
        stored = StoredResponse(status=201, headers={}, body=b"{}")
        assert store.store_response(claim.pk, claim.token_text, stored, release=again)
        assert again.inserted == ["m2"]
        assert sorted(messages()) == ["m1", "m2"]


def _taken_twice(store: Any, key: str) -> tuple[Any, Any]:
    """A message released, taken by a relay whose lease ran out at once (``0``: a relay stalled
    past it), then by a second relay: both hold it, as a lease allows."""
    claim = _claim(store, key)
    stored = StoredResponse(status=201, headers={}, body=b"{}")
    assert store.store_response(claim.pk, claim.token_text, stored, release=_release("m1"))
    (late,) = store.take(10, timedelta(0))
    (live,) = store.take(10, timedelta(seconds=30))
    assert late.key == live.key
    return late, live


def test_a_late_relays_failure_leaves_a_delivered_message_sent(key: str) -> None:
    """The late relay's send failing for good after the live one delivered the message: its
    mark is refused, so the message is not listed failed, nor sent again by a re-send."""
    with on_redis():
        store: Any = using(ALIAS)
        late, live = _taken_twice(store, key)
        assert store.mark_sent([live.key], counted=True) == 1
        assert store.mark_failed(late.key, "broker down", None, counted=True) == 0
        assert messages() == {"m1": "sent"}
        assert store.failed_messages() == [] and store.backlog().failed == 0
        assert store.resend([late.key]) == 0


def test_a_send_that_succeeds_after_another_relay_gave_up_is_no_failure(key: str) -> None:
    """The live relay gives the message up; the late one's send succeeded: it is sent, and
    neither listed failed nor counted so (a failed count and warning for ever)."""
    with on_redis():
        store: Any = using(ALIAS)
        late, live = _taken_twice(store, key)
        assert store.mark_failed(live.key, "broker down", None, counted=True) == 1
        assert store.mark_sent([late.key], counted=True) == 1
        assert messages() == {"m1": "sent"}
        assert store.failed_messages() == [] and store.backlog().failed == 0


@pytest.mark.parametrize("alias", [ALIAS, "default"])
def test_a_batch_is_cut_at_half_its_lease(
    alias: str, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relay sends a batch for at most half its lease (each send here takes 0.3 of it, on a
    clock of the test's): sent past it, another relay could take what is left, its lease run
    out, and send it too. What is left stays leased to it, sent once the lease passes. On the
    Redis store and on the database's."""
    from django_idempotency._ops import relay

    now = [0.0]
    monkeypatch.setattr(relay, "_clock", lambda: now[0])
    real_send = outbox.send

    def slow(*args: Any) -> None:
        real_send(*args)
        now[0] += 0.3 * conf.OUTBOX_LEASE.total_seconds()

    monkeypatch.setattr(outbox, "send", slow)
    with on_redis():
        store = using(alias)
        claim = _claim(store, key)
        stored = StoredResponse(status=201, headers={}, body=b"{}")
        assert store.store_response(
            claim.pk, claim.token_text, stored, release=_release("m1", "m2", "m3")
        )
        with relay_here():
            first = Relay(alias).run(once=True)
            second = Relay(alias).run(once=True)
    assert (first.sent, second.sent) == (2, 0)  # the third waits for the lease
    assert [kwargs for _, _, kwargs in receipt.sent] == [{}, {}]
    assert store.backlog().pending == 1


class Killed(BaseException):
    """A relay's death between its take and its mark (``except Exception`` does not catch it,
    as nothing catches a SIGKILL)."""


def test_a_relay_killed_between_taking_and_marking_delivers_again(
    post: Post, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with on_redis(OUTBOX_FAST_PATH=False, OUTBOX_LEASE=timedelta(milliseconds=300)):
        ids = post("/order/", {"order": "1"}, key=key).json()["messages"]
        real_send = outbox.send

        def dies(*args: Any) -> None:
            raise Killed

        monkeypatch.setattr(outbox, "send", dies)
        with pytest.raises(Killed):
            relay_once()
        monkeypatch.setattr(outbox, "send", real_send)
        assert relay_once().sent == 0  # leased to the dead relay
        wait_for(
            lambda: relay_once().sent and len(receipt.sent) == 2,
            "the lease to pass and the relay to send",
        )
    assert sorted(sent_ids()) == sorted(ids)  # a batch's lease is one time: taken in any order
    client = raw()
    sends = [int(client.hget(name, "n")) for name in client.scan_iter(match="idempotency:o:m:*")]
    assert sends == [2, 2]  # each taken twice: the dead relay's take counted


def test_a_relay_process_sigkilled_mid_batch_leaves_its_messages_to_the_next(
    post: Post, key: str, tmp_path: Path
) -> None:
    """A real ``idempotency_relay --store`` process takes the batch and is SIGKILLed before it
    marks a message: nothing is marked, no other relay takes the leased messages meanwhile,
    and once the lease passes the next relay delivers each of them."""
    parked = tmp_path / "parked"
    with on_redis(OUTBOX_FAST_PATH=False):
        ids = post("/order/", {"order": "1"}, key=key).json()["messages"]
        relay = subprocess.Popen(
            [sys.executable, "-m", "tests.redis_relay_process", str(parked), "1.5", STORE],
            env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
        )
        try:
            wait_for(parked.exists, "the relay process to take its batch", timeout=30)
            assert relay_once().sent == 0  # leased to the parked relay
        finally:
            relay.kill()
            relay.wait(10)
        assert set(messages().values()) == {"pending"}
        wait_for(
            lambda: relay_once().sent and len(receipt.sent) == 2,
            "the lease to pass and the next relay to send",
        )
    assert sent_ids() == ids
    assert set(messages().values()) == {"sent"}


def test_the_relay_command_relays_a_redis_store(post: Post, key: str) -> None:
    with on_redis(OUTBOX_FAST_PATH=False):
        ids = post("/order/", {"order": "1"}, key=key).json()["messages"]
        out = StringIO()
        with relay_here():
            call_command("idempotency_relay", "--once", "--store", STORE, stdout=out)
    assert f"Sent 2 message(s); 0 failed (Redis store {SHOWN!r})." in out.getvalue()
    assert sent_ids() == ids


def test_the_relay_command_lists_and_retries_a_redis_stores_failed_messages(
    post: Post, key: str
) -> None:
    with on_redis(OUTBOX_FAST_PATH=False, OUTBOX_MAX_ATTEMPTS=1):
        post("/order/", {"order": "1"}, key=key)
        receipt.failing = 2
        assert relay_once().failed == 2
        assert set(messages().values()) == {"failed"}
        assert backlog(ALIAS)["outbox_failed"] == 2
        out = StringIO()
        call_command("idempotency_stats", "--json", stdout=out)
        stats = json.loads(out.getvalue())
        assert stats["redis_stores"][SHOWN]["outbox_failed"] == 2
        assert stats["outbox_failed"] == 0  # the database's
        assert any(
            f"Redis store {SHOWN!r}: 2 outbox message(s) failed" in w for w in stats["warnings"]
        )
        out = StringIO()
        call_command("idempotency_relay", "--failed", "--store", STORE, stdout=out)
        assert "ConnectionError: broker" in out.getvalue()
        assert "2 message(s) failed." in out.getvalue()
        with relay_here():
            call_command("idempotency_relay", "--retry-failed", "--once", "--store", STORE)
    assert set(messages().values()) == {"sent"}
    assert len(sent_ids()) == 2


def test_the_relay_command_relays_the_store_the_views_use_by_default(post: Post, key: str) -> None:
    """Without ``--store`` the relay is ``STORE``'s, as are ``--failed`` and ``--retry-failed``:
    on a project whose ``STORE`` is Redis it relayed the database's empty outbox, "Sent 0".
    ``--store database`` picks the database's."""
    with on_redis(OUTBOX_FAST_PATH=False, OUTBOX_MAX_ATTEMPTS=1):
        post("/order/", {"order": "1"}, key=key)
        receipt.failing = 2
        out = StringIO()
        with relay_here():
            call_command("idempotency_relay", "--once", stdout=out)
        assert f"Sent 0 message(s); 2 failed (Redis store {SHOWN!r})." in out.getvalue()
        out = StringIO()
        call_command("idempotency_relay", "--failed", stdout=out)
        assert "2 message(s) failed." in out.getvalue()
        out = StringIO()
        with relay_here():
            call_command("idempotency_relay", "--store", "database", "--once", stdout=out)
        assert "Sent 0 message(s); 0 failed (database 'default')." in out.getvalue()
        out = StringIO()
        with relay_here():
            call_command("idempotency_relay", "--retry-failed", "--once", stdout=out)
        assert f"Sent 2 message(s); 0 failed (Redis store {SHOWN!r})." in out.getvalue()
    assert set(messages().values()) == {"sent"}
    assert len(sent_ids()) == 2


def test_a_relay_following_a_redis_store_says_the_databases_outbox_holds_messages() -> None:
    """A project whose ``STORE`` is Redis staged on the database (views on
    ``store="database"``, the only outbox its ``STORE`` had): a relay started as before now
    relays the Redis store, and says that the database's messages need ``--store database``;
    with that, or with nothing there, it says nothing."""
    from django_idempotency.models import IdempotencyKey, OutboxMessage

    record = IdempotencyKey.objects.create(
        scope="s",
        key_hash="h" * 64,
        method="POST",
        path="/p",
        request_hash="f",
        expires_at=timezone.now(),
    )
    OutboxMessage.objects.create(
        record=record, message_id="m-db", engine="celery", task="t", arguments="{}"
    )
    told, quiet = StringIO(), StringIO()
    with on_redis(), relay_here():
        call_command("idempotency_relay", "--once", stderr=told, stdout=StringIO())
        call_command("idempotency_relay", "--store", STORE, "--once", stderr=quiet,
                     stdout=StringIO())  # fmt: skip
    assert "holds 1 message(s) this relay does not send" in told.getvalue()
    assert "--store database" in told.getvalue()
    assert quiet.getvalue() == ""


@pytest.mark.parametrize(
    "options", [["--once"], ["--failed"], ["--retry-failed", "--once"], ["--retry-failed"]]
)
def test_the_relay_command_says_a_store_that_does_not_answer(options: list[str]) -> None:
    """A ``CommandError`` naming the store (exit status 1), not a traceback."""
    down = "redis://127.0.0.1:1/0"
    with pytest.raises(CommandError, match=r"^The Redis store 'redis://127.0.0.1:1/0' did not "
                       r"answer: \w+: Error 111 connecting[^\n]*$"):  # fmt: skip
        call_command("idempotency_relay", "--store", down, *options)
    with override_settings(IDEMPOTENCY={"STORE": down}), pytest.raises(CommandError):
        call_command("idempotency_relay", *options)


def test_stats_shows_a_redis_stores_outbox_and_names_it_in_its_advice(post: Post, key: str) -> None:
    """Plain ``idempotency_stats`` shows each Redis store's outbox (it showed the database's
    only), and its warning's commands name the store unless it is ``STORE``."""
    with on_redis(OUTBOX_FAST_PATH=False, OUTBOX_MAX_ATTEMPTS=1):
        post("/order/", {"order": "1"}, key=key)
        receipt.failing = 2
        assert relay_once().failed == 2
        out = StringIO()
        call_command("idempotency_stats", stdout=out)
        text = out.getvalue()
        assert f"Redis store {SHOWN!r} (its records expire by Redis's own TTL" in text
        assert "  Outbox undelivered: 0 pending, 2 failed (oldest " in text
        assert "  Records:            1 (processing 0, completed 1, failed 0)" in text
        assert "with idempotency_relay --failed, send them again with idempotency_relay " in text
        assert store_option("database", "default") == " --store database"
        assert store_option("database", "other") == " --database other"
    # STORE is the database, and a view's store is Redis.
    with override_settings(ROOT_URLCONF=__name__, IDEMPOTENCY={"STORE": "database"}):
        out = StringIO()
        call_command("idempotency_stats", "--json", stdout=out)
        [warning] = json.loads(out.getvalue())["warnings"]
        assert f"idempotency_relay --store {SHOWN} --failed" in warning
        assert f"idempotency_relay --store {SHOWN} --retry-failed" in warning
        assert store_option("database", "default") == ""


@idempotent(store=STORE)
def _on_redis(request: Any) -> Any:
    raise AssertionError("never requested: the view names its store")


urlpatterns = [path("on-redis/", _on_redis)]


def test_the_relay_command_refuses_what_is_no_redis_store() -> None:
    with pytest.raises(CommandError, match="not 'database', an alias of CACHES"):
        call_command("idempotency_relay", "--once", "--store", "nowhere")
    with pytest.raises(CommandError, match="not both"):
        call_command("idempotency_relay", "--once", "--store", STORE, "--database", "default")


def test_a_view_that_enqueues_on_a_redis_cluster_passes_the_checks() -> None:
    """A cluster serves the outbox (each slot's queues): its views that call ``enqueue`` are
    no longer refused at startup (they were, E065, before): only the views that need the
    database's transaction are (E061)."""
    with override_settings(IDEMPOTENCY={"STORE": "redis+cluster://127.0.0.1:1"}):
        refused = store_checks.check_stores()
    assert refused and {error.id for error in refused} == {"django_idempotency.E061"}


def test_an_idempotent_function_enqueues_on_redis() -> None:
    from django_idempotency import idempotent_function

    @idempotent_function(key="event_id", store=STORE)
    def handle(event_id: str, *, idempotency: Any) -> str:
        return idempotency.enqueue(receipt, event_id)  # type: ignore[no-any-return]

    message = handle("e1")
    assert handle("e1") == message
    assert sent_ids() == [message]


def test_enqueue_still_refuses_what_cannot_be_sent() -> None:
    from django_idempotency import idempotent_function

    @idempotent_function(key="event_id", store=STORE)
    def handle(event_id: str, *, idempotency: Any) -> str:
        return idempotency.enqueue(print, event_id)  # type: ignore[no-any-return]

    with pytest.raises(TypeError, match="plain function"):
        handle("e1")


def test_a_relay_outlives_a_redis_store_that_does_not_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A pass that meets the store down is logged and made again (as a database's failure
    is), not the relay's end; ``--once`` (cron) exits with the store's error."""
    from django.db import DatabaseError

    from tests.relaying import relay_thread

    down = "redis://127.0.0.1:1/0"
    with pytest.raises(DatabaseError), relay_here():
        Relay(down).run(once=True)
    relay = Relay(down, interval=0.05)
    with relay_thread(relay, join=10) as thread:
        wait_for(
            lambda: caplog.text.count("Outbox relay: the store failed") >= 2,
            "two failed passes, the relay living on",
            timeout=30,
        )
        assert thread.is_alive()
    assert not thread.is_alive()
