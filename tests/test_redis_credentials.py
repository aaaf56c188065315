"""A Redis store's credentials and TLS (issue 48): a URL's user and password never appear where
the app writes (check messages, logs and their tracebacks, commands' output and JSON, the admin),
and they and TLS reach the servers of one server's, a Sentinel's and a Cluster's URL, each
tested on private ``redis-server`` processes that ask for them (tests/redis_servers.py). Every
Redis failure, at a worker's first call too, is a ``503``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.test import Client, override_settings

from django_idempotency import StoreUnavailable, idempotent_function
from django_idempotency._conf.options import Options
from django_idempotency._conf.values import display_name
from django_idempotency._ops import checks, store_checks
from tests.redis_servers import (
    auth_options,
    free_port,
    private_cluster,
    start_server,
    tls_client,
    tls_files,
    tls_options,
)

pytestmark = [pytest.mark.redis, pytest.mark.django_db]

#: The default user's password: characters a URL must percent-encode, so that neither its
#: raw nor its encoded form may appear.
PASSWORD = "Pw@48/s3cret:x"
ENCODED = "Pw%4048%2Fs3cret%3Ax"
USER, USER_PASSWORD = "alice", "Alice-s3cret-48"
SENTINEL_PASSWORD = "Sentinel-s3cret-48"
SECRETS = (PASSWORD, ENCODED, USER_PASSWORD, SENTINEL_PASSWORD, "s3cret")


def assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret!r} shown in {text!r:.2000}"


def logged(caplog: pytest.LogCaptureFixture) -> str:
    """Every record as a handler writes it: its message and its traceback (with causes)."""
    formatter = logging.Formatter("%(levelname)s %(name)s %(message)s")
    return "\n".join(formatter.format(record) for record in caplog.records)


class server:
    """A private ``redis-server`` that asks for :data:`PASSWORD` (and has :data:`USER`), TLS
    only with ``tls``; ``appendonly no``."""

    def __init__(self, *, tls: bool = False) -> None:
        self.tls = tls

    def __enter__(self) -> server:
        self.dir = tempfile.mkdtemp(prefix="idempotency-redis-auth-")
        self.port = free_port()
        options = auth_options(PASSWORD, USER, USER_PASSWORD)
        client: dict[str, Any] = {"password": PASSWORD}
        self.files: dict[str, str] = {}
        if self.tls:
            self.files = tls_files(Path(self.dir, "tls"))
            options += tls_options(self.port, self.files)
            client |= tls_client(self.files)
        try:
            self.process = start_server(self.port, self.dir, *options, client=client)
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        return self

    def url(self, auth: str = f":{ENCODED}") -> str:
        scheme = "rediss" if self.tls else "redis"
        query = f"?ssl_ca_certs={self.files['tls-ca-cert-file']}" if self.tls else ""
        return f"{scheme}://{auth}@127.0.0.1:{self.port}/0{query}"

    def __exit__(self, *exc: object) -> None:
        self.process.kill()
        self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def protected_server() -> Iterator[server]:
    with server() as running:
        yield running


@pytest.fixture
def protected(protected_server: server) -> server:
    """The module's server that asks for the password, emptied."""
    redis.Redis(port=protected_server.port, password=PASSWORD).flushall()
    return protected_server


def counted_function() -> tuple[Any, dict[str, int]]:
    runs: dict[str, int] = {}

    @idempotent_function(key="event_id")
    def handle(event_id: str) -> str:
        runs[event_id] = runs.get(event_id, 0) + 1
        return event_id

    return handle, runs


def runs_once_on(url: str) -> None:
    """Two calls of one key on the store at ``url``: one execution, then its replay (keys of
    their own: one server is reached by several URLs)."""
    handle, runs = counted_function()
    first, second = f"a-{uuid.uuid4()}", f"b-{uuid.uuid4()}"
    with override_settings(IDEMPOTENCY={"STORE": url}):
        assert handle(first) == first
        assert handle(first) == first
        assert handle(second) == second
    assert runs == {first: 1, second: 1}


