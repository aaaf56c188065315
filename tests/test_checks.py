from __future__ import annotations

import re
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection
from django.test import override_settings

from django_idempotency._base import durations
from django_idempotency._ops.checks import (
    check_database,
    check_database_server,
    check_settings,
    eviction_warnings,
)
from django_idempotency._store import galera, using


def ids(config: Any) -> list[str]:
    with override_settings(IDEMPOTENCY=config):
        return [message.id for message in check_settings()]  # type: ignore[misc]


def test_defaults_pass() -> None:
    assert ids({}) == []
    assert check_database() == []


@pytest.mark.parametrize(
    "config",
    [
        {"KEY_FORMAT": "any"},
        {"KEY_FORMAT": "uuid"},
        {"KEY_FORMAT": re.compile(r"[a-z]{8,}")},
        {"SCOPE_FUNCTION": lambda request, *rest: "s"},
        {"FINGERPRINT_FUNCTION": "django_idempotency.request_fingerprint"},
        {"BARE_KEYS": False},
        {"BARE_KEYS": True},
    ],
)
def test_good_values_pass(config: Any) -> None:
    assert ids(config) == []


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ([("TTL", 1)], "E001"),
        ({"ENABLED": "yes"}, "E002"),
        ({"REQUIRED": 1}, "E002"),
        ({"HEARTBEAT": "yes"}, "E002"),
        ({"HEADER": ""}, "E003"),
        ({"HEADER": "Idempotency Key"}, "E003"),
        ({"HEADER": "Authorization"}, "E027"),
        ({"HEADER": "cookie"}, "E027"),
        ({"HEADER": "Proxy-Authorization"}, "E027"),
        ({"HEADER": "X-CSRFToken"}, "E027"),
        ({"HEADER": "X-API-Key"}, "E027"),
        ({"METHODS": "POST"}, "E004"),
        ({"METHODS": []}, "E004"),
        ({"METHODS": ["POST", "GET"]}, "E020"),
        ({"TTL": 0}, "E005"),
        ({"TTL": "1 day"}, "E005"),
        ({"LOCK_TIMEOUT": -1}, "E006"),
        ({"WAIT_TIMEOUT": timedelta(0)}, "E007"),
        ({"TTL": 10, "LOCK_TIMEOUT": 60}, "E008"),
        ({"IN_PROGRESS": "queue"}, "E009"),
        ({"RETRY_AFTER": 0}, "E010"),
        ({"RETRYABLE_STATUSES": [500, 700]}, "E011"),
        ({"RETRYABLE_STATUSES": "500"}, "E011"),
        ({"MISMATCH_STATUS": 409}, "E012"),
        ({"MIN_KEY_LENGTH": 0}, "E013"),
        ({"MIN_KEY_LENGTH": 256}, "E013"),
        ({"REPLAYED_HEADERS": "Location"}, "E014"),
        ({"REPLAYED_HEADERS": ["Location", "Set-Cookie"]}, "E021"),
        ({"SCOPE_FUNCTION": "nowhere.scope"}, "E015"),
        ({"SCOPE_FUNCTION": 42}, "E015"),
        ({"FINGERPRINT_FUNCTION": "django_idempotency.nope"}, "E016"),
        ({"SCOPE_FUNCTION": lambda: "x"}, "E024"),
        ({"SCOPE_FUNCTION": "tests.testapp.policy_views.method_scope"}, "E024"),
        ({"FINGERPRINT_FUNCTION": "django_idempotency.user_scope"}, "E025"),
        ({"KEY_FORMAT": "uuid4"}, "E023"),
        ({"KEY_FORMAT": "^[0-9]+$"}, "E023"),
        ({"KEY_FORMAT": None}, "E023"),
        ({"KEY_FORMAT": re.compile(b"[0-9]+")}, "E023"),
        ({"BARE_KEYS": "no"}, "E002"),
        ({"BARE_KEYS": 0}, "E002"),
        ({"BARE_KEYS": None}, "E002"),
        ({"MAX_BODY_SIZE": 0}, "E017"),
        ({"PROBLEM_TYPE_BASE": ""}, "E022"),
        ({"PROBLEM_TYPE_BASE": "/docs/problems#"}, "E022"),
        ({"PROBLEM_TYPE_BASE": "https:///problems#"}, "E022"),
        ({"PROBLEM_TYPE_BASE": "https://api.example.com/my problems#"}, "E022"),
        ({"PROBLEM_TYPE_BASE": 42}, "E022"),
        ({"TYPO": 1}, "W001"),
    ],
)
def test_each_mistake_has_its_id(config: Any, expected: str) -> None:
    assert ids(config) == [f"django_idempotency.{expected}"]


@pytest.mark.parametrize(
    "base",
    ["https://api.example.com/docs/errors#", "urn:example:problems:", "tag:example.com,2026:"],
)
def test_problem_type_base_takes_any_absolute_uri(base: str) -> None:
    assert ids({"PROBLEM_TYPE_BASE": base}) == []


