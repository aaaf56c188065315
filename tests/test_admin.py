"""The read-only admin, through Django's test client, as a superuser and as lesser staff."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client, override_settings
from django.utils import timezone

from django_idempotency import IdempotencyKey, idempotent_function
from django_idempotency._ops import maintenance
from tests.factories import IdempotencyKeyFactory

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/django_idempotency/idempotencykey/"
PROCESSING = IdempotencyKey.Status.PROCESSING


def change_url(record: IdempotencyKey) -> str:
    return f"{CHANGELIST}{record.pk}/change/"


def listed(client: Client, query: str = "") -> set[int]:
    response = client.get(CHANGELIST + query)
    assert response.status_code == 200
    return {record.pk for record in response.context["cl"].result_list}


def staff(*codenames: str) -> Client:
    user = User.objects.create_user("staff", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def act(client: Client, action: str, *records: IdempotencyKey, confirm: bool = True) -> Any:
    """The action on ``records`` as the list's form posts it, then (``confirm``) as its
    confirmation page's form posts it (``post=yes``)."""
    data: dict[str, Any] = {"action": action, "_selected_action": [r.pk for r in records]}
    if confirm:
        data["post"] = "yes"
    return client.post(CHANGELIST, data, follow=True)


def confirmation_form(page: str) -> dict[str, Any]:
    """What the confirmation page's form posts: its hidden fields, as a browser sends them."""
    start = page.index('<form method="post">')
    form = page[start : page.index("</form>", start)]
    data: dict[str, Any] = {}
    for name, value in re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', form):
        data.setdefault(name, []).append(value)
    return data


@pytest.mark.parametrize("action", ["release_stale", "mark_failed"])
def test_an_action_asks_for_confirmation_then_applies_what_was_confirmed(
    admin_client: Client, records: dict[str, IdempotencyKey], action: str
) -> None:
    """As the Redis store's actions and Django's delete: the list's post shows the records and
    changes nothing; the page's form (its CSRF token, ``post=yes``) runs the action."""
    stale, live = records["stale"], records["live"]
    asked = act(admin_client, action, stale, live, confirm=False)
    page = asked.content.decode()
    assert asked.status_code == 200 and "Are you sure?" in page
    assert "in the database &#x27;default&#x27;" in page and "1 of them is stale now." in page
    assert stale.key_hash in page and live.key_hash in page
    assert 'name="csrfmiddlewaretoken"' in page and 'href="/admin/django_idempotency/' in page
    stale.refresh_from_db()
    assert stale.status == PROCESSING  # nothing yet

    form = confirmation_form(page)
    assert form["action"] == [action] and form["post"] == ["yes"]
    assert sorted(form["_selected_action"]) == sorted([str(stale.pk), str(live.pk)])
    done = admin_client.post(CHANGELIST, form, follow=True)
    assert "1 of 2 selected records" in done.content.decode()
    left = IdempotencyKey.objects.filter(pk=stale.pk).first()
    assert left is None if action == "release_stale" else left.status == "failed"  # type: ignore[union-attr]
    assert IdempotencyKey.objects.get(pk=live.pk).status == PROCESSING


def test_cancelling_the_confirmation_changes_nothing(
    admin_client: Client, records: dict[str, IdempotencyKey]
) -> None:
    """ "No, take me back" is a link to the list as it was (a ``GET``): no action runs."""
    stale = records["stale"]
    page = act(admin_client, "release_stale", stale, confirm=False).content.decode()
    back = re.search(r'<a href="([^"]+)" class="button cancel-link">', page)
    assert back is not None and back.group(1) == CHANGELIST
    assert admin_client.get(back.group(1)).status_code == 200
    stale.refresh_from_db()
    assert stale.status == PROCESSING and stale.lock_token is not None