# --- the display name -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("store", "shown"),
    [
        ("redis://:pw@h:1/0", "redis://h:1/0"),
        ("redis://u:p%2Fw@h/0?db=1", "redis://h/0?db=1"),
        ("rediss://u:pw@h/0?password=x&ssl_ca_certs=/ca.crt", "rediss://h/0?password=***&ssl_ca_certs=/ca.crt"),
        ("redis://:pa/ss@h/0", "redis://h/0"),  # a "/" not percent-encoded
        ("redis://:p@ss@h/0", "redis://h/0"),  # an "@" not percent-encoded
        ("unix://:pw@/run/redis.sock?db=2", "unix:///run/redis.sock?db=2"),
        ("redis+sentinel://:pw@a:1,b:2/m/0?sentinel_password=y", "redis+sentinel://a:1,b:2/m/0?sentinel_password=***"),
        ("rediss+cluster://u:pw@a:1,b:2?ssl_cert_reqs=none", "rediss+cluster://a:1,b:2?ssl_cert_reqs=none"),
        ("redis:/:pw@h/0", "h/0"),
        ("redis", "redis"),
        ("cache:redis", "cache:redis"),
        ("default", "default"),
    ],
)  # fmt: skip
def test_a_stores_display_name_has_no_user_and_no_password(store: str, shown: str) -> None:
    assert display_name(store) == shown


# --- nowhere the app writes -------------------------------------------------------------------


def test_check_messages_never_show_the_password(protected: server) -> None:
    """E060 (a port that is not a number, an option redis-py cannot read), E061 (atomic on
    Redis), E062 (a store that does not answer), W060 (``appendonly no``)."""
    bad = [
        f"redis://:{ENCODED}@127.0.0.1:abc/0",
        f"redis+cluster://u:{ENCODED}@a:1,b:x",
        f"redis://:{ENCODED}@127.0.0.1/0?db=x",
        f"redis+tls://:{ENCODED}@127.0.0.1/0",  # a scheme mistyped
        f"redis:/:{ENCODED}@127.0.0.1/0",
    ]
    for url in bad:
        with override_settings(IDEMPOTENCY={"STORE": url}):
            errors = checks.check_settings()
            assert [e.id for e in errors] == ["django_idempotency.E060"], url
            assert_no_secret(errors[0].msg + str(errors[0].hint))
            with pytest.raises(ImproperlyConfigured) as refused:
                from django_idempotency._conf.settings import usable

                usable()
            assert_no_secret(str(refused.value))
    with override_settings(IDEMPOTENCY={"STORE": protected.url()}):
        refused = store_checks.check_stores()  # the test URLconf's atomic views
    assert {e.id for e in refused} == {"django_idempotency.E061"}
    for error in refused:
        assert_no_secret(error.msg)
    with pytest.raises(ImproperlyConfigured) as atomic:
        Options.build(atomic=True, store=protected.url())
    assert_no_secret(str(atomic.value))
    assert display_name(protected.url()) in str(atomic.value)
    dead = f"redis://:{ENCODED}@127.0.0.1:{free_port()}/0"
    with override_settings(IDEMPOTENCY={"STORE": dead}):
        errors = store_checks.check_stores_deploy()
    assert [e.id for e in errors] == ["django_idempotency.E062"]
    assert_no_secret(errors[0].msg)
    with override_settings(IDEMPOTENCY={"STORE": protected.url()}):
        warnings = store_checks.check_stores_deploy()
    assert [w.id for w in warnings] == ["django_idempotency.W060"]
    assert_no_secret(warnings[0].msg)
    assert display_name(protected.url()) in warnings[0].msg


def test_the_eviction_check_never_shows_the_password(protected: server) -> None:
    """E063 (an evicting policy) and W062 (``CONFIG`` forbidden to the store's user) named the
    store by ``STORE``'s value itself: ``check --deploy`` printed its password."""
    admin = redis.Redis(port=protected.port, password=PASSWORD)
    admin.config_set("maxmemory-policy", "allkeys-lru")
    limited = f"{USER}-limited"
    admin.acl_setuser(limited, enabled=True, passwords=[f"+{USER_PASSWORD}"], keys=["*"],
                      channels=["*"], commands=["+@all", "-config"])  # fmt: skip
    try:
        for url, expected in [
            (protected.url(), "django_idempotency.E063"),
            (protected.url(f"{limited}:{USER_PASSWORD}"), "django_idempotency.W062"),
        ]:
            with override_settings(IDEMPOTENCY={"STORE": url}):
                messages = store_checks.check_stores_deploy()
            found = [m for m in messages if m.id == expected]
            assert found, [m.id for m in messages]
            assert_no_secret(found[0].msg)
            assert display_name(url) in found[0].msg
    finally:
        admin.config_set("maxmemory-policy", "noeviction")
        admin.acl_deluser(limited)


