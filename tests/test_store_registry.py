"""The store registry (:mod:`django_idempotency._conf.stores`): a store is its module and one
line. The toy store of ``tests/toy_store.py`` (the contract and nothing more), registered by one
line for the ``toy://`` scheme, serves ``STORE`` end to end: a keyed request and its replay,
the settings' validation, and the operators' commands, which run or refuse it in words."""

from __future__ import annotations

import json
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.http import HttpRequest, JsonResponse
from django.test import RequestFactory, override_settings

from django_idempotency import _store, idempotent
from django_idempotency._conf import stores
from django_idempotency._conf.settings import check_name
from django_idempotency._conf.values import store as store_value
from django_idempotency._store import using
from tests.toy_store import ToyStore

pytestmark = pytest.mark.django_db(transaction=True)

TOY = "toy://memory"


@pytest.fixture
def toy() -> Iterator[str]:
    """``toy://`` registered: the one line a new store costs."""
    stores.STORES["toy://"] = "tests.toy_store.ToyStore"
    try:
        with override_settings(IDEMPOTENCY={"STORE": TOY}):
            yield TOY
    finally:
        del stores.STORES["toy://"]
        _store._BOUND.pop(TOY, None)


def test_each_form_of_a_store_s_name_finds_its_class() -> None:
    from django_idempotency._store.redis import RedisStore
    from django_idempotency._store.vendors import Databases

    assert stores.kind_of("default") is Databases
    for url in ("redis://h/0", "rediss://h/0", "unix:///s", "redis+sentinel://h/m"):
        assert stores.kind_of(url) is RedisStore
    assert stores.kind_of("rediss+cluster://h:1,h:2") is RedisStore
    assert stores.kind_of("toy://memory") is None  # not registered
    assert stores.form("cache:missing") is None
    with override_settings(CACHES={"r": {"BACKEND": "django_redis.cache.RedisCache"}}):
        assert stores.kind_of("cache:r") is RedisStore


@pytest.mark.parametrize(
    ("url", "said"),
    [
        (TOY, "no registered store serves the scheme 'toy://'"),
        ("database://default", "no registered store serves the scheme 'database://'"),
        ("redis:/host/0", "is not 'database', an alias of CACHES or a URL"),
    ],
)
def test_a_url_no_store_serves_is_refused_at_startup(url: str, said: str) -> None:
    """A URL's form is its scheme with ``://``: ``database://`` is no URL of the database."""
    with pytest.raises(ValueError, match=said):
        store_value(url, "STORE")


def test_a_name_no_store_serves_is_unavailable_at_runtime() -> None:
    from django_idempotency._base.errors import StoreUnavailable

    with pytest.raises(StoreUnavailable, match="No store serves 'toy://memory'"):
        using(TOY)


def test_a_registered_store_serves_a_keyed_request_and_its_replay(toy: str) -> None:
    assert store_value(toy, "STORE") == toy  # the settings' test asks the registry
    assert isinstance(using(toy), ToyStore)
    runs = []

    @idempotent
    def view(request: HttpRequest) -> JsonResponse:
        runs.append(1)
        return JsonResponse({"order": len(runs)}, status=201)

    factory = RequestFactory()
    first = view(factory.post("/o/", b"{}", "application/json", headers={"Idempotency-Key": "t1"}))
    again = view(factory.post("/o/", b"{}", "application/json", headers={"Idempotency-Key": "t1"}))
    other = view(factory.post("/o/", b"{}", "application/json", headers={"Idempotency-Key": "t2"}))
    assert (first.status_code, again.status_code, other.status_code) == (201, 201, 201)
    assert json.loads(again.content) == {"order": 1} and again["Idempotent-Replayed"] == "true"
    assert json.loads(other.content) == {"order": 2} and len(runs) == 2
    assert using(toy).count() == 2  # in the toy's memory, not the table
    from django_idempotency.models import IdempotencyKey

    assert not IdempotencyKey.objects.exists()


def test_the_relay_refuses_a_store_without_an_outbox_by_its_own_name(toy: str) -> None:
    with pytest.raises(CommandError) as refused:
        call_command("idempotency_relay", "--once", stdout=StringIO(), stderr=StringIO())
    assert str(refused.value) == (
        "The Toy store 'toy://memory' has no outbox to relay: the Toy store has no outbox."
    )