def test_the_confirmation_carries_a_selection_across_the_list_s_filter(
    admin_client: Client, records: dict[str, IdempotencyKey]
) -> None:
    """ "Select all" across the pages of a filtered list: the confirmation posts the filter's
    selection again (the filter in its URL), not the page's records alone."""
    url = f"{CHANGELIST}?stale=yes"
    data = {
        "action": "mark_failed",
        "_selected_action": [records["stale"].pk],
        "select_across": "1",
        "index": "0",
    }
    page = admin_client.post(url, data).content.decode()
    form = confirmation_form(page)
    assert form["select_across"] == ["1"] and "1 of them is stale now." in page
    assert admin_client.post(url, form, follow=True).status_code == 200
    records["stale"].refresh_from_db()
    assert records["stale"].status == "failed"


def test_delete_expired_asks_for_confirmation_first(
    admin_client: Client, records: dict[str, IdempotencyKey]
) -> None:
    asked = act(admin_client, "delete_expired", records["expired"], records["live"], confirm=False)
    assert "1 of them is expired now." in asked.content.decode()
    assert IdempotencyKey.objects.filter(pk=records["expired"].pk).exists()
    done = admin_client.post(CHANGELIST, confirmation_form(asked.content.decode()), follow=True)
    assert "Deleted 1 of 2 selected records" in done.content.decode()
    assert not IdempotencyKey.objects.filter(pk=records["expired"].pk).exists()


@pytest.mark.parametrize("confirm", [False, True])
def test_staff_without_the_change_permission_get_no_confirmation_and_change_nothing(
    records: dict[str, IdempotencyKey], confirm: bool
) -> None:
    client = staff("view_idempotencykey")
    response = act(client, "release_stale", records["stale"], confirm=confirm)
    assert response.status_code == 200 and "Are you sure?" not in response.content.decode()
    records["stale"].refresh_from_db()
    assert records["stale"].status == PROCESSING


def test_the_confirmation_s_post_needs_its_csrf_token(
    records: dict[str, IdempotencyKey],
) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", None))
    forged = act(client, "release_stale", records["stale"])
    assert forged.status_code == 403
    assert IdempotencyKey.objects.filter(pk=records["stale"].pk).exists()


@pytest.fixture
def admin_client() -> Client:
    """A superuser (pytest-django's own fixture hashes a password: slow)."""
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", None))
    return client


@pytest.fixture
def records() -> dict[str, IdempotencyKey]:
    past = timezone.now() - timedelta(minutes=5)
    return {
        "completed": IdempotencyKeyFactory(completed=True, key="key-completed", scope="user:1"),
        "live": IdempotencyKeyFactory(key="key-live", method="PATCH", path="/orders/7/"),
        "stale": IdempotencyKeyFactory(key="key-stale", stale=True, scope="tenant:acme"),
        "expired": IdempotencyKeyFactory(completed=True, expires_at=past, key="key-expired"),
        "expired_locked": IdempotencyKeyFactory(expires_at=past, key="key-expired-locked"),
    }


def pks(records: dict[str, IdempotencyKey], *names: str) -> set[int]:
    return {records[name].pk for name in names}


def test_changelist_shows_the_columns(admin_client: Client, records: Any) -> None:
    response = admin_client.get(CHANGELIST)

    assert response.status_code == 200
    content = response.content.decode()
    columns = re.findall(r'<th scope="col" class="[^"]*column-(\w+)', content)
    assert columns == ["short_key", "state", "scope", "request", "response", "created", "expires"]
    assert f'/change/">{records["completed"].key_hash[:8]}</a>' in content
    assert 'id="changelist-search"' in content


def test_changelist_title_is_not_select_to_change(admin_client: Client, records: Any) -> None:
    content = admin_client.get(CHANGELIST).content.decode()

    assert "<title>Idempotency keys | " in content
    assert "<h1>Idempotency keys</h1>" in content
    assert "to change" not in content


def _row(content: str, record: IdempotencyKey) -> str:
    start = content.index(f'value="{record.pk}"')
    return content[start : content.index("</tr>", start)]