def test_commands_never_show_the_password(protected: server, capsys: Any) -> None:
    """idempotency_stats (text and ``--json``, whose key is the store's display name),
    idempotency_cleanup and idempotency_recover, on a store that answers and on one that
    refuses the password."""
    handle, _ = counted_function()
    wrong = protected.url(":Wrong-s3cret")
    for url in (protected.url(), wrong):
        with override_settings(IDEMPOTENCY={"STORE": url}):
            if url != wrong:
                handle("a")
            refused = _stats(url == wrong)
            call_command("idempotency_cleanup")
            call_command("idempotency_recover")
            text = capsys.readouterr()
            assert_no_secret(text.out + text.err + refused)
            assert f"Redis store {display_name(url)!r}" in text.out + refused
            refused = _stats(url == wrong, "--json")
            out = capsys.readouterr().out
            assert_no_secret(out + refused)
            census = json.loads(out)["redis_stores"]
            assert list(census) == [display_name(url)]
            assert census[display_name(url)]["total"] == (1 if url != wrong else None)


def _stats(refused: bool, *options: str) -> str:
    """``idempotency_stats``: on a store that refuses, it prints its figures, then exits 1
    naming the store (the error's words returned)."""
    if not refused:
        call_command("idempotency_stats", *options)
        return ""
    with pytest.raises(CommandError) as error:
        call_command("idempotency_stats", *options)
    return str(error.value)


def test_the_admin_never_shows_the_password_to_view_only_staff(protected: server) -> None:
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user("viewer", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="view_idempotencykey"))
    client = Client()
    client.force_login(user)
    with override_settings(IDEMPOTENCY={"STORE": protected.url()}):
        page = client.get("/admin/django_idempotency/idempotencykey/")
    text = page.content.decode()
    assert page.status_code == 200
    assert "live in the Redis store" in text
    assert_no_secret(text)


@pytest.mark.parametrize("fault", ["a server down", "a wrong password"])
def test_logs_and_errors_never_show_the_password(
    fault: str, protected: server, post: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A view's call is a ``503`` with a line for the retry and one ERROR line (an outage has
    no traceback); a function's ``StoreUnavailable`` says why. None shows the password."""
    from tests.conftest import executions

    url = (
        f"redis://{USER}:{ENCODED}@127.0.0.1:{free_port()}/0"
        if fault == "a server down"
        else protected.url(f"{USER}:Wrong-{ENCODED}")
    )
    handle, runs = counted_function()
    caplog.set_level(logging.DEBUG)
    with override_settings(IDEMPOTENCY={"STORE": url}):
        response = post("/create/", {"a": 1}, key="k")
        with pytest.raises(StoreUnavailable) as refused:
            handle("a")
    assert response.status_code == 503
    assert executions() == 0 and runs == {}
    text = logged(caplog)
    assert "trying again" in text and "unavailable" in text
    assert_no_secret(text)
    assert_no_secret(str(refused.value) + response.content.decode())
    assert display_name(url) in text