def test_stats_count_a_registered_store(toy: str) -> None:
    using(toy)  # made, as a view's first request makes it
    out = StringIO()
    call_command("idempotency_stats", "--json", stdout=out)
    figures: dict[str, Any] = json.loads(out.getvalue())
    census = figures["stores"][TOY]
    assert (census["total"], census["error"]) == (0, None)
    # No outbox: no figure, never a "0 pending" a monitor would read as "nothing waits".
    assert census["outbox_pending"] is census["outbox_failed"] is None
    assert census["outbox_oldest_undelivered_age_seconds"] is None
    assert figures["redis_stores"] == {}  # the Redis stores' alone: no toy named as Redis


def test_stats_text_names_a_registered_store_and_what_its_census_cannot_count(toy: str) -> None:
    """A census's ``None`` (a figure the store cannot give) is *unknown*: the text form
    formatted it as a number, a ``TypeError`` traceback, and called the store a Redis one."""
    using(toy)
    out = StringIO()
    call_command("idempotency_stats", stdout=out)
    lines = out.getvalue().splitlines()
    at = lines.index("Toy store 'toy://memory':")
    assert lines[at + 1 : at + 5] == [
        "  Records:            0",
        "  Stale processing:   unknown",
        "  Outbox undelivered: none (the store has no outbox)",
        "  Operations running: unknown",
    ]
    assert "Redis" not in out.getvalue()


def test_deploy_checks_and_commands_take_a_registered_store_for_no_redis(toy: str) -> None:
    """``check --deploy`` pinged a registered store's client as a Redis one's (E062, "does
    not answer: AttributeError"), and the commands said its records expire by Redis's TTL."""
    from django.core import checks

    found = checks.run_checks(include_deployment_checks=True)
    assert [m for m in found if m.id in (check_name(62), check_name(62, "W"))] == []
    out = StringIO()
    call_command("idempotency_recover", "--dry-run", stdout=out)
    call_command("idempotency_cleanup", stdout=out)
    assert "Toy store 'toy://memory': 0 record(s)." in out.getvalue()
    assert "Redis" not in out.getvalue()


def test_the_admin_says_a_registered_store_that_cannot_list_its_records(toy: str) -> None:
    """The admin links a registered store's list as a Redis store's; a store that does not
    implement ``browse`` (the contract's default refuses) answered ``500`` there."""
    from django.contrib.auth.models import User
    from django.test import Client

    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    page = client.get("/admin/django_idempotency/redisidempotencykey/", follow=True)
    assert page.status_code == 200
    assert "The Toy store &#x27;toy://memory&#x27; does not list its records" in (
        page.content.decode()
    )


def test_an_erasure_refuses_a_named_store_that_cannot_erase_before_erasing_anything(
    toy: str,
) -> None:
    """``idempotency_cleanup --scope`` with a registered store without ``erase_scope`` named:
    a ``CommandError`` in words (it was a ``NotSupportedError`` traceback), nothing erased."""
    from django_idempotency._store.contract import StoreContract
    from tests.factories import IdempotencyKeyFactory

    record = IdempotencyKeyFactory(scope="user:1", completed=True)
    refused = pytest.raises(CommandError, match=r"^The Toy store 'toy://memory' cannot erase a")
    with refused, pytest.MonkeyPatch.context() as patch:
        patch.setattr(ToyStore, "erase_scope", StoreContract.erase_scope)  # a store without it
        call_command("idempotency_cleanup", "--scope", "user:1", stdout=StringIO())
    assert type(record).objects.filter(pk=record.pk).exists()


def test_the_toy_template_erases_a_scope_with_the_database(toy: str) -> None:
    """The template of a third store had no ``erase_scope``: a store copied from it made
    ``idempotency_cleanup --scope`` refuse for the whole project. Its finished records of the
    scope go; the table's of another scope stay."""
    from django_idempotency._store.contract import provides
    from tests.factories import IdempotencyKeyFactory

    assert provides(ToyStore, "erasure")
    record = IdempotencyKeyFactory(scope="user:1", completed=True)

    @idempotent
    def view(request: HttpRequest) -> JsonResponse:
        return JsonResponse({}, status=201)

    factory = RequestFactory()
    for key in ("e1", "e2"):
        view(factory.post("/o/", b"{}", "application/json", headers={"Idempotency-Key": key}))
    store = using(toy)
    assert isinstance(store, ToyStore)
    (scope,) = {scope for scope, _ in store._records}
    out = StringIO()
    call_command("idempotency_cleanup", "--scope", scope, stdout=out)
    assert store.count() == 0 and "Deleted 2 finished" in out.getvalue()
    assert type(record).objects.filter(pk=record.pk).exists()  # another scope: kept


