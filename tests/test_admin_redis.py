"""The admin's list of a Redis store's records (through the store contract's ``browse`` and
``records_of``), through Django's test client against the tests' Redis server, and a cluster of
the module's own: the view permission, pages by ``SCAN`` cursor, the status filter, the key
search, no stored body in the list."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings
from redis.crc import key_slot

from django_idempotency import idempotent_function
from django_idempotency._base.keys import hash_key
from django_idempotency._ops import browsing
from django_idempotency._store import using
from django_idempotency.admin import IdempotencyKeyAdmin
from django_idempotency.testing import hold_key
from tests.conftest import REDIS_STORE_NAME, flush_redis
from tests.redis_servers import private_cluster
from tests.test_admin import staff

pytestmark = [pytest.mark.redis, pytest.mark.django_db]

CHANGELIST = "/admin/django_idempotency/idempotencykey/"


@pytest.fixture(autouse=True)
def _empty() -> None:
    flush_redis()


@pytest.fixture
def admin_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", None))
    return client


@idempotent_function(key="event_id", scope=lambda event_id: f"tenant-{event_id[-1]}", ttl=600)
def handle(event_id: str) -> dict[str, str]:
    return {"secret": f"body-of-{event_id}"}


def on_store(store: str = REDIS_STORE_NAME) -> Any:
    return override_settings(IDEMPOTENCY={"STORE": store})


def store_url() -> str:
    """The list's URL of the store the settings name."""
    (store,) = browsing.browsed()
    return f"{CHANGELIST}redis/{store.tag}/"


def hashes(page: Any) -> list[str]:
    """The full key hashes of a list page's records (each short hash's tooltip)."""
    return re.findall(r'<span title="([0-9a-f]{64})">', page.content.decode())


def walk(client: Client, url: str, query: str = "") -> tuple[list[str], int]:
    """Every record the list's pages show, following "Next page" to the end; and how many
    pages that took."""
    seen: list[str] = []
    pages = 0
    link: str | None = url + query
    while link is not None:
        page = client.get(link)
        assert page.status_code == 200
        pages += 1
        seen += hashes(page)
        found = re.search(r'href="(\?cursor=[^"]+)" id="idempotency-next"', page.content.decode())
        link = url + found.group(1).replace("&amp;", "&") if found else None
        assert pages < 100
    return seen, pages


def test_the_list_shows_a_redis_stores_records_and_no_body(admin_client: Client) -> None:
    with on_store():
        handle("k1")
        hold_key("k2", handle, "k2")
        url = store_url()
        table = admin_client.get(CHANGELIST)
        page = admin_client.get(url)
    assert f'href="{url}"' in table.content.decode()  # linked from the table's list
    text = page.content.decode()
    assert page.status_code == 200
    assert sorted(hashes(page)) == sorted([hash_key("k1"), hash_key("k2")])
    assert "tenant-1" in text and "tenant-2" in text and "completed" in text
    assert "processing" in text and "CALL" in text
    assert "body-of-k1" not in text  # the list shows no stored body, as the table's


def test_staff_without_the_view_permission_get_403(admin_client: Client) -> None:
    with on_store():
        handle("k1")
        url = store_url()
        assert staff("change_outboxmessage").get(url).status_code == 403
        User.objects.filter(username="staff").delete()
        viewer = staff("view_idempotencykey")
        assert hashes(viewer.get(url)) == [hash_key("k1")]
        assert admin_client.get(f"{CHANGELIST}redis/00000000/").status_code == 404


