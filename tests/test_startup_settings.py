"""Every error ``manage.py check`` reports about the settings stops the app, in the check's words
(issue 48).

gunicorn and uvicorn run no system checks. With ``METHODS: ["GET"]`` or ``"POST"`` (E020,
E004), or ``LOCK_TIMEOUT: 0`` (E006), gunicorn started, and ten concurrent copies of one key ran
the view ten times; a ``LOCK_TIMEOUT`` of 0.1 ms passed ``check`` and ran 6 keys' views 56 times.
``idempotency_relay`` (a command: it runs the checks) refused the same settings, so the web
server and the relay disagreed. One validator (``_conf.settings.usable``: the checks tagged
``SETTINGS_CHECKS``) now serves ``check``, the app's loading, the relay, and every protected
request before its claim.

:data:`REFUSED` holds a value for each error check the declarations and ``_ops/checks.py``
know; :func:`test_every_error_check_is_refused_at_startup_or_kept_before_the_claim` walks
their registry, so a new check without a row here fails.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from django.apps import apps
from django.conf import settings
from django.core.checks import CheckMessage
from django.core.checks.registry import registry
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import Client, override_settings

from django_idempotency import idempotent, idempotent_function
from django_idempotency._conf.settings import SETTINGS, SETTINGS_CHECKS, usable
from django_idempotency._ops import checks, store_checks
from django_idempotency.models import IdempotencyKey
from tests.conftest import executions, problem_slug
from tests.servers import harness


@dataclass(frozen=True)
class Bad:
    """Settings one check refuses: ``IDEMPOTENCY``, other settings, modules not installed."""

    idempotency: Any
    others: dict[str, Any] = field(default_factory=dict)
    missing: tuple[str, ...] = ()


def _databases(**aliases: dict[str, Any]) -> dict[str, Any]:
    return {**settings.DATABASES, **aliases}


_SQLITE_FILE = "/tmp/django-idempotency-startup-settings.sqlite3"
_ATOMIC_SQLITE = {"ENGINE": "django.db.backends.sqlite3", "NAME": _SQLITE_FILE}

#: A value for each error check of the settings (issue 48's own first).
REFUSED: dict[str, Bad] = {
    "E001": Bad([("TTL", 1)]),
    "E002": Bad({"REQUIRED": "yes"}),
    "E003": Bad({"HEADER": ""}),
    "E027": Bad({"HEADER": "Authorization"}),
    "E004": Bad({"METHODS": "POST"}),
    "E020": Bad({"METHODS": ["GET"]}),
    "E005": Bad({"TTL": 0}),
    "E006": Bad({"LOCK_TIMEOUT": -5}),
    "E026": Bad({"LOCK_TIMEOUT": 0.0001}),
    "E007": Bad({"WAIT_TIMEOUT": 0}),
    "E008": Bad({"TTL": 10, "LOCK_TIMEOUT": 60}),
    "E009": Bad({"IN_PROGRESS": "accept"}),
    "E010": Bad({"RETRY_AFTER": "1"}),
    "E011": Bad({"RETRYABLE_STATUSES": [500, 700]}),
    "E012": Bad({"MISMATCH_STATUS": 409}),
    "E013": Bad({"MIN_KEY_LENGTH": 0}),
    "E014": Bad({"REPLAYED_HEADERS": "Location"}),
    "E021": Bad({"REPLAYED_HEADERS": ["Location", "Set-Cookie"]}),
    "E015": Bad({"SCOPE_FUNCTION": "nowhere.scope"}),
    "E024": Bad({"SCOPE_FUNCTION": "tests.testapp.policy_views.method_scope"}),
    "E016": Bad({"FINGERPRINT_FUNCTION": "django_idempotency.nope"}),
    "E025": Bad({"FINGERPRINT_FUNCTION": "django_idempotency.user_scope"}),
    "E017": Bad({"MAX_BODY_SIZE": 0}),
    "E018": Bad({"DATABASE_ALIAS": "nowhere"}),
    "E019": Bad(
        {"DATABASE_ALIAS": "requests"},
        {"DATABASES": _databases(requests={**_ATOMIC_SQLITE, "ATOMIC_REQUESTS": True})},
    ),
    "E022": Bad({"PROBLEM_TYPE_BASE": "/docs/problems#"}),
    "E023": Bad({"KEY_FORMAT": "uuid4"}),
    "E030": Bad(
        {"DATABASE_ALIAS": "other"},
        {"DATABASES": _databases(other={"ENGINE": "django.db.backends.dummy"})},
    ),
    "E031": Bad(
        {"DATABASE_ALIAS": "mysql"},
        {
            "DATABASES": _databases(
                mysql={
                    "ENGINE": "django.db.backends.mysql",
                    "OPTIONS": {"isolation_level": "repeatable read"},
                }
            )
        },
    ),
    "E032": Bad(
        {"DATABASE_ALIAS": "claims"},
        {
            "DATABASES": _databases(
                requests={**_ATOMIC_SQLITE, "ATOMIC_REQUESTS": True}, claims=_ATOMIC_SQLITE
            )
        },
    ),
    "E040": Bad({"MAX_STORED_BODY_SIZE": 0}),
    "E041": Bad({"ENCRYPTION_KEYS": ["not-a-key"]}),
    "E042": Bad(
        {"ENCRYPTION_KEYS": ["Yw1yy5Vb2Gxm0Ts5iDaW6UGQ_lG6p6zWJtDqTX0qUCc="]},
        missing=("cryptography",),
    ),
    "E050": Bad({"OUTBOX_FAST_PATH": "off"}),
    "E051": Bad({"OUTBOX_LEASE": 0}),
    "E052": Bad({"OUTBOX_RETRY_DELAY": -1}),
    "E053": Bad({"OUTBOX_MAX_ATTEMPTS": 2.5}),
    "E054": Bad({"OUTBOX_BATCH_SIZE": "100"}),
    "E055": Bad({"OUTBOX_POLL_INTERVAL": 0}),
    "E056": Bad({"OUTBOX_MAX_ATTEMPTS": 5}, {"TASKS": {}}, missing=("celery",)),
    "E060": Bad({"STORE": "default"}),  # a CACHES alias, but LocMemCache
    "E064": Bad({"REDIS_REPLICAS": -1}),
    "E070": Bad({"OPERATION_SCOPE_FUNCTION": 42}),
}

#: The error checks that look at the URLconf's views or ask a server: not run when the app
#: loads (a URLconf imported from ``AppConfig.ready()`` imports the project's views before
#: the apps are ready), and each kept where it matters, before a claim.
KEPT_BEFORE_THE_CLAIM = {
    # The policy keeps the record at least as long as its lock (Options.resolve).
    "E033": "test_a_view_ttl_under_the_settings_lock_keeps_its_record_as_long",
    # A table or session that folds characters: asked of the server by ``migrate`` and
    # ``check --database``, and once per connection before its first claim or replay read
    # (gunicorn runs no checks): 500 idempotency-misconfigured, the view not run
    # (tests/test_unkeepable_scopes.py).
    "E034": "test_a_utf8mb3_session_is_refused_before_the_first_claim",
    # ``method_decorator(idempotent)`` on a dispatch that authenticates inside it: refused at
    # the first request, before its claim (tests/test_principals.py).
    "E035": "test_a_dispatch_decorated_before_the_frameworks_authentication_never_runs",
    # Atomic mode on Redis: refused at decoration (a view's store= or STORE), and by the policy
    # before the claim when STORE changed since (_conf.options).
    "E061": "tests/test_atomic_on_redis.py",
    # check --deploy: a server down now may be up when the first request comes (a 503 then).
    "E062": "tests/test_redis_store.py",
    # check --deploy: the server's eviction policy, asked of it (a server down now: E062).
    "E063": "test_e063_every_eviction_policy_but_noeviction_is_refused_at_deploy",
    # A view answering duplicates 202 with a status URL the URLconf lacks is refused before
    # its claim (_http.adapter.answerable).
    "E071": "test_accepted_without_the_status_urls_is_refused_before_the_claim",
}


def _error_ids() -> set[str]:
    """Every error check the app declares: on a setting's line, or above a check function."""
    declared = {f"E{check.id:03d}" for setting in SETTINGS for check in setting.checks}
    return declared | {name for name in checks.REFUSES if name.startswith("E")}