def test_changelist_flags_stale_as_a_warning_and_times_to_the_second(
    admin_client: Client, records: dict[str, IdempotencyKey]
) -> None:
    content = admin_client.get(CHANGELIST).content.decode()

    stale = _row(content, records["stale"])
    assert "processing<br>" in stale
    assert "icon-alert.svg" in stale and "stale" in stale
    assert "icon-yes.svg" not in content and "icon-no.svg" not in content  # no boolean ticks
    assert "<em>expired</em>" in _row(content, records["expired"])
    completed = _row(content, records["completed"])
    assert "stale" not in completed and "expired" not in completed
    created = timezone.localtime(records["completed"].created_at)
    assert created.strftime("%Y-%m-%d %H:%M:%S") in completed


def test_change_page_flags_stale_as_a_warning(
    admin_client: Client, records: dict[str, IdempotencyKey]
) -> None:
    content = admin_client.get(change_url(records["stale"])).content.decode()

    assert "icon-alert.svg" in content
    assert "icon-yes.svg" not in content
    unlock = timezone.localtime(records["stale"].unlock_at)
    assert unlock.strftime("%Y-%m-%d %H:%M:%S") in content


def methods_listed(client: Client, query: str = "") -> list[str]:
    response = client.get(CHANGELIST + query)
    [spec] = [spec for spec in response.context["cl"].filter_specs if spec.title == "method"]
    return [value for value, _label in spec.lookup_choices]


def test_method_filter_lists_the_protected_methods(
    admin_client: Client, records: dict[str, IdempotencyKey]
) -> None:
    assert methods_listed(admin_client) == ["CALL", "PATCH", "POST"]  # CALL: function calls
    with override_settings(IDEMPOTENCY={"METHODS": ["POST", "PUT"]}):
        assert methods_listed(admin_client) == ["CALL", "POST", "PUT"]
    # A method only a view's own option protects: filtered by URL, and listed while selected.
    assert methods_listed(admin_client, "?method=delete") == ["CALL", "DELETE", "PATCH", "POST"]
    assert listed(admin_client, "?method=delete") == set()


def test_changelist_shows_the_tables_health(
    admin_client: Client, records: dict[str, IdempotencyKey], monkeypatch: pytest.MonkeyPatch
) -> None:
    content = admin_client.get(CHANGELIST).content.decode()
    summary = content[content.index('id="idempotency-stats"') : content.index("</dl>")]
    text = " ".join(re.sub(r"<[^>]+>", " ", summary).split())

    assert "Records 5: processing 3 , completed 2 , failed 0" in text
    assert "Expired, to clean up 1" in text  # expired_locked's lock is live: not deletable
    assert "Stale processing 1 (oldest claimed 0s ago, stale for" in text
    assert "Size table " in text
    assert 'href="?stale=yes"' in summary
    assert 'class="warning"' not in content

    monkeypatch.setattr(maintenance, "CLEANUP_ROWS_PER_MINUTE", 0)
    content = admin_client.get(CHANGELIST).content.decode()
    assert '<li class="warning">1 expired records are more than one' in content


def test_filters(admin_client: Client, records: dict[str, IdempotencyKey]) -> None:
    assert listed(admin_client, "?status__exact=completed") == pks(records, "completed", "expired")
    assert listed(admin_client, "?method=PATCH") == pks(records, "live")
    assert listed(admin_client, "?stale=yes") == pks(records, "stale")
    assert listed(admin_client, "?stale=no") == pks(
        records, "completed", "live", "expired", "expired_locked"
    )
    assert listed(admin_client, "?expired=yes") == pks(records, "expired", "expired_locked")
    assert listed(admin_client, "?expired=no") == pks(records, "completed", "live", "stale")
    today = timezone.now()
    assert (
        len(listed(admin_client, f"?created_at__year={today.year}&created_at__month={today.month}"))
        == 5
    )


@pytest.mark.parametrize(
    ("term", "expected"),
    [
        ("key-live", {"live"}),  # the raw key, hashed before the lookup
        ('"key-live"', {"live"}),  # the Structured Field string spelling of the same key
        ("  key-stale ", {"stale"}),
        ("tenant:acme", {"stale"}),  # exact scope
        ("/orders/", {"live"}),  # part of the path
        ("no-such-key", set()),
    ],
)
def test_search(
    admin_client: Client, records: dict[str, IdempotencyKey], term: str, expected: set[str]
) -> None:
    assert listed(admin_client, "?" + _query(q=term)) == pks(records, *expected)