def test_a_failed_renewal_never_shows_the_password(caplog: pytest.LogCaptureFixture) -> None:
    """The heartbeat's warning when it cannot renew a lock names the store: the server is
    killed while the function runs, which waits for the warning (a bound of 10 s)."""
    caplog.set_level(logging.WARNING)
    warned = threading.Event()

    class Watcher(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("Could not renew"):
                warned.set()

    watcher = Watcher()
    logging.getLogger("django_idempotency").addHandler(watcher)
    try:
        with server() as running:

            @idempotent_function(key="event_id", lock_timeout=1)
            def handle(event_id: str) -> str:
                running.process.kill()
                running.process.wait()
                assert warned.wait(10)
                return event_id

            with (
                override_settings(IDEMPOTENCY={"STORE": running.url()}),
                contextlib.suppress(StoreUnavailable),  # its result not written: a 503
            ):
                handle("a")
    finally:
        logging.getLogger("django_idempotency").removeHandler(watcher)
    text = logged(caplog)
    assert "Could not renew" in text
    assert_no_secret(text)


# --- credentials and TLS that work --------------------------------------------------------------


@pytest.mark.parametrize("auth", ["password only", "user and password"])
def test_one_servers_credentials_are_used(auth: str, protected: server) -> None:
    runs_once_on(
        protected.url(f":{ENCODED}" if auth == "password only" else f"{USER}:{USER_PASSWORD}")
    )


def test_one_server_over_tls_with_a_password() -> None:
    with server(tls=True) as running:
        runs_once_on(running.url())
        runs_once_on(running.url(f"{USER}:{USER_PASSWORD}"))
        # Without the TLS options too: a plain URL with ssl_ca_certs is E060 (redis-py's
        # plain connection refuses it whatever the server), not this 503.
        plain = running.url().replace("rediss://", "redis://").partition("?")[0]
        handle, runs = counted_function()
        with override_settings(IDEMPOTENCY={"STORE": plain}), pytest.raises(StoreUnavailable):
            handle("a")  # TLS only: a plain connection fails, a 503
        assert runs == {}


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_a_clusters_credentials_and_tls_are_used(tls: bool, tmp_path: Path) -> None:
    """Every node asks for the password (``requirepass``, ``masterauth``): before, a cluster's
    URL dropped its credentials and every call was a ``500``; ``rediss+cluster://`` was
    refused."""
    files = tls_files(tmp_path / "tls") if tls else None
    cluster = private_cluster(
        tmp_path / "nodes", password=PASSWORD, user=USER, user_password=USER_PASSWORD, tls=files
    )
    with cluster as url:
        runs_once_on(url)  # the ACL user's
        runs_once_on(url.replace(f"{USER}:{USER_PASSWORD}@", f":{ENCODED}@"))
        handle, runs = counted_function()
        wrong = url.replace(USER_PASSWORD, "Wrong-s3cret")
        with override_settings(IDEMPOTENCY={"STORE": wrong}), pytest.raises(StoreUnavailable):
            handle("x")
        assert runs == {}


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_a_sentinels_credentials_and_tls_are_used(tls: bool, tmp_path: Path) -> None:
    """A master that asks for :data:`PASSWORD` (and has :data:`USER`), and a sentinel that asks
    for its own (``sentinel_password``), TLS only with ``tls``: before, a Sentinel's URL dropped
    its credentials and every call was a ``503``."""
    files = tls_files(tmp_path / "tls") if tls else {}
    client = tls_client(files) if tls else {}
    master, watcher = free_port(), 0
    processes = []
    try:
        (tmp_path / "master").mkdir()
        options = auth_options(PASSWORD, USER, USER_PASSWORD)
        options += tls_options(master, files) if tls else []
        processes.append(
            start_server(
                master, str(tmp_path / "master"), *options, client={"password": PASSWORD, **client}
            )
        )
        watcher = free_port()
        config = tmp_path / "sentinel.conf"
        config.write_text(
            f"sentinel monitor m 127.0.0.1 {master} 1\n"
            f'sentinel auth-pass m "{PASSWORD}"\n'
            f"requirepass {SENTINEL_PASSWORD}\n"
        )
        processes.append(
            start_server(
                watcher, str(tmp_path), "--sentinel", *(tls_options(watcher, files) if tls else []),
                config=str(config), client={"password": SENTINEL_PASSWORD, **client},
            )
        )  # fmt: skip
        scheme = "rediss+sentinel" if tls else "redis+sentinel"
        query = f"sentinel_password={SENTINEL_PASSWORD}"
        if tls:
            query += f"&ssl_ca_certs={files['tls-ca-cert-file']}"
        place = f"127.0.0.1:{watcher}/m/0?{query}"
        runs_once_on(f"{scheme}://:{ENCODED}@{place}")
        runs_once_on(f"{scheme}://{USER}:{USER_PASSWORD}@{place}")
        handle, runs = counted_function()
        without = f"{scheme}://:{ENCODED}@{place.replace(SENTINEL_PASSWORD, 'Wrong-s3cret')}"
        with override_settings(IDEMPOTENCY={"STORE": without}), pytest.raises(StoreUnavailable):
            handle("x")
        assert runs == {}
    finally:
        for process in processes:
            process.kill()
            process.wait()


# --- every failure a 503 --------------------------------------------------------------------------


def test_an_unreachable_cluster_at_a_workers_first_call_is_a_503(post: Any) -> None:
    """``RedisCluster`` asks a node for the slots when it is made: with none answering it
    raises ``RedisClusterException``, which is not a ``RedisError`` (a ``500`` before)."""
    from tests.conftest import executions, problem_slug

    for url in (
        f"redis+cluster://:{ENCODED}@127.0.0.1:{free_port()}",
        f"redis+sentinel://:{ENCODED}@127.0.0.1:{free_port()}/m/0",
    ):
        with override_settings(IDEMPOTENCY={"STORE": url}):
            response = post("/create/", {"a": 1}, key="k")
        assert response.status_code == 503, url
        assert problem_slug(response) == "idempotency-unavailable"
    assert executions() == 0


def test_an_option_the_client_refuses_is_refused_by_the_check(post: Any) -> None:
    """An option redis-py passes on but the client does not take (a ``TypeError`` when the
    client is made) is E060 at startup: it answered ``503`` to every keyed request, and passed
    the checks. Set at run time, it is refused before the view runs, as any unusable value."""
    url = f"redis://127.0.0.1:{free_port()}/0?no_such_option=1"
    with override_settings(IDEMPOTENCY={"STORE": url}):
        assert [e.id for e in checks.check_settings()] == ["django_idempotency.E060"]
        response = post("/create/", {"a": 1}, key="k")
    assert response.status_code == 500
    assert json.loads(response.content)["type"].endswith("#idempotency-misconfigured")


def test_a_raw_client_of_the_private_server_needs_the_password(protected: server) -> None:
    """The servers these tests use do ask for it (else a dropped password would pass)."""
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=protected.port, socket_timeout=5).ping()