def test_every_error_check_is_refused_at_startup_or_kept_before_the_claim() -> None:
    assert store_checks.e062_unreachable  # its REFUSES row is written when it is imported
    assert set(REFUSED) | set(KEPT_BEFORE_THE_CLAIM) == _error_ids()
    assert not set(REFUSED) & set(KEPT_BEFORE_THE_CLAIM)
    # And the checks that see the settings alone are the ones the validator runs.
    tagged = {check for check in registry.get_checks() if SETTINGS_CHECKS in check.tags}
    assert tagged == {checks.check_settings, checks.check_database}


@contextmanager
def configured(bad: Bad, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for module in bad.missing:
        monkeypatch.setitem(sys.modules, module, None)  # not installed
    with (
        pytest.warns(UserWarning, match="DATABASES") if "DATABASES" in bad.others else _nothing(),
        override_settings(
            IDEMPOTENCY=bad.idempotency,
            **{"SILENCED_SYSTEM_CHECKS": [], **bad.others},  # tests.settings may silence E056
        ),
    ):
        yield


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _reported(id_: str) -> CheckMessage:
    """What ``manage.py check`` says (every check but the deployment ones), by id."""
    (message,) = [m for m in registry.run_checks() if m.id == f"django_idempotency.{id_}"]
    return message


def _words(message: CheckMessage) -> str:
    return f"({message.id}) {message.msg} HINT: {message.hint}"


@pytest.mark.parametrize("id_", sorted(REFUSED))
def test_startup_and_the_relay_refuse_what_check_reports_in_its_words(
    id_: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with configured(REFUSED[id_], monkeypatch):
        words = _words(_reported(id_))
        with pytest.raises(ImproperlyConfigured) as loading:
            apps.get_app_config("django_idempotency").ready()
        assert words in str(loading.value)
        # The relay: its own validation (called from code, --skip-checks) and the checks.
        with pytest.raises(ImproperlyConfigured) as relaying:
            call_command("idempotency_relay", "--once")
        assert str(relaying.value) == str(loading.value)
        with pytest.raises(SystemCheckError, match=re.escape(f"django_idempotency.{id_}")):
            call_command("idempotency_relay", "--once", skip_checks=False)


def test_the_settings_pass_once_fixed() -> None:
    """Not vacuous: the suite's own settings load, and the relay runs."""
    apps.get_app_config("django_idempotency").ready()
    usable()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "id_", sorted(id_ for id_, bad in REFUSED.items() if "DATABASES" not in bad.others)
)
def test_a_request_is_refused_before_its_claim(
    id_: str, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Settings changed at run time (``override_settings``): a protected request, with a key
    or without (``REQUIRED: "yes"`` ran a keyless view), is ``500 idempotency-misconfigured``,
    its view not run, nothing claimed."""
    with configured(REFUSED[id_], monkeypatch):
        for headers in ({"Idempotency-Key": key}, {}):
            response = Client().post(
                "/create/", {}, content_type="application/json", headers=headers
            )
            assert response.status_code == 500, (headers, response.content)
            assert problem_slug(response) == "idempotency-misconfigured"
    assert executions("create") == 0
    assert not IdempotencyKey.objects.exists()


def test_silenced_checks_do_not_stop_the_app(monkeypatch: pytest.MonkeyPatch) -> None:
    """``SILENCED_SYSTEM_CHECKS`` is the project's word, as for ``check``: a project whose
    protected views are all atomic silences E019 (docs/checks.rst). A value the code cannot
    read at all is refused silenced or not (tests/test_unusable_settings.py)."""
    bad = REFUSED["E019"]
    with configured(bad, monkeypatch):
        with override_settings(SILENCED_SYSTEM_CHECKS=["django_idempotency.E019"]):
            usable()
        with pytest.raises(ImproperlyConfigured, match="E019"):
            usable()
    with (
        override_settings(
            IDEMPOTENCY={"ENCRYPTION_KEYS": ["not-a-key"]},
            SILENCED_SYSTEM_CHECKS=["django_idempotency.E041"],
        ),
        pytest.raises(ImproperlyConfigured, match="E041"),
    ):
        usable()


def test_every_error_is_said_at_once() -> None:
    with (
        override_settings(IDEMPOTENCY={"METHODS": ["GET"], "LOCK_TIMEOUT": 0}),
        pytest.raises(ImproperlyConfigured) as refused,
    ):
        usable()
    assert "(django_idempotency.E020) IDEMPOTENCY['METHODS'] lists safe methods" in str(
        refused.value
    )
    assert "(django_idempotency.E006) IDEMPOTENCY['LOCK_TIMEOUT'] must be positive" in str(
        refused.value
    )


@pytest.mark.django_db
@pytest.mark.urls("tests.operations_urls_missing")
@pytest.mark.parametrize(
    ("path", "label"), [("/export/", "export"), ("/drf-export/", "drf-export")]
)
def test_accepted_without_the_status_urls_is_refused_before_the_claim(
    path: str, label: str, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, the view ran and failed on its own ``operation_url`` (a 500 after its effects),
    and every retry ran it again."""
    response = Client().post(
        path, {}, content_type="application/json", headers={"Idempotency-Key": key}
    )
    assert response.status_code == 500, response.content
    assert problem_slug(response) == "idempotency-misconfigured"
    assert "(django_idempotency.E071)" in caplog.text
    assert executions(label) == 0
    assert not IdempotencyKey.objects.exists()


# --- a lock no shorter than its claim's statement deadline (E026) -----------------------------


@pytest.mark.parametrize("lock", [0.0001, 0.5, 0.999])
def test_a_lock_shorter_than_the_statement_deadline_is_refused(lock: float) -> None:
    """A claim may take a second (``deadlines.bound``) and succeed: a shorter lock has lapsed
    when it returns, and each duplicate takes the record over while the view runs."""
    from django_idempotency._store import deadlines

    assert deadlines.bound(__import__("datetime").timedelta(seconds=lock)) > lock
    with override_settings(IDEMPOTENCY={"LOCK_TIMEOUT": lock}):
        (error,) = checks.check_settings()
    assert error.id == "django_idempotency.E026"
    assert "must be at least 1 second" in error.msg
    with pytest.raises(ImproperlyConfigured, match="lock_timeout must be at least 1 second"):
        idempotent(lock_timeout=lock)
    with pytest.raises(ImproperlyConfigured, match="lock_timeout must be at least 1 second"):
        idempotent_function(key="id", lock_timeout=lock)


def test_the_shortest_lock_is_the_statement_deadline() -> None:
    from datetime import timedelta

    from django_idempotency._store import deadlines

    assert deadlines.bound(timedelta(seconds=1)) == 1.0
    with override_settings(IDEMPOTENCY={"LOCK_TIMEOUT": 1, "TTL": 1}):
        assert checks.check_settings() == []
        usable()
    idempotent(lock_timeout=1, ttl=1)


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("lock_timeout", 0, "lock_timeout must be positive"),
        ("lock_timeout", -5, "lock_timeout must be positive"),
        ("lock_timeout", 0.5, "lock_timeout must be at least 1 second"),
        ("ttl", 0, "ttl must be positive"),
        ("wait_timeout", 0, "wait_timeout must be positive"),
        ("methods", ["GET"], "methods lists safe methods"),
        ("methods", "POST", "methods must be a non-empty list of HTTP methods"),
        ("required", "yes", "required must be True or False"),
        ("heartbeat", "off", "heartbeat must be True or False"),
        ("in_progress", "accept", "in_progress must be one of"),
        ("key_format", "uuid4", "key_format"),
        ("store", "default", "which is not Redis"),
    ],
)
def test_a_view_option_that_can_never_work_is_refused_when_decorated(
    option: str, value: Any, words: str
) -> None:
    with pytest.raises(ImproperlyConfigured, match=re.escape(words)):
        idempotent(**{option: value})