def test_the_check_of_store_refuses_a_scheme_no_store_serves() -> None:
    from django.core import checks

    with override_settings(IDEMPOTENCY={"STORE": "nosuch://host"}):
        errors = [m for m in checks.run_checks() if m.id == check_name(60)]
    assert errors and "'nosuch://host': no registered store serves" in errors[0].msg
    assert "STORES" in errors[0].hint and "CACHES" not in errors[0].hint


def test_the_relay_says_a_cluster_it_cannot_reach_did_not_answer() -> None:
    """The relay asks the store for its outbox first: a cluster's client that cannot be made
    is the store down, said in a line, not a traceback."""
    down = "redis+cluster://127.0.0.1:1"
    with pytest.raises(CommandError, match=r"^The Redis store 'redis\+cluster://127.0.0.1:1' did"):
        call_command("idempotency_relay", "--once", "--store", down, stdout=StringIO())


def test_stats_name_a_registered_store_as_its_class_describes_it(toy: str) -> None:
    """The stats' lines of a store besides the database name it by its class's ``describe()``
    and ``name``: the toy store is no Redis store."""
    using(toy)
    out = StringIO()
    call_command("idempotency_stats", stdout=out)
    text = out.getvalue()
    assert "Toy store 'toy://memory':\n" in text  # no expiry of its own: the class has none
    assert "Redis" not in text and "TTL" not in text


def test_stats_name_a_registered_store_that_does_not_answer_by_its_class(toy: str) -> None:
    store = using(toy)
    assert isinstance(store, ToyStore)
    store.answers = False
    out = StringIO()
    with pytest.raises(CommandError) as refused:
        call_command("idempotency_stats", stdout=out)
    off = "ConnectionError: the toy store is switched off"  # its class and first line
    assert str(refused.value) == f"Toy store 'toy://memory' did not answer: {off}"
    assert f"Toy store 'toy://memory': not reachable ({off})." in out.getvalue()


def test_the_commands_notes_name_a_registered_store_by_its_class(toy: str) -> None:
    from django_idempotency._ops import store_checks

    assert store_checks.store_notes("nothing to delete there") == [
        "Toy store 'toy://memory': 0 record(s)."
    ]
    (note,) = store_checks.admin_notes()
    assert "live in the Toy store 'toy://memory'," in note and "Redis" not in note


def test_deploy_checks_ask_a_registered_store_through_the_contract(toy: str) -> None:
    """E062 asks the contract's ``ping()``: the toy store answers, then is switched off and
    is named by its class; E063 asks ``eviction_policies()``, which has nothing to refuse in
    memory (no W062 "could not read" of a Redis server it never was)."""
    from django_idempotency._ops import store_checks

    assert store_checks.check_stores_deploy() == []
    store = using(toy)
    assert isinstance(store, ToyStore)
    store.answers = False
    (error,) = store_checks.check_stores_deploy()
    assert error.id == check_name(62)
    assert error.msg == (
        "The Toy store 'toy://memory' does not answer: ConnectionError: the toy store is "
        "switched off"
    )


def test_e062_asks_the_database_store_through_the_contract() -> None:
    """The database's store answers ``ping()`` with a query on the thread's connection."""
    from django_idempotency._ops import store_checks

    assert store_checks.e062_unreachable("database") is None
    assert store_checks.described("database") == "database 'default'"


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("redis://:S3cret@127.0.0.1:6379/12?socket_timout=5", "socket_timout"),
        ("redis+cluster://:S3cret@h:1,h:2?read_from_replica=yes", "read_from_replica"),
        ("rediss+sentinel://:S3cret@h:26379/m?sentinel_pasword=x", "sentinel_pasword"),
        ("redis://:S3cret@127.0.0.1:6379/1O", "database number"),
        ("redis://:S3cret@127.0.0.1:6379/-1", "database number"),
        ("redis+sentinel://:S3cret@h:26379", "no master"),
        ("redis+sentinel://:S3cret@h:26379/m/x", "database number"),
        ("redis+cluster://:S3cret@h:1,h:2/3", "database 0 only"),
        ("rediss+cluster://:S3cret@h:1?db=2", "database 0 only"),
    ],
)
def test_a_redis_url_every_request_would_fail_on_is_refused_at_startup(url: str, said: str) -> None:
    """A typo in a URL's option (redis-py's connection refuses a keyword it does not take, or a
    cluster's client drops it), a path that is no database number (read as database 0), a
    Sentinel's URL without its master: each passed the check, and every keyed request answered
    ``503`` (or wrote to database 0). The message names the fault, never the password."""
    from django.core import checks

    with pytest.raises(ValueError, match=said) as refused:
        store_value(url, "STORE")
    assert "S3cret" not in str(refused.value)
    with override_settings(IDEMPOTENCY={"STORE": url}):
        errors = [m for m in checks.run_checks() if m.id == check_name(60)]
    assert errors and said in errors[0].msg and "S3cret" not in errors[0].msg


