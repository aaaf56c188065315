"""E060 refuses at startup a Redis store's option that can never work, without a connection:
a cache alias's ``OPTIONS`` as a URL's query (each passed startup and answered ``503`` to every
keyed request), a text redis-py passes on unread where it takes a boolean or a number
(``?decode_responses=false`` read as true), a ``health_check_interval`` out of range; each
with a hint that fits what was given (a URL is not told about ``CACHES``, an unregistered
scheme is told how stores are registered, a port out of range is not "not a number")."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_idempotency._conf.settings import usable
from django_idempotency._ops import checks

pytest.importorskip("redis")

PASSWORD = "S3cret-pw-60"
DJANGO = "django.core.cache.backends.redis.RedisCache"
_PARSERS = __import__("redis.connection", fromlist=["x"]).URL_QUERY_ARGUMENT_PARSERS


def refused(store: str, caches: dict[str, Any] | None = None) -> Any:
    """E060's one error for ``STORE`` (and the app's refusal to start in its words)."""
    extra = {} if caches is None else {"CACHES": caches}
    with override_settings(IDEMPOTENCY={"STORE": store}, **extra):
        errors = checks.check_settings()
        assert [e.id for e in errors] == ["django_idempotency.E060"], errors
        with pytest.raises(ImproperlyConfigured, match="E060"):
            usable()
    assert PASSWORD not in errors[0].msg + str(errors[0].hint)
    return errors[0]


def cache(options: dict[str, Any], location: str = "redis://127.0.0.1:6379/0") -> Any:
    return {"idem": {"BACKEND": DJANGO, "LOCATION": location, "OPTIONS": options}}


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"protocol": 9}, "protocol=9"),
        ({"socket_timeout": -1}, "socket_timeout=-1"),
        ({"socket_connect_timeout": "5"}, "socket_connect_timeout='5'"),
        ({"db": -1}, "db=-1"),
        ({"max_connections": -1}, "max_connections=-1"),
        ({"health_check_interval": -1}, "health_check_interval=-1"),
        ({"health_check_interval": "10"}, "health_check_interval='10'"),
        ({"decode_responses": True}, "decode_responses=True"),
        ({"retry_on_timeout": "false"}, "retry_on_timeout='false'"),
        ({"ssl_cert_reqs": "required"}, "TLS option"),
        ({"socket_timout": 5}, "socket_timout"),
        ({"password": PASSWORD, "protocol": 9}, "protocol=9"),
    ],
)
def test_a_cache_alias_option_that_can_never_work_is_e060(
    options: dict[str, Any], said: str
) -> None:
    error = refused("idem", cache(options))
    assert said in error.msg and "CACHES['idem']" in error.msg
    assert "OPTIONS" in error.hint


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"ssl_cert_reqs": "bogus"}, "ssl_cert_reqs='bogus'"),
        ({"ssl_min_version": 99}, "ssl_min_version=99"),
    ],
)
def test_a_tls_cache_alias_option_redis_py_refuses_is_e060(
    options: dict[str, Any], said: str
) -> None:
    assert said in refused("idem", cache(options, "rediss://127.0.0.1:6379/0")).msg


def test_django_redis_connection_pool_kwargs_are_checked() -> None:
    caches = {
        "idem": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:6379/0",
            "OPTIONS": {"CONNECTION_POOL_KWARGS": {"protocol": 9}, "SOCKET_TIMEOUT": 5},
        }
    }
    assert "protocol=9" in refused("idem", caches).msg
    caches["idem"]["OPTIONS"] = {"SOCKET_TIMEOUT": -1}
    assert "socket_timeout=-1" in refused("idem", caches).msg


def test_cache_alias_options_that_work_are_accepted() -> None:
    options = {
        "socket_timeout": 5,
        "socket_connect_timeout": 2.5,
        "health_check_interval": 0,
        "retry_on_timeout": True,
        "decode_responses": False,
        "protocol": 3,
        "max_connections": 10,
        "password": PASSWORD,
    }
    with override_settings(IDEMPOTENCY={"STORE": "idem"}, CACHES=cache(options)):
        assert checks.check_settings() == []
    tls = cache({"ssl_cert_reqs": "none"}, "rediss://127.0.0.1:6379/0")
    with override_settings(IDEMPOTENCY={"STORE": "idem"}, CACHES=tls):
        assert checks.check_settings() == []


def _left_as_text(name: str) -> bool:
    return name not in _PARSERS


@pytest.mark.parametrize(
    "query",
    [
        "decode_responses=false",
        "decode_responses=true",
        "single_connection_client=no",
        "ssl=true",
        "health_check_interval=-5",
        "socket_type=1",
        "retry=3",
        *(["ssl_validate_ocsp=false"] if _left_as_text("ssl_validate_ocsp") else []),
        *(["socket_read_size=x"] if _left_as_text("socket_read_size") else []),
    ],
)
def test_a_url_option_redis_py_would_not_read_as_meant_is_e060(query: str) -> None:
    error = refused(f"redis://:{PASSWORD}@127.0.0.1:6379/0?{query}")
    assert f"?{query}" in error.msg
    assert "CACHES" not in error.hint


def test_health_check_interval_in_range_is_accepted() -> None:
    for query in ("health_check_interval=0", "health_check_interval=30"):
        with override_settings(IDEMPOTENCY={"STORE": f"redis://127.0.0.1/0?{query}"}):
            assert checks.check_settings() == []


@pytest.mark.parametrize("url", ["redis://127.0.0.1:99999/0", "redis+cluster://a:1,b:70000"])
def test_a_port_out_of_range_is_said_out_of_range(url: str) -> None:
    error = refused(url)
    assert "out of range (1-65535)" in error.msg and "not a number" not in error.msg


def test_a_url_is_not_told_about_caches() -> None:
    error = refused(f"redis://:{PASSWORD}@127.0.0.1:abc/0")
    assert "CACHES" not in error.msg + error.hint and "URL" in error.hint


def test_an_unregistered_scheme_is_told_how_stores_are_registered() -> None:
    error = refused("toy://memory")
    assert "no registered store serves the scheme 'toy://'" in error.msg
    assert "STORES" in error.hint and "Adding a store" in error.hint


@pytest.mark.parametrize(
    ("store", "hinted"),
    [("toy2://x", "Adding a store"), ("redis://127.0.0.1:99999/0", "Correct the URL")],
)
def test_a_views_store_refused_gives_the_settings_hint(store: str, hinted: str) -> None:
    """A view's ``store=`` is refused when decorated, with the hint ``STORE``'s check gives
    for the same value (it had none: a new user was not told how stores are registered)."""
    from django_idempotency import idempotent

    with pytest.raises(ImproperlyConfigured) as refused_view:
        idempotent(store=store)(lambda request: None)
    assert hinted in str(refused_view.value)


@pytest.mark.redis
def test_a_database_number_the_server_has_not_is_said_so_at_deploy() -> None:
    """Only the server knows its ``databases``: ``check --deploy``'s E062 says the number is
    beyond it (it said the store "does not answer", and to start it)."""
    import redis
    from django.conf import settings

    from django_idempotency._ops import store_checks

    server = redis.Redis.from_url(settings.REDIS_URL)
    count = int(server.config_get("databases")["databases"])
    base = settings.REDIS_URL.rpartition("/")[0]
    for store in (f"{base}/{count}", f"{base}/0?db={count}"):
        with override_settings(IDEMPOTENCY={"STORE": store}):
            assert checks.check_settings() == []  # no server asked at startup
            error = store_checks.e062_unreachable(store)
        assert error is not None and error.id == "django_idempotency.E062"
        assert f"has no database {count}" in error.msg and "does not answer" not in error.msg
        assert "Start it" not in error.hint