# --- a URL two parses read differently ------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "redis://:S3cr@t/pw%#zz@127.0.0.1:16510/0",  # the reviewer's: redis-py sent AUTH S3cr to t
        "redis://:pa/ss@127.0.0.1:16510/0",
        "redis://:pa?ss@127.0.0.1:16510/0",
        "redis://:pa#ss@127.0.0.1:16510/0",
        "redis://:p@a/ss@127.0.0.1:16510/0",
        "redis://:pass%@127.0.0.1:16510/0#zz",
        "redis://127.0.0.1:16510/0#pass",
        "redis+sentinel://:pa/ss@a:1,b:2/m/0",
        "rediss+cluster://u:pa?ss@a:1,b:2",
    ],
)
def test_a_url_the_standard_parse_reads_as_another_server_is_refused(url: str) -> None:
    """Issue 48: the app showed (and connected Sentinel and Cluster places by) one host, redis-py
    another, with a piece of the password as AUTH; E060 now says to percent-encode it."""
    with override_settings(IDEMPOTENCY={"STORE": url}):
        errors = checks.check_settings()
    assert [e.id for e in errors] == ["django_idempotency.E060"]
    text = errors[0].msg + str(errors[0].hint)
    assert "percent-encode" in text
    for piece in ("S3cr", "pw%", "pa/", "pa?", "pa#", "ss@", "zz", "pass%", "#pass"):
        assert piece not in text, piece
    with pytest.raises(ImproperlyConfigured, match="percent-encode"):
        Options.build(store=url)  # a view's store option