def test_a_view_ttl_under_the_settings_lock_keeps_its_record_as_long() -> None:
    """E033 (a view's ttl against the settings' lock) needs the URLconf; the policy keeps such
    a record at least as long as its lock, so no duplicate takes over a live owner."""
    from datetime import timedelta

    from django_idempotency._conf.options import Options

    with override_settings(IDEMPOTENCY={"LOCK_TIMEOUT": 60}):
        assert Options.build(ttl=5).resolve().ttl == timedelta(seconds=60)


# --- the seam: real servers -------------------------------------------------------------------

#: The issue's settings, each of which gunicorn served.
SERVED_BEFORE = [
    ({"METHODS": ["GET"]}, "E020"),
    ({"METHODS": "POST"}, "E004"),
    ({"LOCK_TIMEOUT": -5}, "E006"),
    ({"LOCK_TIMEOUT": 0}, "E006"),
    ({"LOCK_TIMEOUT": 0.0001}, "E026"),
    ({"REQUIRED": "yes"}, "E002"),
    ({"HEARTBEAT": "off"}, "E002"),
    ({"IN_PROGRESS": "accept"}, "E009"),
    ({"RETRY_AFTER": "1"}, "E010"),
    ({"OUTBOX_LEASE": 0}, "E051"),
    ({"OUTBOX_MAX_ATTEMPTS": 0}, "E053"),
    ({"OUTBOX_MAX_ATTEMPTS": 2.5}, "E053"),
    ({"OUTBOX_RETRY_DELAY": -1}, "E052"),
    ({"OUTBOX_BATCH_SIZE": "100"}, "E054"),
    ({"TTL": 10, "LOCK_TIMEOUT": 60}, "E008"),
]