def test_a_credential_header_is_no_key_header() -> None:
    """As ``HEADER``, ``Authorization`` made the credential the key, and its unsalted SHA-256
    was shown to the admin's staff (issue 48)."""
    with override_settings(IDEMPOTENCY={"HEADER": "Authorization"}):
        (error,) = check_settings()
    assert "carries a credential" in error.msg
    assert "Idempotency-Key" in (error.hint or "")
    assert ids({"HEADER": "X-Request-Key"}) == []


def test_problem_type_base_hint() -> None:
    with override_settings(IDEMPOTENCY={"PROBLEM_TYPE_BASE": "problems#"}):
        (error,) = check_settings()
    assert "'problems#'" in error.msg
    assert "https://api.example.com/docs/errors#" in (error.hint or "")


def test_durations_accept_numbers_and_timedeltas() -> None:
    assert ids({"TTL": timedelta(days=2), "LOCK_TIMEOUT": 30.5, "WAIT_TIMEOUT": 3}) == []


def test_database_alias_must_exist() -> None:
    with override_settings(IDEMPOTENCY={"DATABASE_ALIAS": "missing"}):
        assert [m.id for m in check_database()] == ["django_idempotency.E018"]


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_atomic_requests_on_the_claim_alias_is_an_error() -> None:
    databases = {**settings.DATABASES, "default": {**settings.DATABASES["default"]}}
    databases["default"]["ATOMIC_REQUESTS"] = True
    with override_settings(DATABASES=databases):
        (message,) = check_database()
        assert message.id == "django_idempotency.E019"
        assert "second alias" in (message.hint or "")
        with override_settings(IDEMPOTENCY={"DATABASE_ALIAS": "unreachable"}):
            # A second alias to the same database: enough on a server; SQLite's one file has
            # one write lock, which the request's transaction holds (E032).
            expected = ["django_idempotency.E032"] if connection.vendor == "sqlite" else []
            assert [message.id for message in check_database()] == expected


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
@pytest.mark.parametrize(
    "engine",
    [
        "django.db.backends.oracle",  # its driver is not even installed
        "django.db.backends.dummy",  # stands for a third-party backend, vendor "dummy"
    ],
)
def test_an_unsupported_backend_is_an_error(engine: str) -> None:
    databases = {**settings.DATABASES, "default": {**settings.DATABASES["default"]}}
    databases["default"]["ENGINE"] = engine
    with override_settings(DATABASES=databases):
        (message,) = check_database()
    assert message.id == "django_idempotency.E030"
    assert engine in message.msg
    assert "PostgreSQL, MySQL/MariaDB, SQLite" in (message.hint or "")


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
@pytest.mark.parametrize(
    ("isolation", "expected"),
    [
        (None, []),
        ("read committed", []),
        ("repeatable read", ["django_idempotency.E031"]),
        ("serializable", ["django_idempotency.E031"]),
    ],
)
def test_mysql_needs_read_committed(isolation: str | None, expected: list[str]) -> None:
    databases = {**settings.DATABASES, "default": {**settings.DATABASES["default"]}}
    databases["default"]["ENGINE"] = "django.db.backends.mysql"
    databases["default"]["OPTIONS"] = {"isolation_level": isolation} if isolation else {}
    with override_settings(DATABASES=databases):
        assert [m.id for m in check_database()] == expected


# Django 6.1's run_checks() hands every check all database aliases, so model checks (JSONField's
# support check) open a connection even when no database check is asked for.
@pytest.mark.django_db(databases="__all__")
def test_checks_are_registered() -> None:
    with (
        override_settings(IDEMPOTENCY={"TTL": 0}),
        pytest.raises(SystemCheckError, match=r"django_idempotency\.E005"),
    ):
        call_command("check")


@pytest.mark.django_db
def test_check_is_clean_on_this_database() -> None:
    """No warning on any supported backend: MariaDB warned of the partial index (models.W037)."""
    out = StringIO()
    call_command("check", databases=["default"], stdout=out, stderr=out)
    assert out.getvalue().strip() == "System check identified no issues (0 silenced)."


@pytest.mark.django_db
@pytest.mark.parametrize("zone", ["Europe/Berlin", "UTC"])
def test_w002_says_the_admin_has_no_date_hierarchy_without_time_zone_tables(zone: str) -> None:
    """Asked only with ``databases`` (``check --database``, ``migrate``): it queries. Warns
    where the database cannot convert to TIME_ZONE: MySQL/MariaDB without time-zone tables, as
    CI's MariaDB (issue 26)."""
    from tests.test_admin import database_converts_to_berlin

    with override_settings(TIME_ZONE=zone):
        assert check_database() == []
        messages = check_database_server(databases=["default"])
    if zone == "UTC" or database_converts_to_berlin():
        assert messages == []
        return
    (warning,) = messages
    assert warning.id == "django_idempotency.W002"
    assert "cannot convert dates to TIME_ZONE 'Europe/Berlin'" in warning.msg
    assert "date hierarchy" in warning.msg
    assert "mariadb-tzinfo-to-sql" in (warning.hint or "")