@pytest.mark.parametrize(
    ("url", "host", "password"),
    [
        ("redis://:S3cr%40t%2Fpw%25%23zz@127.0.0.1:16510/0", "127.0.0.1", "S3cr@t/pw%#zz"),
        ("redis://:p@ss@127.0.0.1:16510/0", "127.0.0.1", "p@ss"),  # the last "@" ends it in both
        ("redis://:pa%3Fss%2F@h:1/0", "h", "pa?ss/"),
        ("redis://:p%zz@h/0", "h", "p%zz"),  # no escape: both keep it as written
        ("redis://u:p%25@[::1]:6379/0", "::1", "p%"),
    ],
)
def test_a_url_both_parses_read_alike_is_accepted(url: str, host: str, password: str) -> None:
    from redis.connection import parse_url

    with override_settings(IDEMPOTENCY={"STORE": url}):
        assert checks.check_settings() == []
    parsed = parse_url(url)
    assert (parsed["host"], parsed["password"]) == (host, password)


# --- an option's value that can never work ----------------------------------------------------


#: Options redis-py 5.3 passes on from a URL unread (its parsers came later): a value there
#: is refused by the connection or not at all, so these cases are the newer redis-py's.
_PARSERS = __import__("redis.connection", fromlist=["x"]).URL_QUERY_ARGUMENT_PARSERS


def _parser_refuses(name: str, value: str) -> bool:
    try:
        _PARSERS[name](value)
    except (KeyError, TypeError, ValueError) as exc:
        return not isinstance(exc, KeyError)
    return False


_READ_BY_THIS_REDIS_PY = (
    [(f"redis://:{ENCODED}@127.0.0.1/0?retry_on_error=NoSuchError", "=NoSuchError")]
    if _parser_refuses("retry_on_error", "NoSuchError")
    else []
)
_TLS_MIN = "&ssl_min_version=771" if "ssl_min_version" in _PARSERS else ""


@pytest.mark.parametrize(
    ("url", "said"),
    [
        (f"redis://:{ENCODED}@127.0.0.1:6379/0?protocol=9", "?protocol=9"),
        (f"rediss://:{ENCODED}@127.0.0.1:6379/0?ssl_cert_reqs=bogus", "?ssl_cert_reqs=bogus"),
        (f"rediss+sentinel://:{ENCODED}@a:1/m?ssl_cert_reqs=bogus", "?ssl_cert_reqs=bogus"),
        (f"redis+cluster://:{ENCODED}@a:1,b:2?protocol=4", "?protocol=4"),
        ("unix:///tmp/redis.sock?protocol=9", "?protocol=9"),
        (f"redis://:{ENCODED}@127.0.0.1/0?ssl_cert_reqs=none", "?ssl_cert_reqs=none"),
        (f"redis://:{ENCODED}@127.0.0.1/0?socket_timeout=abc", "?socket_timeout=abc"),
        (f"redis://:{ENCODED}@127.0.0.1/0?socket_timeout=-1", "?socket_timeout=-1"),
        (f"redis://:{ENCODED}@127.0.0.1/0?socket_connect_timeout=inf", "timeout=inf"),
        (f"redis://:{ENCODED}@127.0.0.1/0?db=-1", "?db=-1"),
        (f"redis://:{ENCODED}@127.0.0.1/0?max_connections=-1", "?max_connections=-1"),
        (f"rediss://:{ENCODED}@127.0.0.1/0?ssl_min_version=99", "?ssl_min_version=99"),
        *_READ_BY_THIS_REDIS_PY,
        ("unix:///tmp/redis.sock?socket_timout=5", "socket_timout"),
    ],
)
def test_an_option_value_redis_py_refuses_when_it_connects_is_e060(url: str, said: str) -> None:
    """``?protocol=9`` or ``?ssl_cert_reqs=bogus`` passed E060 and every keyed request
    answered ``503``; a value redis-py cannot read was said to be "read as another server".
    The message names the option and its value, never the password."""
    with override_settings(IDEMPOTENCY={"STORE": url}):
        errors = checks.check_settings()
    assert [e.id for e in errors] == ["django_idempotency.E060"], url
    assert said in errors[0].msg
    assert "another server" not in errors[0].msg
    assert_no_secret(errors[0].msg + str(errors[0].hint))
    with pytest.raises(ImproperlyConfigured, match="E060"):
        from django_idempotency._conf.settings import usable

        with override_settings(IDEMPOTENCY={"STORE": url}):
            usable()