@pytest.mark.parametrize(
    "url",
    [
        "redis://h/0?socket_timeout=5&health_check_interval=10&client_name=app",
        "rediss://u:p@h:6380/3?ssl_cert_reqs=required&ssl_ca_certs=/ca.pem",
        "unix:///tmp/redis.sock?db=3",
        "redis://h",
        "redis://h/",
        "redis+sentinel://h:26379,g:26379/mymaster/2?sentinel_password=x&socket_timeout=2",
        "rediss+cluster://h:1,h:2?ssl_check_hostname=false&ssl_ca_certs=/ca.pem",
        "redis+cluster://h:1,h:2/0?db=0",
    ],
)
def test_a_redis_url_with_options_redis_py_takes_is_accepted(url: str) -> None:
    assert store_value(url, "STORE") == url


def test_recover_lists_a_registered_store_without_operations_as_having_none_stuck(
    toy: str,
) -> None:
    """``idempotency_recover`` asked the toy store for its stuck operations and printed the
    ``NotSupportedError`` of a store that keeps none as a traceback."""
    using(toy)
    out = StringIO()
    call_command("idempotency_recover", "--operations", "--json", stdout=out)
    assert json.loads(out.getvalue()) == []


def test_key_records_reads_a_registered_store_through_the_contract(toy: str) -> None:
    """``testing.key_records`` answered ``[]`` for a key a registered store holds: the
    contract's ``records_of`` said "none" for every store that did not override it."""
    from django_idempotency.testing import key_records

    @idempotent
    def view(request: HttpRequest) -> JsonResponse:
        return JsonResponse({}, status=201)

    request = RequestFactory().post(
        "/o/", b"{}", "application/json", headers={"Idempotency-Key": "k1"}
    )
    assert view(request).status_code == 201
    records = key_records("k1")
    assert records.count() == 1 and records.get().status == "completed"
    assert not key_records("k2").exists()


def test_the_admin_index_names_a_registered_store_by_its_description(toy: str) -> None:
    """The index listed a registered store's records as "Idempotency keys in Redis"."""
    from django.contrib.auth.models import User
    from django.test import Client

    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    page = client.get("/admin/").content.decode()
    assert "Idempotency keys in the Toy store &#x27;toy://memory&#x27;" in page
    assert "in Redis" not in page


def test_a_store_that_cannot_read_a_key_s_records_says_so(toy: str) -> None:
    from django.db import NotSupportedError

    from django_idempotency.testing import key_records

    refused = pytest.raises(NotSupportedError, match=r"^The Toy store cannot list a key's records")
    with refused, pytest.MonkeyPatch.context() as patch:
        patch.delattr(ToyStore, "records_of")
        key_records("k1")