def test_search_by_key_hash_and_its_prefix(
    admin_client: Client, records: dict[str, IdempotencyKey]
) -> None:
    key_hash = records["expired"].key_hash
    assert listed(admin_client, "?" + _query(q=key_hash)) == pks(records, "expired")
    assert listed(admin_client, "?" + _query(q=key_hash[:12])) == pks(records, "expired")


def _query(**params: str) -> str:
    from urllib.parse import urlencode

    return urlencode(params)


def test_change_page_pretty_prints_a_json_body(admin_client: Client) -> None:
    record = IdempotencyKeyFactory(
        completed=True,
        response_body=json.dumps({"id": 1, "items": [1, 2]}).encode(),
        response_headers=[["Content-Type", "application/json"], ["Location", "/things/1"]],
    )

    response = admin_client.get(change_url(record))

    assert response.status_code == 200
    content = response.content.decode()
    assert "<pre>{\n  &quot;id&quot;: 1,\n  &quot;items&quot;: [\n    1," in content
    assert "Location: /things/1" in content
    assert 'name="_save"' not in content  # read-only: nothing to save


def test_change_page_shows_a_json_body_nested_past_the_parsers_depth_as_text(
    admin_client: Client,
) -> None:
    """``json.loads`` raises ``RecursionError`` on a body nested past its depth: the page was a
    ``500`` (issue 48). 100,000 deep: Python 3.12+ parses (and 3.13 indents) 5,000 in C."""
    record = IdempotencyKeyFactory(
        completed=True,
        response_body=b"[" * 100_000 + b"]" * 100_000,
        response_headers=[["Content-Type", "application/json"]],
    )

    response = admin_client.get(change_url(record))

    assert response.status_code == 200
    assert "<pre>[[[[" in response.content.decode()


def test_change_page_describes_a_binary_body(admin_client: Client) -> None:
    record = IdempotencyKeyFactory(
        completed=True,
        response_body=b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4,
        response_headers=[["Content-Type", "image/png"]],
    )

    content = admin_client.get(change_url(record)).content.decode()

    assert "1,032 bytes of binary data (image/png)." in content
    assert "PNG" not in content.split("1,032 bytes")[0].rsplit("<pre>", 1)[-1]


def test_change_page_truncates_a_long_body(admin_client: Client) -> None:
    record = IdempotencyKeyFactory(
        completed=True,
        response_body=b"x" * 50_000,
        response_headers=[["Content-Type", "text/plain"]],
    )

    content = admin_client.get(change_url(record)).content.decode()

    assert "truncated (50,000 bytes in all)" in content
    assert "x" * 10_001 not in content


def test_a_functions_stored_result_is_shown_as_a_result(admin_client: Client) -> None:
    """It has no response status (issue 40): the list says *result*, the page shows it."""

    @idempotent_function(key="message_id", name="tests.admin.handle")
    def handle(message_id: str) -> dict[str, int]:
        return {"id": 7}

    handle("message-1")
    record = IdempotencyKey.objects.get()

    row = admin_client.get(CHANGELIST).content.decode()
    assert re.search(r'class="field-response">result</td>', row), row
    page = admin_client.get(change_url(record)).content.decode()
    assert "&quot;id&quot;: 7" in page


def test_change_page_of_a_record_without_a_response(admin_client: Client) -> None:
    record = IdempotencyKeyFactory()

    assert admin_client.get(change_url(record)).status_code == 200


def test_no_add_no_edit_no_delete_even_for_a_superuser(
    admin_client: Client, records: dict[str, IdempotencyKey]
) -> None:
    record = records["completed"]
    assert admin_client.get(CHANGELIST + "add/").status_code == 403
    response = admin_client.post(change_url(record), {"status": "failed", "scope": "evil"})
    assert response.status_code == 403
    assert admin_client.get(f"{CHANGELIST}{record.pk}/delete/").status_code == 403
    record.refresh_from_db()
    assert record.scope == "user:1"
    actions = admin_client.get(CHANGELIST).context["action_form"].fields["action"].choices
    names = {name for name, _label in actions}
    assert names == {"", "release_stale", "mark_failed", "delete_expired"}