# --- W003: Galera's eviction stall against the lock timeouts (issue 38) -------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("PT5S", 5),
        ("PT0.5S", 0.5),
        ("PT1M30S", 90),
        ("pt2m", 120),
        ("P1DT2H", 93_600),
        ("P1W", 604_800),
        (" PT15S ", 15),
        ("7", 7),
        ("2.5", 2.5),
    ],
)
def test_iso8601_durations_as_galera_writes_them(text: str, seconds: float) -> None:
    assert durations.iso8601(text, "evs.suspect_timeout") == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "P", "PT", "P1Y", "P1M", "PT5", "5S", "PT-5S", "PTxS", "nan"])
def test_what_is_no_iso8601_duration_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"evs\.suspect_timeout"):
        durations.iso8601(text, "evs.suspect_timeout")


def test_provider_options_are_read_as_the_server_lists_them() -> None:
    listed = (
        "base_dir = /var/lib/mysql/; base_host = 127.0.0.1; evs.inactive_timeout = PT15S; "
        "evs.suspect_timeout = PT5S; gcache.size = 128M; gmcast.listen_addr = tcp://0.0.0.0:4567"
    )
    options = galera.provider_options(listed)
    assert options["evs.suspect_timeout"] == "PT5S"
    assert options["gmcast.listen_addr"] == "tcp://0.0.0.0:4567"
    assert galera.provider_options("") == {}


def test_a_lock_must_outlast_the_stall_by_its_renewed_two_thirds() -> None:
    stall = timedelta(seconds=5)
    assert galera.least_lock_timeout(stall) == timedelta(seconds=7.5)
    assert not galera.outlasts(timedelta(seconds=7.5), stall)
    assert galera.outlasts(timedelta(seconds=7.6), stall)


@pytest.mark.django_db
def test_w003_names_each_lock_timeout_the_stall_outlasts() -> None:
    """The setting and the two-phase views (and ninja operations) of the URLconf with a lock of
    their own; the atomic view with one is not concerned."""
    stall = timedelta(seconds=5)
    names = {warning.msg.split(" is ", 1)[0] for warning in eviction_warnings(stall)}
    assert names == {
        "tests.testapp.views.short_lock: lock_timeout",
        "tests.testapp.ninja_api.short_lock: lock_timeout",
    }
    with override_settings(IDEMPOTENCY={"LOCK_TIMEOUT": 7.5}):
        (setting, *_) = eviction_warnings(stall)
    assert setting.id == "django_idempotency.W003"
    assert setting.msg.startswith("IDEMPOTENCY['LOCK_TIMEOUT'] is 0:00:07.500000, and on this")
    assert "evs.suspect_timeout (0:00:05)" in setting.msg
    assert "longer than 0:00:07.500000" in (setting.hint or "")
    with override_settings(IDEMPOTENCY={"LOCK_TIMEOUT": 8}):
        assert len(eviction_warnings(stall)) == 2
    assert eviction_warnings(timedelta(seconds=0.5)) == []


@pytest.mark.django_db
def test_w003_is_silent_on_a_server_that_is_no_galera_node() -> None:
    """On this suite's database (SQLite, PostgreSQL, and MariaDB in CI's MariaDB legs, where
    ``wsrep_on`` is OFF): no stall to read, no warning, even for a one-second lock."""
    assert using("default").eviction_stall() is None
    with override_settings(IDEMPOTENCY={"LOCK_TIMEOUT": 1, "TTL": 60}):
        messages = check_database_server(databases=["default"])
    assert [m for m in messages if m.id == "django_idempotency.W003"] == []
    if connection.vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute("SHOW VARIABLES LIKE 'wsrep_on'")
            assert cursor.fetchone() in (None, ("wsrep_on", "OFF"))


@pytest.mark.urls("tests.operations_urls")
def test_e061_leaves_an_accepted_view_on_redis_alone() -> None:
    """``in_progress="accepted"`` was refused on a Redis store (E061, its hint "Use
    in_progress=..."): operations work on every store, so only atomic mode is refused."""
    from django.test import override_settings

    from django_idempotency._ops import store_checks

    with override_settings(IDEMPOTENCY={"STORE": "redis://127.0.0.1:1/0"}):
        errors = store_checks.check_stores()
    routed = [name for name, options in store_checks._views() if not options.atomic]
    assert routed  # the accepted views
    # E061 names every atomic view decorated so far, routed or not: none of these.
    refused = [error.msg for error in errors if error.id == "django_idempotency.E061"]
    assert not [msg for msg in refused if msg.partition(":")[0] in routed]
    assert all("atomic=True needs the database store" in msg for msg in refused)