def _server(kind: str, idempotency: dict[str, Any]) -> harness.Server:
    port = harness.free_port()
    if kind == "gunicorn":  # its default: each worker loads the app (no --preload)
        command = [
            sys.executable, "-m", "gunicorn", "--workers", "1", "--bind", f"127.0.0.1:{port}",
            *harness._no_control_socket(), "django.core.wsgi:get_wsgi_application()",
        ]  # fmt: skip
    else:
        command = [
            sys.executable, "-m", "uvicorn", "--factory", "--port", str(port),
            "django.core.asgi:get_asgi_application",
        ]  # fmt: skip
    env = {
        **harness._environment("unused", "wsgi"),
        "DJANGO_SETTINGS_MODULE": "tests.startup_settings",
        "IDEMPOTENCY_STARTUP_SETTINGS": json.dumps(idempotency),
    }
    return harness.Server(kind, command, port, env)


@pytest.mark.parametrize(("idempotency", "id_"), SERVED_BEFORE, ids=[i for _, i in SERVED_BEFORE])
def test_gunicorn_does_not_boot_on_settings_check_refuses(
    idempotency: dict[str, Any], id_: str
) -> None:
    with override_settings(IDEMPOTENCY=idempotency):
        words = _words(_reported(id_))  # what manage.py check says: id, message and hint
    server = _server("gunicorn", idempotency)
    try:
        with pytest.raises(RuntimeError, match="exited at start") as exited:
            server.start()
        assert f"ImproperlyConfigured: {words}" in str(exited.value), str(exited.value)
    finally:
        server.stop()
        server.discard_log()


@pytest.mark.parametrize("kind", ["gunicorn", "uvicorn"])
def test_the_servers_boot_on_good_settings_and_not_on_bad(kind: str) -> None:
    """The control: the same command serves with settings ``check`` passes, so the refusal is
    the settings'."""
    good = _server(kind, {"LOCK_TIMEOUT": 1, "TTL": 60})
    try:
        good.start()
        assert httpx.get(f"{good.url}/health/", timeout=10).text == "ok"
    finally:
        good.stop()
        good.discard_log()
    bad = _server(kind, {"METHODS": ["GET"]})
    try:
        with pytest.raises(RuntimeError, match="exited at start") as exited:
            bad.start()
        assert "ImproperlyConfigured: (django_idempotency.E020)" in str(exited.value)
    finally:
        bad.stop()
        bad.discard_log()
