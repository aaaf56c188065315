"""Each setting and view option is declared once (``_conf.Settings``); what cannot be derived
from the declarations (types for type checkers, the docs' prose) is held to them here."""

from __future__ import annotations

import dataclasses
import inspect
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from rest_framework.views import APIView

from django_idempotency import idempotent_function
from django_idempotency._conf.options import (
    CALL_OPTIONS,
    VIEW_OPTIONS,
    CallOptions,
    Options,
    Policy,
    ViewOptions,
)
from django_idempotency._conf.settings import DEFAULTS, OPTIONS, SETTINGS, Settings, conf
from django_idempotency._ops import checks, store_checks
from django_idempotency.rest_framework import IdempotencyMixin

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_the_typed_options_are_the_declared_ones() -> None:
    assert ViewOptions.__optional_keys__ == VIEW_OPTIONS == {o.name for o in OPTIONS}
    assert CallOptions.__optional_keys__ == CALL_OPTIONS == {o.name for o in OPTIONS if o.function}
    assert {f.name for f in dataclasses.fields(Policy)} == VIEW_OPTIONS | {"alias"}


def test_defaults_are_the_declarations() -> None:
    assert list(DEFAULTS) == [setting.name for setting in SETTINGS]
    assert conf.TTL == timedelta(hours=24) == DEFAULTS["TTL"]


def test_a_setting_s_option_is_named_after_it() -> None:
    names = {o.name: o.setting for o in OPTIONS}
    assert names["ttl"] == "TTL"
    assert names["scope"] == "SCOPE_FUNCTION"
    assert names["atomic"] is None


def test_the_mixin_has_one_attribute_per_option() -> None:
    attributes = {name for name in vars(IdempotencyMixin) if name.startswith("idempotency_")}
    assert attributes == {f"idempotency_{name}" for name in VIEW_OPTIONS}
    assert IdempotencyMixin.idempotency_atomic is False  # type: ignore[attr-defined]
    assert IdempotencyMixin.idempotency_ttl is None  # type: ignore[attr-defined]

    class View(IdempotencyMixin, APIView):
        idempotency_ttl = 60
        idempotency_in_progress = "wait"

    assert View.get_idempotency_options() == Options.build(ttl=60, in_progress="wait", atomic=False)


def test_idempotent_function_takes_the_function_options_only() -> None:
    idempotent_function(key="k", **{name: None for name in CALL_OPTIONS})  # type: ignore[arg-type]
    # scope and fingerprint are the function's own, of its arguments rather than a request.
    own = set(inspect.signature(idempotent_function).parameters)
    assert VIEW_OPTIONS - CALL_OPTIONS - own == {"required", "methods"}
    for name in VIEW_OPTIONS - CALL_OPTIONS - own:
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
            idempotent_function(key="k", **{name: None})  # type: ignore[arg-type]


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.setting])
def test_a_value_the_setting_s_check_refuses_the_option_refuses(option: Any) -> None:
    """The same tests: a bad ``METHODS`` and a bad ``methods`` are refused in the same words."""
    # Any value no test takes; the functions' own tests differ from their settings' but share
    # the one of their arguments.
    bad = {"SCOPE_FUNCTION": lambda: "s", "FINGERPRINT_FUNCTION": lambda request: "f"}.get(
        option.setting, object()
    )
    with override_settings(IDEMPOTENCY={option.setting: bad}):
        (error,) = checks.check_settings()
    with pytest.raises(ImproperlyConfigured) as refused:
        Options.build(**{option.name: bad})
    said = error.msg.removeprefix(f"IDEMPOTENCY[{option.setting!r}]")
    assert str(refused.value) == f"Invalid idempotency option: {option.name}{said}"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"atomic": "yes"}, "atomic must be True or False, not 'yes'"),
        ({"required": 1}, "required must be True or False, not 1"),
        ({"methods": []}, "methods must be a non-empty list of HTTP methods"),
    ],
)
def test_values_once_taken_by_their_truth_are_refused(options: Any, message: str) -> None:
    """As their settings are (E002, E004), and as ``heartbeat`` always was."""
    with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
        Options.build(**options)
    with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
        type(
            "View", (IdempotencyMixin, APIView), {f"idempotency_{k}": v for k, v in options.items()}
        )