class _Task:
    """A Celery task as the outbox takes one (``apply_async`` and a ``name``)."""

    name = "shop.tasks.send_receipt"

    def apply_async(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("never sent")


def test_enqueue_on_a_store_without_an_outbox_is_said_before_anything_is_staged(toy: str) -> None:
    """The claim says so before the view's writes (``serves_outbox``), and ``enqueue`` refuses
    as the contract refuses a capability a store has not (``NotSupportedError``), in the
    store's words: it was ``ImproperlyConfigured`` naming a Redis Cluster (whose outbox runs)."""
    from django.db import NotSupportedError

    asked = []

    @idempotent(store=toy)
    def view(request: HttpRequest) -> JsonResponse:
        asked.append(request.idempotency.serves_outbox)
        request.idempotency.enqueue(_Task(), 1)
        return JsonResponse({}, status=201)

    request = RequestFactory().post(
        "/o/", b"{}", "application/json", headers={"Idempotency-Key": "t"}
    )
    with pytest.raises(NotSupportedError) as refused:
        view(request)
    assert asked == [False]
    said = str(refused.value)
    assert said.startswith("enqueue() cannot stage a message on the Toy store 'toy://memory'")
    assert "Cluster" not in said and 'store="database"' in said


def test_a_store_with_an_outbox_serves_it() -> None:
    asked = []

    @idempotent(store="database")
    def view(request: HttpRequest) -> JsonResponse:
        asked.append(request.idempotency.serves_outbox)
        return JsonResponse({}, status=201)

    view(RequestFactory().post("/o/", b"{}", "application/json", headers={"Idempotency-Key": "d"}))
    unkeyed = view(RequestFactory().post("/o/", b"{}", "application/json"))
    assert asked == [True, True] and unkeyed.status_code == 201


def _staff_client() -> Any:
    from django.contrib.auth.models import User
    from django.test import Client

    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


def _toy_urls() -> tuple[str, str]:
    """The toy store's list and action URLs in the admin (its mark: a keyed hash of its name)."""
    from django.urls import reverse

    from django_idempotency._ops import browsing

    (found,) = browsing.browsed()
    name = "admin:django_idempotency_idempotencykey_redis"
    return reverse(name, args=[found.tag]), reverse(f"{name}_action", args=[found.tag])


def test_the_admin_pages_name_a_third_store_by_its_description(toy: str) -> None:
    """The pages of a store besides the database said "Redis store" of the toy store, and
    linked an outbox it does not have."""
    client = _staff_client()
    listed, _ = _toy_urls()
    page = client.get(listed)
    text = page.content.decode()
    assert "Idempotency keys in the Toy store &#x27;toy://memory&#x27;" in text
    assert page.context["outbox_url"] is None and 'id="idempotency-outbox"' not in text
    table = client.get("/admin/django_idempotency/idempotencykey/").content.decode()
    assert "The records in the Toy store &#x27;toy://memory&#x27;" in table
    messages = client.get("/admin/django_idempotency/outboxmessage/").content.decode()
    assert "keeps its messages" not in messages  # it has no outbox: none to link
    assert all("Redis" not in each for each in (text, table, messages))


def test_the_admin_offers_only_the_actions_a_third_store_provides(toy: str) -> None:
    """The actions of a store's list are those its class provides (the contract's
    ``release_stale``, ``fail_stale``); one it lacks is neither offered nor run."""
    from django_idempotency._store.contract import StoreContract

    client = _staff_client()
    listed, action = _toy_urls()
    offered = [name for name, _ in client.get(listed).context["actions"]]
    assert offered == ["release_stale", "mark_failed"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ToyStore, "fail_stale", StoreContract.fail_stale)
        offered = [name for name, _ in client.get(listed).context["actions"]]
        assert offered == ["release_stale"]
        selected = f"{'a' * 64}:anonymous"
        posted = {"action": "mark_failed", "_selected": [selected], "post": "yes"}
        refused = client.post(action, posted, follow=True)
    assert "Select an action and the records to run it on" in refused.content.decode()


def test_atomic_mode_on_a_third_store_is_refused_in_its_own_name(toy: str) -> None:
    """The refusal said "Redis shares no transaction" of the toy store."""
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="the Toy store shares no transaction") as no:

        @idempotent(atomic=True)
        def view(request: HttpRequest) -> JsonResponse:
            return JsonResponse({}, status=201)

    assert "Redis" not in str(no.value)


def test_the_admin_note_says_erasure_is_refused_for_a_store_that_cannot_erase(toy: str) -> None:
    """The note above the table's list said "erasure by scope reaches them" of a store whose
    class has no ``erase_scope``: there erasure is refused for every store."""
    from django_idempotency._ops import store_checks
    from django_idempotency._store.contract import StoreContract

    (note,) = store_checks.admin_notes()
    assert note.endswith("and erasure by scope reaches them.")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ToyStore, "erase_scope", StoreContract.erase_scope)
        (note,) = store_checks.admin_notes()
    assert "erasure by scope is refused while it is named" in note