def test_staff_without_permissions_gets_no_access(records: dict[str, IdempotencyKey]) -> None:
    client = staff()

    assert client.get(CHANGELIST).status_code == 403
    assert client.get(change_url(records["completed"])).status_code == 403
    assert act(client, "release_stale", records["stale"]).status_code == 403
    assert IdempotencyKey.objects.filter(pk=records["stale"].pk).exists()


def test_view_permission_reads_but_runs_no_action(records: dict[str, IdempotencyKey]) -> None:
    client = staff("view_idempotencykey")

    assert client.get(CHANGELIST).status_code == 200
    assert client.get(change_url(records["completed"])).status_code == 200
    response = act(client, "release_stale", records["stale"])
    assert IdempotencyKey.objects.filter(pk=records["stale"].pk).exists()
    assert response.status_code == 200
    assert client.get(CHANGELIST).context["action_form"] is None


def test_change_permission_runs_release_and_fail(records: dict[str, IdempotencyKey]) -> None:
    client = staff("view_idempotencykey", "change_idempotencykey")
    stale = records["stale"]

    response = act(client, "mark_failed", stale)

    assert response.status_code == 200
    stale.refresh_from_db()
    assert stale.status == IdempotencyKey.Status.FAILED


def test_release_stale_action(admin_client: Client, records: dict[str, IdempotencyKey]) -> None:
    response = act(admin_client, "release_stale", records["stale"], records["live"])

    assert "Released 1 of 2 selected records; 1 were not stale" in response.content.decode()
    assert not IdempotencyKey.objects.filter(pk=records["stale"].pk).exists()
    live = IdempotencyKey.objects.get(pk=records["live"].pk)
    assert live.status == PROCESSING


def test_mark_failed_action(admin_client: Client, records: dict[str, IdempotencyKey]) -> None:
    response = act(admin_client, "mark_failed", records["stale"], records["completed"])

    assert "Marked as failed 1 of 2 selected records" in response.content.decode()
    stale = IdempotencyKey.objects.get(pk=records["stale"].pk)
    assert stale.status == IdempotencyKey.Status.FAILED
    assert stale.response_status == 500
    body = json.loads(bytes(stale.response_body or b""))
    assert body["type"].endswith("#request-abandoned")
    completed = IdempotencyKey.objects.get(pk=records["completed"].pk)
    assert completed.response_status == 201


def test_delete_expired_action(admin_client: Client, records: dict[str, IdempotencyKey]) -> None:
    response = act(admin_client, "delete_expired", *records.values())

    assert "Deleted 1 of 5 selected records" in response.content.decode()
    assert set(IdempotencyKey.objects.values_list("pk", flat=True)) == pks(
        records, "completed", "live", "stale", "expired_locked"
    )


def test_delete_expired_needs_the_delete_permission(records: dict[str, IdempotencyKey]) -> None:
    client = staff("view_idempotencykey", "change_idempotencykey")

    act(client, "delete_expired", records["expired"])

    assert IdempotencyKey.objects.filter(pk=records["expired"].pk).exists()
    client = Client()
    user = User.objects.get(username="staff")
    user.user_permissions.add(Permission.objects.get(codename="delete_idempotencykey"))
    client.force_login(user)
    act(client, "delete_expired", records["expired"])
    assert not IdempotencyKey.objects.filter(pk=records["expired"].pk).exists()