def test_pages_follow_the_scan_cursor_to_the_end(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(IdempotencyKeyAdmin, "redis_page_size", 5)
    with on_store():
        for n in range(40):
            handle(f"k{n}")
        seen, pages = walk(admin_client, store_url())
    assert sorted(seen) == sorted(hash_key(f"k{n}") for n in range(40))
    assert pages >= 4  # no page read the whole keyspace


def test_the_status_filter(admin_client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(IdempotencyKeyAdmin, "redis_page_size", 3)
    with on_store():
        for n in range(12):
            handle(f"done{n}")
        for n in range(4):
            hold_key(f"held{n}", handle, f"held{n}")
        url = store_url()
        processing, _ = walk(admin_client, url, "?status=processing")
        completed, _ = walk(admin_client, url, "?status=completed")
        failed, _ = walk(admin_client, url, "?status=failed")
    assert sorted(processing) == sorted(hash_key(f"held{n}") for n in range(4))
    assert sorted(completed) == sorted(hash_key(f"done{n}") for n in range(12))
    assert failed == []


def test_the_search_takes_an_exact_key_or_its_hash(admin_client: Client) -> None:
    with on_store():
        for n in range(5):
            handle(f"k{n}")
        url = store_url()
        by_key = admin_client.get(url, {"q": "k3"})
        quoted = admin_client.get(url, {"q": '"k3"'})
        by_hash = admin_client.get(url, {"q": hash_key("k4").upper()})
        filtered = admin_client.get(url, {"q": "k3", "status": "processing"})
        nothing = admin_client.get(url, {"q": "k"})
    assert hashes(by_key) == hashes(quoted) == [hash_key("k3")]
    assert hashes(by_hash) == [hash_key("k4")]
    assert hashes(filtered) == hashes(nothing) == []
    assert "idempotency-next" not in by_key.content.decode()


@pytest.fixture(scope="module")
def cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with private_cluster(tmp_path_factory.mktemp("cluster")) as url:
        yield url


def test_a_clusters_records_are_paged_primary_by_primary(
    admin_client: Client, cluster_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(IdempotencyKeyAdmin, "redis_page_size", 4)
    with on_store(cluster_url):
        for n in range(30):
            handle(f"k{n}")
        seen, pages = walk(admin_client, store_url())
        searched = admin_client.get(store_url(), {"q": "k7"})
        first = using(cluster_url).browse("0", size=4)
    assert sorted(seen) == sorted(hash_key(f"k{n}") for n in range(30))
    # The first primary's scan, or the second's start where the page's last SCAN ended the
    # first's (its table's buckets all visited: the cursor of Redis back at 0).
    assert pages >= 3 and first[1] is not None
    assert first[1].startswith("0:") or first[1] == "1:0", first[1]
    assert hashes(searched) == [hash_key("k7")]


def record_link(client: Client, url: str, key: str) -> str:
    """The record page's link in the list, of the record of ``key``."""
    text = client.get(url, {"q": key}).content.decode()
    found = re.search(r'<a href="([^"]+/record/\?[^"]+)">', text)
    assert found is not None
    return found.group(1).replace("&amp;", "&")


def test_a_records_page_shows_its_stored_response(admin_client: Client) -> None:
    with on_store():
        handle("k1")
        hold_key("k2", handle, "k2")
        done = admin_client.get(record_link(admin_client, store_url(), "k1"))
        held = admin_client.get(record_link(admin_client, store_url(), "k2"))
        missing = admin_client.get(f"{store_url()}record/", {"scope": "t", "key": "0" * 64})
    assert done.status_code == held.status_code == 200
    assert "body-of-k1" in done.content.decode() and "tenant-1" in done.content.decode()
    assert hash_key("k2") in held.content.decode() and "processing" in held.content.decode()
    assert missing.status_code == 404


def test_with_encryption_keys_the_body_needs_the_view_stored_response_permission() -> None:
    from cryptography.fernet import Fernet

    with override_settings(
        IDEMPOTENCY={"STORE": REDIS_STORE_NAME, "ENCRYPTION_KEYS": [Fernet.generate_key().decode()]}
    ):
        handle("k1")
        viewer = staff("view_idempotencykey")
        link = record_link(viewer, store_url(), "k1")
        hidden = viewer.get(link).content.decode()
        User.objects.filter(username="staff").delete()
        allowed = staff("view_idempotencykey", "view_stored_response")
        shown = allowed.get(link).content.decode()
        assert staff_403(link)
    assert "body-of-k1" not in hidden and "Encrypted;" in hidden
    assert "body-of-k1" in shown


def staff_403(url: str) -> bool:
    user = User.objects.create_user("other", is_staff=True)
    client = Client()
    client.force_login(user)
    return client.get(url).status_code == 403


def failed_messages(*ids: str, key: str = "k") -> list[str]:
    """Messages ``ids`` released with a result and failed for good, as a relay leaves them
    (through the store contract, on the tests' server); their keys."""
    from datetime import timedelta

    from django_idempotency._call import outbox
    from django_idempotency._call.identity import Identity
    from django_idempotency._store import StoredResponse
    from django_idempotency._store.outbox import Message, Release

    store: Any = using(browsing.browsed()[0].alias)
    identity = Identity(
        key=key, scope="s", key_hash=hash_key(key), fingerprint="f", method="POST", path="/p"
    )
    claim = store.claim(identity, ttl=timedelta(hours=1), lock_timeout=timedelta(seconds=30))
    release = Release(
        0, [Message(id_, outbox.CELERY, "task.name", "{}") for id_ in ids], timedelta(0), False
    )
    stored = StoredResponse(status=201, headers=[], body=b"{}")
    assert store.store_response(claim.pk, claim.token_text, stored, release=release)
    taken = store.take(10, timedelta(seconds=30))
    for message in taken:
        assert store.mark_failed(message.key, "broker down", None, counted=True) == 1
    return [message.key for message in sorted(taken, key=lambda message: message.message_id)]


def outbox_url() -> str:
    return f"/admin/django_idempotency/outboxmessage/redis/{browsing.browsed()[0].tag}/"


def test_the_outbox_page_lists_failed_messages_and_sends_them_again(
    admin_client: Client,
) -> None:
    with on_store():
        first, second = failed_messages("m1", "m2")
        url = outbox_url()
        listed = admin_client.get(url)
        table = admin_client.get("/admin/django_idempotency/outboxmessage/")
        made_up = "idempotency:o:m:{x:y}:m9"
        sent = admin_client.post(url, {"_selected": [first, made_up]}, follow=True)
        store: Any = using(browsing.browsed()[0].alias)
        left = [message.message_id for message in store.failed_messages()]
        backlog = store.backlog()
    text = listed.content.decode()
    assert "m1" in text and "m2" in text and "broker down" in text and "Failed for good: 2" in text
    assert f'href="{url}"' in table.content.decode()
    # The table's list says the store's messages are not in it (its link alone did not).
    assert "keeps its messages: they are not in this list." in table.content.decode()
    assert "1 message(s) will be sent again." in sent.content.decode()
    assert left == ["m2"] and backlog.pending == 1 and backlog.failed == 1
    assert second in text  # the second is still offered


def test_the_outbox_page_needs_the_view_and_change_permissions() -> None:
    with on_store():
        (key,) = failed_messages("m1")
        assert staff("view_idempotencykey").get(outbox_url()).status_code == 403
        User.objects.filter(username="staff").delete()
        viewer = staff("view_outboxmessage")
        page = viewer.get(outbox_url())
        refused = viewer.post(outbox_url(), {"_selected": [key]})
        store: Any = using(browsing.browsed()[0].alias)
        still = [message.pk for message in store.failed_messages()]
    assert page.status_code == 200 and "idempotency-resend" not in page.content.decode()
    assert refused.status_code == 403 and still == [key]


def test_a_clusters_outbox_page_lists_and_resends_every_slots_messages(
    admin_client: Client, cluster_url: str
) -> None:
    """A cluster keeps each slot's messages in its own queues: the page lists the failed ones
    of every slot, and sends them again (it said the store served no outbox before)."""
    with on_store(cluster_url):
        keys = failed_messages("m1", key="k") + failed_messages("m2", key="other")
        page = admin_client.get(outbox_url())
        sent = admin_client.post(outbox_url(), {"_selected": keys}, follow=True)
        backlog = using(browsing.browsed()[0].alias).backlog()
    assert len({key_slot(key.encode()) for key in keys}) == 2  # two slots
    text = page.content.decode()
    assert "m1" in text and "m2" in text and "Failed for good: 2" in text
    assert "2 message(s) will be sent again." in sent.content.decode()
    assert (backlog.pending, backlog.failed) == (2, 0)


def test_a_store_that_does_not_answer_is_said_so(admin_client: Client) -> None:
    from tests.redis_servers import free_port

    with on_store(f"redis://127.0.0.1:{free_port()}/0"):
        listed = admin_client.get(store_url())
        outbox = admin_client.get(outbox_url())
    assert listed.status_code == outbox.status_code == 200
    assert "did not answer" in listed.content.decode()
    assert "did not answer" in outbox.content.decode()


def test_a_cache_alias_store_is_named_as_the_settings_and_commands_name_it(
    admin_client: Client,
) -> None:
    """``STORE`` naming a ``CACHES`` alias: the pages said ``cache:<alias>``, the store layer's
    name, where ``STORE``, the checks and the commands say the alias. An alias of its own (a
    server that does not answer: the names are the point), so that the cluster's lane runs it
    too."""
    from django.conf import settings

    from tests.redis_servers import free_port

    caches = {
        **settings.CACHES,
        "named_cache": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{free_port()}/0",
        },
    }
    with override_settings(CACHES=caches), on_store("named_cache"):
        pages = [admin_client.get(url).content.decode() for url in (store_url(), outbox_url())]
        table = admin_client.get("/admin/django_idempotency/outboxmessage/").content.decode()
    assert "Idempotency keys in the Redis store &#x27;named_cache&#x27;" in pages[0]
    assert "Outbox of the Redis store &#x27;named_cache&#x27;" in pages[1]
    assert "Redis store &#x27;named_cache&#x27; keeps its messages" in table
    assert all("cache:named_cache" not in page for page in [*pages, table])


def test_a_stores_password_reaches_no_page(admin_client: Client) -> None:
    """A ``STORE`` URL's password is shown nowhere: not in the table's links, the pages' names
    nor their URLs (a keyed hash of the name marks the store)."""
    from tests.redis_servers import free_port

    with on_store(f"redis://:s3cret-pw@127.0.0.1:{free_port()}/0"):
        pages = [
            admin_client.get("/admin/django_idempotency/idempotencykey/"),
            admin_client.get("/admin/django_idempotency/outboxmessage/"),
            admin_client.get(store_url()),
            admin_client.get(outbox_url()),
        ]
    assert [page.status_code for page in pages] == [200] * 4
    assert all("s3cret-pw" not in page.content.decode() for page in pages)
    assert "127.0.0.1" in pages[2].content.decode()  # the store is named, without its secret


# -- the table's actions on a Redis store's records (issue 52) ---------------------------------


def owner(key: str, *, live: bool) -> tuple[Any, Any]:
    """A claim of ``key`` (scope ``tenant-<last character>``: a principal of its own) made
    through the store contract, its owner still holding it (``live``) or its lock lapsed at
    once, as a worker that died (or stalls) leaves it; the store and the claim."""
    from datetime import timedelta

    from django_idempotency._call.identity import Identity

    store: Any = using(browsing.browsed()[0].alias)
    identity = Identity(
        key=key,
        scope=f"tenant-{key[-1]}",
        key_hash=hash_key(key),
        fingerprint="f",
        method="POST",
        path="/orders/",
    )
    lock = timedelta(seconds=30 if live else 0)
    claim = store.claim(identity, ttl=timedelta(hours=1), lock_timeout=lock)
    assert claim is not None and claim.pk is not None
    return store, claim


def selected(*keys: str) -> list[str]:
    """The list's checkbox values of the records of ``keys`` (their scope as :func:`owner`'s)."""
    return [f"{hash_key(key)}:tenant-{key[-1]}" for key in keys]


def action_url() -> str:
    return f"{store_url()}action/"


def run_action(client: Client, action: str, *keys: str, confirm: bool = True) -> Any:
    """The action on ``keys``' records as the list's form posts it, then (``confirm``) as its
    confirmation page's form posts it."""
    data: dict[str, Any] = {"action": action, "_selected": selected(*keys)}
    if confirm:
        data["post"] = "yes"
    return client.post(action_url(), data, follow=confirm)


def result() -> Any:
    from django_idempotency._store import StoredResponse

    return StoredResponse(status=201, headers=[], body=b'{"id": 1}')


def status_of(store: Any, key: str) -> str | None:
    record = store.read(f"tenant-{key[-1]}", hash_key(key))
    return None if record is None else record.status


def test_the_list_offers_the_actions_to_staff_who_may_change_records(admin_client: Client) -> None:
    with on_store():
        owner("k1", live=False)
        page = admin_client.get(store_url()).content.decode()
        viewer = staff("view_idempotencykey").get(store_url()).content.decode()
    assert 'name="_selected"' in page and 'value="release_stale"' in page
    assert 'value="mark_failed"' in page and 'value="delete_expired"' not in page
    assert "csrfmiddlewaretoken" in page
    assert 'name="_selected"' not in viewer and "idempotency-actions" not in viewer


def test_release_asks_for_confirmation_then_releases_the_stale_records_only(
    admin_client: Client,
) -> None:
    with on_store():
        store, _ = owner("k1", live=False)
        owner("k2", live=False)
        owner("k3", live=True)
        _, done_claim = owner("k4", live=True)
        assert store.store_response(done_claim.pk, done_claim.token_text, result())
        keys = ("k1", "k2", "k3", "k4")
        asked = run_action(admin_client, "release_stale", *keys, confirm=False)
        before = [status_of(store, key) for key in keys]
        done = run_action(admin_client, "release_stale", *keys)
        after = [status_of(store, key) for key in keys]
        url = store_url()
    text = asked.content.decode()
    assert asked.status_code == 200 and "Are you sure?" in text and 'name="post"' in text
    assert "2 of them are stale now." in text and all(hash_key(key) in text for key in keys)
    assert "in the Redis store &#x27;" in text  # as the store's class describes it
    assert before == ["processing", "processing", "processing", "completed"]  # nothing yet
    assert "Released 2 of 4 selected records; 2 were not stale" in done.content.decode()
    assert done.redirect_chain[-1][0] == url
    assert after == [None, None, "processing", "completed"]


def test_mark_failed_stores_the_abandoned_failure_in_the_stale_records_only(
    admin_client: Client,
) -> None:
    with on_store():
        store, _ = owner("k1", live=False)
        owner("k2", live=True)
        owner("k3", live=False)
        done = run_action(admin_client, "mark_failed", "k1", "k2", "k3")
        failed = store.read("tenant-1", hash_key("k1"))
        after = [status_of(store, key) for key in ("k1", "k2", "k3")]
        erased = store.erase_scope("tenant-1")  # a failed record is in its scope's index
    assert "Marked as failed 2 of 3 selected records" in done.content.decode()
    assert after == ["failed", "processing", "failed"]
    assert failed.response_status == 500 and failed.unlock_at is None
    assert b"request-abandoned" in bytes(failed.response_body)
    assert erased == (1, 0)


def test_an_owner_still_running_is_fenced_after_the_action(admin_client: Client) -> None:
    """An owner whose lock lapsed (a stall, not a death) writes its result after an operator
    acted: refused after a release (no record is made again), refused after a failure (the
    operator's failure stays, never taken for the owner's own result); an owner whose lock is
    live is left alone and stores its result."""
    with on_store():
        store, released = owner("k1", live=False)
        _, failed = owner("k2", live=False)
        _, live = owner("k3", live=True)
        run_action(admin_client, "release_stale", "k1", "k3")
        run_action(admin_client, "mark_failed", "k2", "k3")
        writes = [
            store.store_response(claim.pk, claim.token_text, result())
            for claim in (released, failed, live)
        ]
        records = [store.read(f"tenant-{n}", hash_key(f"k{n}")) for n in (1, 2, 3)]
    assert writes == [False, False, True]
    assert records[0] is None
    assert records[1].status == "failed" and records[1].response_status == 500
    # The operator's own token: the owner's is refused.
    assert str(records[1].lock_token) != failed.token_text
    assert records[2].status == "completed" and records[2].response_status == 201


def test_the_action_needs_the_change_permission_and_staff() -> None:
    from django.contrib.auth.models import Permission

    with on_store():
        store, _ = owner("k1", live=False)
        viewer = staff("view_idempotencykey")
        refused = run_action(viewer, "release_stale", "k1", confirm=False)
        refused_yes = run_action(viewer, "release_stale", "k1")
        after_viewer = status_of(store, "k1")
        user = User.objects.create_user("notstaff")
        user.user_permissions.set(Permission.objects.filter(codename="change_idempotencykey"))
        outsider = Client()
        outsider.force_login(user)
        not_staff = outsider.post(
            action_url(), {"action": "release_stale", "_selected": selected("k1"), "post": "yes"}
        )
        after_outsider = status_of(store, "k1")
        User.objects.filter(username="staff").delete()
        changer = staff("view_idempotencykey", "change_idempotencykey")
        done = run_action(changer, "release_stale", "k1")
    assert refused.status_code == refused_yes.status_code == 403
    assert not_staff.status_code == 302 and "/login/" in not_staff["Location"]
    assert after_viewer == after_outsider == "processing"
    assert "Released 1 of 1 selected records" in done.content.decode()
    assert status_of(store, "k1") is None


def test_the_action_checks_csrf_and_takes_post_only() -> None:
    with on_store():
        store, _ = owner("k1", live=False)
        client = Client(enforce_csrf_checks=True)
        client.force_login(User.objects.create_superuser("admin", "admin@example.com", None))
        forged = run_action(client, "release_stale", "k1")
        fetched = client.get(action_url())
        after = status_of(store, "k1")
        page = client.get(store_url())
        token = page.cookies["csrftoken"].value
        done = client.post(
            action_url(),
            {
                "action": "release_stale",
                "_selected": selected("k1"),
                "post": "yes",
                "csrfmiddlewaretoken": token,
            },
        )
    assert forged.status_code == 403 and fetched.status_code == 405 and after == "processing"
    assert done.status_code == 302 and status_of(store, "k1") is None


def test_an_action_without_records_or_a_known_action_changes_nothing(
    admin_client: Client,
) -> None:
    with on_store():
        store, _ = owner("k1", live=False)
        nothing = admin_client.post(action_url(), {"action": "release_stale"}, follow=True)
        unknown = run_action(admin_client, "delete_expired", "k1")
        made_up = admin_client.post(
            action_url(),
            {"action": "release_stale", "_selected": ["nothex:tenant-1"], "post": "yes"},
            follow=True,
        )
        after = status_of(store, "k1")
    for page in (nothing, unknown, made_up):
        assert "nothing was changed" in page.content.decode()
    assert after == "processing"


def test_the_actions_on_a_clusters_records(admin_client: Client, cluster_url: str) -> None:
    """On a Redis Cluster too: each record's script on its own node; a failed record joins its
    scope's index after its script, so the scope's erasure finds it."""
    with on_store(cluster_url):
        store, _ = owner("k1", live=False)
        owner("k2", live=False)
        owner("k3", live=True)
        released = run_action(admin_client, "release_stale", "k1", "k3")
        failed = run_action(admin_client, "mark_failed", "k2", "k3")
        after = [status_of(store, key) for key in ("k1", "k2", "k3")]
        erased = store.erase_scope("tenant-2")
    assert "Released 1 of 2 selected records" in released.content.decode()
    assert "Marked as failed 1 of 2 selected records" in failed.content.decode()
    assert after == [None, "failed", "processing"]
    assert erased == (1, 0)


# -- the admin index's entry (a proxy model, no permissions of its own) ------------------------

ENTRY = "/admin/django_idempotency/redisidempotencykey/"


def test_the_admin_index_lists_the_redis_records_entry(admin_client: Client) -> None:
    with on_store():
        index = admin_client.get("/admin/").content.decode()
        entry = admin_client.get(ENTRY)
        viewer = staff("view_idempotencykey")
        viewer_index = viewer.get("/admin/").content.decode()
        viewer_entry = viewer.get(ENTRY)
        url = store_url()
    with override_settings(IDEMPOTENCY={"STORE": "database"}):
        databases = admin_client.get("/admin/").content.decode()
        refused = admin_client.get(ENTRY)
    assert f'href="{ENTRY}"' in index and "Idempotency keys in the Redis store &#x27;" in index
    assert entry.status_code == viewer_entry.status_code == 302
    assert entry["Location"] == viewer_entry["Location"] == url
    assert f'href="{ENTRY}"' in viewer_index
    assert f'href="{ENTRY}"' not in databases and refused.status_code == 403


def test_the_entry_needs_the_tables_view_permission_and_reads_no_table_record(
    admin_client: Client,
) -> None:
    from tests.factories import IdempotencyKeyFactory

    record = IdempotencyKeyFactory()
    with on_store():
        other = staff("view_outboxmessage")
        index = other.get("/admin/").content.decode()
        refused = other.get(ENTRY)
        pages = [
            admin_client.get(f"{ENTRY}{record.pk}/change/"),
            admin_client.get(f"{ENTRY}add/"),
            admin_client.get(f"{ENTRY}{record.pk}/delete/"),
        ]
    assert f'href="{ENTRY}"' not in index and refused.status_code == 403
    assert [page.status_code for page in pages] == [404] * 3


def test_the_entry_lists_several_stores(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two Redis stores named (``STORE`` and a view's ``store``, as :func:`.other_stores`
    finds them): the entry lists both, each a link to its records."""
    from tests.redis_servers import free_port

    other = f"redis://127.0.0.1:{free_port()}/0"
    monkeypatch.setattr(browsing, "other_stores", lambda: {REDIS_STORE_NAME, other})
    page = admin_client.get(ENTRY)
    text = page.content.decode()
    stores = browsing.browsed()
    assert page.status_code == 200 and len(stores) == 2
    assert all(f'href="{CHANGELIST}redis/{each.tag}/"' in text for each in stores)
    assert "127.0.0.1" in text