def test_an_ssl_password_is_never_shown_by_an_option_check() -> None:
    url = f"rediss://127.0.0.1/0?ssl_password={ENCODED}&ssl_cert_reqs=bogus"
    with override_settings(IDEMPOTENCY={"STORE": url}):
        errors = checks.check_settings()
    assert [e.id for e in errors] == ["django_idempotency.E060"]
    assert "?ssl_cert_reqs=bogus" in errors[0].msg
    assert_no_secret(errors[0].msg)


@pytest.mark.parametrize(
    "url",
    [
        "rediss://127.0.0.1/0?ssl_cert_reqs=none&protocol=3&ssl_check_hostname=no",
        f"rediss://127.0.0.1/0?ssl_cert_reqs=optional{_TLS_MIN}&max_connections=5",
        "redis://127.0.0.1/0?protocol=2&socket_timeout=2.5&db=3&health_check_interval=10",
        "redis+cluster://a:1,b:2?protocol=3&socket_connect_timeout=1",
        "rediss+sentinel://a:1/m/0?ssl_cert_reqs=required&sentinel_password=x",
        "unix:///tmp/redis.sock?db=2&protocol=3",
    ],
)
def test_option_values_redis_py_takes_are_accepted(url: str) -> None:
    with override_settings(IDEMPOTENCY={"STORE": url}):
        assert checks.check_settings() == []


@pytest.mark.parametrize(
    "url",
    [
        f"rediss://127.0.0.1/0?ssl_password={PASSWORD}&ssl_cert_reqs=bogus",
        f"rediss://:{PASSWORD}@127.0.0.1/0?ssl_password={PASSWORD}",
    ],
)
def test_a_secret_options_at_not_encoded_shows_no_piece_of_it(url: str) -> None:
    """The app's authority runs to the URL's last ``@``: an ``ssl_password`` whose ``@`` was
    not percent-encoded was shown as the host (``rediss://48/s3cret:x&...``) in E060's
    message."""
    with override_settings(IDEMPOTENCY={"STORE": url}):
        errors = checks.check_settings()
    assert [e.id for e in errors] == ["django_idempotency.E060"]
    assert_no_secret(errors[0].msg + display_name(url))
    for piece in ("48/", "cret"):
        assert piece not in errors[0].msg


@pytest.mark.django_db(transaction=True)
def test_the_relay_says_a_refused_password_once_at_error_as_a_misconfiguration(
    protected: server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relay logged a wrong password as an outage ("the store failed ...; trying again"),
    a warning each pass for good: it is said once at ``ERROR``, as a misconfiguration with its
    cause (and no password), then a warning each pass that it still is."""
    from django_idempotency._ops import relay as relaying

    url = protected.url(f"{USER}:Wrong-{ENCODED}")
    monkeypatch.setattr(relaying, "STATEMENT_BOUND", 0.5)  # a pass rides the fault out so long
    records: list[logging.LogRecord] = []
    retries: list[logging.LogRecord] = []  # a pass's backoff: 48 warnings in 14 s, said at DEBUG
    passes = threading.Event()

    class Watcher(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "trying again" in record.getMessage() and record.levelno >= logging.WARNING:
                retries.append(record)
            if record.getMessage().startswith("Outbox relay:"):
                records.append(record)
                if len(records) == 3:
                    passes.set()

    watcher = Watcher()
    logging.getLogger("django_idempotency").addHandler(watcher)
    try:
        with override_settings(IDEMPOTENCY={"STORE": url}):
            relay = relaying.Relay(url, interval=0.01)
            running = threading.Thread(target=relay.run)
            running.start()
            assert passes.wait(30)
            relay.stop()
            running.join(30)
    finally:
        logging.getLogger("django_idempotency").removeHandler(watcher)
    levels = [record.levelno for record in records]
    assert levels[0] == logging.ERROR and set(levels[1:]) == {logging.WARNING}
    first = records[0].getMessage()
    assert "misconfigured" in first and "AuthenticationError" in first, first
    assert display_name(url) in first
    assert all("still misconfigured" in record.getMessage() for record in records[1:])
    assert not retries, retries[0].getMessage()
    assert_no_secret("\n".join(record.getMessage() for record in records))
