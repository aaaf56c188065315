"""A setting that can never work stops the work before any view runs (issue 38).

Under gunicorn no system check runs: ``ENCRYPTION_KEYS=["not-a-key"]`` let the view run, failed
to seal its result, left the record ``processing``, and the retry ran the view again. Such a
setting now refuses the app's loading (``AppConfig.ready``), in its check's words, and, changed
at run time (``override_settings``), answers ``500 idempotency-misconfigured`` before the claim:
no view runs and no record is made, whichever setting it is and whichever entry point.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, override_settings

from django_idempotency import JSONSerializer, idempotent_function
from django_idempotency.models import IdempotencyKey
from tests.conftest import executions, problem_slug

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[1]
#: A Fernet key (Fernet.generate_key()), as a project's environment holds one.
GOOD_KEY = "Yw1yy5Vb2Gxm0Ts5iDaW6UGQ_lG6p6zWJtDqTX0qUCc="


def two_arguments(request: object, extra: object) -> str:
    return "scope"


#: (setting, a value that can never work, the check that says so). The first five were read
#: only after the view ran, to store its result; the others before the claim, but as a
#: traceback, Django's HTML 500.
UNUSABLE = [
    ("ENCRYPTION_KEYS", ["not-a-key"], "E041"),
    ("REPLAYED_HEADERS", 5, "E014"),
    ("MAX_BODY_SIZE", "1 MiB", "E017"),
    ("MAX_STORED_BODY_SIZE", 0, "E040"),
    ("RETRYABLE_STATUSES", 500, "E011"),
    ("TTL", timedelta.max, "E005"),
    ("KEY_FORMAT", "[a-z]+", "E023"),
    ("SCOPE_FUNCTION", "tests.nowhere.scope", "E015"),
    ("SCOPE_FUNCTION", "tests.test_unusable_settings.two_arguments", "E024"),
    ("FINGERPRINT_FUNCTION", "tests.test_unusable_settings.two_arguments.x", "E016"),
    ("RETRY_AFTER", "soon", "E010"),
    ("MISMATCH_STATUS", "four-twenty-two", "E012"),
    ("DATABASE_ALIAS", "nowhere", None),
]
IDS = [f"{name}={value!r}" for name, value, _ in UNUSABLE]


def refused(response: Any, caplog: pytest.LogCaptureFixture, setting: str) -> None:
    """The answer of a request refused for a setting: a problem, and the log names it."""
    assert response.status_code == 500, response.content
    assert problem_slug(response) == "idempotency-misconfigured"
    assert setting not in response.content.decode()  # the operators', not the client's
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(f"IDEMPOTENCY[{setting!r}]" in line for line in logged), logged
    assert not IdempotencyKey.objects.exists()


@pytest.mark.parametrize(("setting", "value", "check"), UNUSABLE, ids=IDS)
@pytest.mark.parametrize(
    ("path", "label"),
    [
        ("/create/", "create"),
        ("/async/", "async"),
        ("/atomic/", "atomic"),
        ("/drf/", "drf"),
        ("/ninja/charges", "ninja-charge"),
    ],
)
def test_the_view_never_runs_and_nothing_is_claimed(
    setting: str,
    value: object,
    check: str | None,
    path: str,
    label: str,
    key: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with override_settings(IDEMPOTENCY={setting: value}):
        for _ in range(2):  # the retry too
            response = Client().post(
                path,
                {"amount": 1},
                content_type="application/json",
                headers={"Idempotency-Key": key},
            )
            refused(response, caplog, setting)
    assert executions(label) == 0
    with override_settings(IDEMPOTENCY={}):  # fixed: the same key runs, once
        response = Client().post(
            path, {"amount": 1}, content_type="application/json", headers={"Idempotency-Key": key}
        )
    assert response.status_code in (200, 201), response.content
    assert executions(label) == 1


def test_the_log_says_which_check_and_how_to_fix_it(
    key: str, caplog: pytest.LogCaptureFixture
) -> None:
    with override_settings(IDEMPOTENCY={"ENCRYPTION_KEYS": ["not-a-key"]}):
        Client().post(
            "/create/", {}, content_type="application/json", headers={"Idempotency-Key": key}
        )
    (line,) = [r.getMessage() for r in caplog.records if r.name == "django_idempotency"]
    assert "(django_idempotency.E041) IDEMPOTENCY['ENCRYPTION_KEYS'][0] is not a Fernet key" in line
    assert "Fernet.generate_key()" in line  # the check's hint
    assert "not-a-key" not in line  # a key is a secret, even a bad one
    assert "refused before its view ran" in line


def test_keys_without_cryptography_are_refused_before_the_view(
    key: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "cryptography", None)  # not installed
    with override_settings(IDEMPOTENCY={"ENCRYPTION_KEYS": [GOOD_KEY]}):
        response = Client().post(
            "/create/", {}, content_type="application/json", headers={"Idempotency-Key": key}
        )
        refused(response, caplog, "ENCRYPTION_KEYS")
        assert "E042" in caplog.text
    assert executions("create") == 0


def test_a_request_without_a_key_or_with_the_app_off_is_not_refused() -> None:
    """Only what the app would protect is refused: off, every view is a plain view."""
    with override_settings(IDEMPOTENCY={"ENABLED": False, "ENCRYPTION_KEYS": ["not-a-key"]}):
        response = Client().post("/create/", {}, content_type="application/json")
    assert response.status_code == 201
    assert executions("create") == 1


@pytest.mark.parametrize(("setting", "value", "check"), UNUSABLE, ids=IDS)
def test_a_function_raises_before_it_runs(setting: str, value: object, check: str | None) -> None:
    calls = []

    @idempotent_function(key="event_id")
    def handle(event_id: str) -> int:
        calls.append(event_id)
        return 1

    with (
        override_settings(IDEMPOTENCY={setting: value}),
        pytest.raises(ImproperlyConfigured, match=re.escape(f"IDEMPOTENCY[{setting!r}]")),
    ):
        handle("e-1")
    assert (calls, IdempotencyKey.objects.count()) == ([], 0)


def test_an_async_function_raises_before_it_runs() -> None:
    calls = []

    @idempotent_function(key="event_id")
    async def handle(event_id: str) -> int:
        calls.append(event_id)
        return 1

    with (
        override_settings(IDEMPOTENCY={"ENCRYPTION_KEYS": ["not-a-key"]}),
        pytest.raises(ImproperlyConfigured, match="E041"),
    ):
        async_to_sync(handle)("e-1")
    assert (calls, IdempotencyKey.objects.count()) == ([], 0)


@pytest.mark.parametrize(("setting", "value", "check"), UNUSABLE, ids=IDS)
def test_the_app_refuses_to_load_in_its_checks_words(
    setting: str, value: object, check: str | None
) -> None:
    message = f"(django_idempotency.{check}) " if check else ""
    with (
        override_settings(IDEMPOTENCY={setting: value}),
        pytest.raises(ImproperlyConfigured, match=re.escape(f"{message}IDEMPOTENCY[{setting!r}]")),
    ):
        apps.get_app_config("django_idempotency").ready()


def test_a_server_with_a_bad_key_does_not_start() -> None:
    """What gunicorn does, on the example project, with the issue's environment."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "IDEMPOTENCY_ENCRYPTION_KEYS": "not-a-key",
        "PYTHONPATH": str(ROOT),
    }
    started = subprocess.run(
        [sys.executable, "-c", "from example_project.wsgi import application"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert started.returncode != 0
    assert "ImproperlyConfigured: (django_idempotency.E041)" in started.stderr, started.stderr
    env["IDEMPOTENCY_ENCRYPTION_KEYS"] = GOOD_KEY
    started = subprocess.run(
        [sys.executable, "-c", "from example_project.wsgi import application"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert started.returncode == 0, started.stderr


def test_a_json_serializer_refuses_an_encoder_that_is_not_one() -> None:
    """An encoder instance (not its class) failed on the first result, after the function ran;
    it is refused when the serializer is made."""
    from django.core.serializers.json import DjangoJSONEncoder

    with pytest.raises(TypeError, match=r"a json\.JSONEncoder subclass"):
        JSONSerializer(encoder=DjangoJSONEncoder())  # type: ignore[arg-type]
    assert JSONSerializer(encoder=DjangoJSONEncoder).dumps({"a": 1}) == b'{"a": 1}'
