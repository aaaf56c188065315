"""Settings are read once and cached, and a change of ``settings.IDEMPOTENCY`` is seen at once."""

from __future__ import annotations

from datetime import timedelta

from django.test import override_settings

from django_idempotency import user_scope
from django_idempotency._conf.options import Options
from django_idempotency._conf.settings import conf


def custom_scope(request: object) -> str:
    return "custom"


def ttl_and_scope() -> tuple[timedelta, object]:
    return conf.TTL, conf.SCOPE_FUNCTION


def test_cached_values_follow_override_settings() -> None:
    assert ttl_and_scope() == (timedelta(hours=24), user_scope)
    with override_settings(
        IDEMPOTENCY={"TTL": 60, "SCOPE_FUNCTION": "tests.test_conf.custom_scope"}
    ):
        assert ttl_and_scope() == (timedelta(seconds=60), custom_scope)
    assert ttl_and_scope() == (timedelta(hours=24), user_scope)


def test_a_views_policy_follows_the_settings_but_keeps_its_own_options() -> None:
    options = Options.build(lock_timeout=5)
    assert options.resolve().wait_timeout == timedelta(seconds=10)
    with override_settings(IDEMPOTENCY={"WAIT_TIMEOUT": 3, "LOCK_TIMEOUT": 99}):
        policy = options.resolve()
        assert (policy.wait_timeout, policy.lock_timeout) == (
            timedelta(seconds=3),
            timedelta(seconds=5),
        )
    assert options.resolve().wait_timeout == timedelta(seconds=10)


def test_values_are_converted_once_per_value_of_the_setting() -> None:
    with override_settings(IDEMPOTENCY={"METHODS": ["post", "put"]}):
        methods = conf.METHODS
        assert methods == frozenset({"POST", "PUT"})
        assert conf.METHODS is methods