def test_table_health_can_be_turned_off(
    admin_client: Client, records: dict[str, IdempotencyKey], monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_idempotency import IdempotencyKeyAdmin

    monkeypatch.setattr(IdempotencyKeyAdmin, "show_table_health", False)

    content = admin_client.get(CHANGELIST).content.decode()
    assert 'id="idempotency-stats"' not in content
    assert 'id="result_list"' in content


def test_table_health_groups_thousands(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The rendering is the point here, not the counting (tests/test_stats.py counts).
    big = maintenance.Stats(
        by_status={"processing": 1, "completed": 1_234_567, "failed": 0},
        expired=1_000_000,
        stale=0,
        oldest_stale_age=None,
        longest_stale_for=None,
        table_bytes=300 * 2**20,
        index_bytes=None,
        size_source="test",
    )
    monkeypatch.setattr(maintenance, "stats", lambda alias: big)

    content = admin_client.get(CHANGELIST).content.decode()

    assert "1,234,568:" in content and "completed 1,234,567" in content
    assert '<a href="?expired=yes">1,000,000</a>' in content
    assert "table 300.0 MiB (test)" in content


# A time zone the database must convert to (issue 26): MariaDB/MySQL without time-zone tables
# (CI's has none) cannot, and the date hierarchy's CONVERT_TZ answered NULL: a 500.
BERLIN = override_settings(TIME_ZONE="Europe/Berlin")


def database_converts_to_berlin() -> bool:
    """Asked of the database directly: MySQL/MariaDB only with its time-zone tables."""
    if connection.vendor != "mysql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT CONVERT_TZ('2000-06-15 12:00:00', 'UTC', 'Europe/Berlin')")
        return cursor.fetchone()[0] is not None


@BERLIN
@pytest.mark.parametrize(
    "query",
    ["", "?stale=yes", "?expired=yes", "?stale=no&expired=no", "?created_at__year={year}"],
)
def test_changelist_in_a_time_zone_the_database_may_not_know(
    admin_client: Client, records: dict[str, IdempotencyKey], query: str
) -> None:
    response = admin_client.get(CHANGELIST + query.format(year=timezone.localdate().year))
    assert response.status_code == 200
    assert response.context["cl"].result_list
    # The date hierarchy where the database can group by Berlin's dates; else left out.
    hierarchy = "created_at" if database_converts_to_berlin() else None
    assert response.context["cl"].date_hierarchy == hierarchy
    assert ('class="toplinks"' in response.content.decode()) == (hierarchy is not None)


def test_changelist_in_utc_keeps_its_date_hierarchy(admin_client: Client, records: Any) -> None:
    response = admin_client.get(CHANGELIST)
    assert response.context["cl"].date_hierarchy == "created_at"
    assert 'class="toplinks"' in response.content.decode()


def test_an_owner_still_running_is_fenced_after_the_action(admin_client: Client) -> None:
    """The store contract's ``release_stale`` and ``fail_stale`` on the table, as on a Redis
    store (``tests/test_admin_redis.py``): an owner whose lock lapsed but who still runs has
    its result write refused after either action; an owner whose lock is live is left alone."""
    from django_idempotency._base.keys import hash_key
    from django_idempotency._call.identity import Identity
    from django_idempotency._store import StoredResponse, using

    store: Any = using("default")

    def owner(key: str, lock: timedelta) -> Any:
        identity = Identity(
            key=key, scope="s", key_hash=hash_key(key), fingerprint="f", method="POST", path="/"
        )
        return store.claim(identity, ttl=timedelta(hours=1), lock_timeout=lock)

    released, failed = owner("k1", timedelta(0)), owner("k2", timedelta(0))
    live = owner("k3", timedelta(seconds=30))
    row = {n: IdempotencyKey.objects.get(key_hash=hash_key(f"k{n}")) for n in (1, 2, 3)}
    act(admin_client, "release_stale", row[1], row[3])
    act(admin_client, "mark_failed", row[2], row[3])
    stored = StoredResponse(status=201, headers=[], body=b"{}")
    writes = [
        store.store_response(claim.pk, claim.token_text, stored)
        for claim in (released, failed, live)
    ]
    assert writes == [False, False, True]
    assert not IdempotencyKey.objects.filter(pk=row[1].pk).exists()
    assert IdempotencyKey.objects.get(pk=row[2].pk).response_status == 500
    assert IdempotencyKey.objects.get(pk=row[3].pk).response_status == 201