def test_check_ids_read_in_source_order() -> None:
    declared = [check.id for setting in SETTINGS for check in setting.checks[:1]]
    assert declared == sorted(declared)
    functions = [name for name, _ in inspect.getmembers(checks, inspect.isfunction)]
    in_source = sorted(
        (n for n in functions if re.fullmatch(r"[ew]\d{3}_\w+", n)),
        key=lambda n: inspect.getsourcelines(getattr(checks, n))[1],
    )
    assert [n[1:4] for n in in_source if n[0] == "e"] == sorted(
        n[1:4] for n in in_source if n[0] == "e"
    )


def _ids_in_code() -> set[str]:
    declared = {f"E{check.id:03d}" for setting in SETTINGS for check in setting.checks}
    source = inspect.getsource(checks) + inspect.getsource(store_checks)
    functions = {m.upper() for m in re.findall(r"^def ([ew]\d{3})_", source, re.MULTILINE)}
    return declared | functions


def test_every_check_says_what_it_refuses_and_is_tested() -> None:
    """``docs/checks.rst``'s table is made from the declarations (``docs/_ext``): each check of
    one value by its test's words, each other check by the row above its function."""
    assert set(checks.REFUSES) == _ids_in_code() - {
        f"E{check.id:03d}" for setting in SETTINGS for check in setting.checks
    }
    for setting in SETTINGS:
        for check in setting.checks:
            assert check.refuses and check.hint, check.id
    assert ".. idempotency-checks::" in (DOCS / "checks.rst").read_text()
    tests = "".join(p.read_text() for p in Path(__file__).parent.glob("test_*.py"))
    # A setting's first check is tested by the next test; the others each have their own.
    first = {f"E{s.checks[0].id:03d}" for s in SETTINGS if s.checks}
    assert {
        i
        for i in _ids_in_code() - first
        if f'"{i}"' not in tests and f"django_idempotency.{i}" not in tests
    } == set()


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.checks], ids=lambda s: s.name)
def test_a_value_of_no_kind_is_refused_by_the_first_check(
    setting: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each setting's first check, in its declared words and id: a new setting is tested so."""
    # An OUTBOX_ key set where nothing could deliver (no Celery installed, Django 5.2) is E056
    # too: that check is tested on its own (tests/test_outbox.py).
    monkeypatch.setattr(checks, "_outbox_deliverable", lambda: True)
    with override_settings(IDEMPOTENCY={setting.name: object()}):
        (error,) = checks.check_settings()
    first = setting.checks[0]
    assert (error.id, error.hint) == (f"django_idempotency.E{first.id:03d}", first.hint)
    assert error.msg.startswith(setting.label)


def test_every_setting_has_its_entry_in_the_docs() -> None:
    """``sphinx -W`` fails too (``docs/_ext/declarations.py``); this says so without Sphinx."""
    entries = re.findall(
        r"^\.\. idempotency-setting:: (\w+)$", (DOCS / "settings.rst").read_text(), re.MULTILINE
    )
    assert sorted(entries) == sorted(DEFAULTS)


# --- ttl and lock_timeout: one rule (_options.ttl_error) -------------------------------------


def test_the_rule_refuses_options_given_together() -> None:
    with pytest.raises(
        ImproperlyConfigured, match=r"ttl \(0:00:01\) is shorter than lock_timeout \(0:01:00\)"
    ):
        Options.build(ttl=1, lock_timeout=60)
    Options.build(ttl=60, lock_timeout=60)


def test_the_rule_is_the_settings_check() -> None:
    with override_settings(IDEMPOTENCY={"TTL": 10, "LOCK_TIMEOUT": 60}):
        (error,) = checks.check_settings()
    assert error.id == "django_idempotency.E008"
    assert error.msg.startswith(
        "IDEMPOTENCY['TTL'] (0:00:10) is shorter than IDEMPOTENCY['LOCK_TIMEOUT'] (0:01:00)"
    )


def test_a_policy_the_checks_cannot_see_keeps_its_record_as_long_as_its_lock() -> None:
    """An idempotent_function, or a view outside the URLconf, meets no check: its TTL under the
    lock timeout of the settings is raised to it, not refused at the call."""
    options = Options.build(ttl=5)
    assert options.resolve().ttl == timedelta(seconds=30)
    with override_settings(IDEMPOTENCY={"LOCK_TIMEOUT": 2}):
        assert options.resolve().ttl == timedelta(seconds=5)


def test_declarations_read_as_the_settings_class() -> None:
    assert Settings.TTL.name == "TTL"
    assert Settings.TTL.option is not None and Settings.TTL.option.name == "ttl"
