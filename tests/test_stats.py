"""``idempotency_stats`` with ``call_command``, on SQLite and on PostgreSQL (``--json`` parsed)."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from django_idempotency import _store as store
from django_idempotency._ops import maintenance
from django_idempotency._store.maintenance import SizeQuery
from tests.factories import IdempotencyKeyFactory

pytestmark = pytest.mark.django_db


def stats(*args: str) -> str:
    out = StringIO()
    call_command("idempotency_stats", *args, stdout=out)
    return out.getvalue()


def stats_json() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(stats("--json"))
    return data


@pytest.fixture
def table() -> None:
    now = timezone.now()
    IdempotencyKeyFactory.create_batch(3, completed=True)
    IdempotencyKeyFactory.create_batch(2, completed=True, expired=True)
    IdempotencyKeyFactory(status="failed", response_status=422, unlock_at=None, lock_token=None)
    IdempotencyKeyFactory()  # processing, lock live
    IdempotencyKeyFactory(expired=True)  # expired, but its lock is live: cleanup keeps it
    IdempotencyKeyFactory(
        created_at=now - timedelta(minutes=42), unlock_at=now - timedelta(minutes=41)
    )
    IdempotencyKeyFactory(stale=True, expired=True)


def test_json(table: None) -> None:
    data = stats_json()

    assert data["total"] == 10
    assert data["by_status"] == {"processing": 4, "completed": 5, "failed": 1}
    assert data["expired"] == 3  # what idempotency_cleanup would delete
    assert data["stale"] == 2
    assert 42 * 60 <= data["oldest_stale_age_seconds"] < 43 * 60
    assert 41 * 60 <= data["longest_stale_for_seconds"] < 42 * 60
    assert data["warnings"] == []
    assert data["cleanup_rows_per_minute"] == 3_000_000
    assert data["table_bytes"] > 0 and data["index_bytes"] > 0
    expected = {
        "sqlite": "dbstat",
        "postgresql": "pg_total_relation_size, pg_indexes_size",
        "mysql": "information_schema.TABLES",
    }
    assert data["size_source"] == expected[connection.vendor]


def test_json_of_an_empty_table() -> None:
    data = stats_json()

    assert data["total"] == data["expired"] == data["stale"] == 0
    assert data["by_status"] == {"processing": 0, "completed": 0, "failed": 0}
    assert data["oldest_stale_age_seconds"] is None
    assert data["longest_stale_for_seconds"] is None


def test_text(table: None) -> None:
    lines = stats().splitlines()

    assert lines[0] == "Records:              10 (processing 4, completed 5, failed 1)"
    assert lines[1] == "Expired, to clean up: 3"
    assert lines[2] == "Stale processing:     2 (oldest claimed 42m ago, stale for 41m)"
    assert lines[3].startswith("Size:                 table ")
    assert lines[4] == "Outbox undelivered:   0 pending, 0 failed"
    assert lines[5] == "Operations running:   0"
    assert len(lines) == 6
    assert stats("--verbosity", "0") == ""


def test_warns_when_expired_rows_outrun_a_minute_of_cleanup(
    table: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(maintenance, "CLEANUP_ROWS_PER_MINUTE", 2)

    assert stats().splitlines()[-1] == (
        "Warning: 3 expired records are more than one idempotency_cleanup run deletes in a "
        "minute (2 at the defaults): is it scheduled?"
    )
    assert len(stats_json()["warnings"]) == 1
    monkeypatch.setattr(maintenance, "CLEANUP_ROWS_PER_MINUTE", 3)
    assert stats_json()["warnings"] == []


@pytest.mark.django_db(transaction=True, databases=["default", "idempotency"])
def test_the_database_option() -> None:
    IdempotencyKeyFactory()
    assert json.loads(stats("--json", "--database", "idempotency"))["total"] == 1
    with pytest.raises(CommandError, match="Unknown database 'nope'"):
        stats("--database", "nope")


def test_when_the_size_query_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    # As on SQLite built without SQLITE_ENABLE_DBSTAT_VTAB, where dbstat does not exist.
    monkeypatch.setattr(
        store.using("default"),
        "size_query",
        lambda table: SizeQuery("SELECT * FROM no_dbstat", [], "x"),
    )
    IdempotencyKeyFactory()

    data = stats_json()

    assert data["total"] == 1
    if connection.vendor == "sqlite":  # the whole file's size instead
        assert data["size_source"] == "page_count * page_size (the whole file)"
        assert data["table_bytes"] > 0
    else:
        assert data["size_source"] == "unknown"
        assert data["table_bytes"] is None
    assert data["index_bytes"] is None
    # The failed statement left the connection usable (on PostgreSQL: rolled back to a savepoint).
    assert stats_json()["total"] == 1


def test_size_query_for_each_database() -> None:
    table = "django_idempotency_idempotencykey"
    postgresql = store.VENDORS["postgresql"]("default").size_query(table)
    mysql = store.VENDORS["mysql"]("default").size_query(table)
    sqlite = store.VENDORS["sqlite"]("default").size_query(table)

    assert postgresql is not None and mysql is not None and sqlite is not None
    assert "pg_total_relation_size(t) - pg_indexes_size(t)" in postgresql.sql
    assert postgresql.params == [f'"{table}"']  # a regclass: quoted like an identifier
    assert mysql.sql == (
        "SELECT data_length, index_length FROM information_schema.TABLES "
        "WHERE table_schema = DATABASE() AND table_name = %s"
    )
    assert (mysql.params, mysql.source) == ([table], "information_schema.TABLES")
    assert "FROM dbstat" in sqlite.sql


def test_failed_outbox_messages_are_a_warning() -> None:
    """The cron alert of docs/commands.rst reads ``.warnings``: failed messages must be there
    (it stayed empty while messages were failed)."""
    from django_idempotency.models import OutboxMessage

    record = IdempotencyKeyFactory(completed=True)
    OutboxMessage.objects.create(
        record=record, message_id="m-1", engine="celery", task="t", arguments="{}", state="failed"
    )
    [warning] = stats_json()["warnings"]
    assert "1 outbox message(s) failed" in warning and "--retry-failed" in warning
    assert stats().splitlines()[-1].startswith("Warning: 1 outbox message(s) failed")


def test_an_unreachable_redis_store_exits_non_zero_with_its_figures(
    settings: Any, capsys: Any
) -> None:
    """Nothing listens on port 1: the JSON is still printed, the store's error is a warning,
    and the command fails (it exited 0), naming the store as the settings spell it."""
    settings.IDEMPOTENCY = {"STORE": "redis://127.0.0.1:1/0"}
    with pytest.raises(CommandError, match=r"Redis store 'redis://127.0.0.1:1/0' did not answer"):
        call_command("idempotency_stats", "--json")
    data = json.loads(capsys.readouterr().out)
    assert data["redis_stores"]["redis://127.0.0.1:1/0"]["error"]
    assert any("did not answer" in warning for warning in data["warnings"])
    with pytest.raises(CommandError, match="did not answer"):
        call_command("idempotency_stats", verbosity=0)


def test_a_failing_stores_error_is_short_and_shows_no_password(
    settings: Any, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's whole exception text was printed (``--json``'s ``error``, the text's line,
    idempotency_cleanup's note): a client's repr of its pool, lines on lines, and whatever
    secret its message held. Now its class and first line, the URL's password ``***``."""
    from django_idempotency._store.redis.store import RedisStore

    secret = "Pw@48/s3cret"
    url = "redis://:Pw%4048%2Fs3cret@127.0.0.1:1/0"
    text = f"no answer (AUTH {secret}) <redis.Pool<redis.Connection(password={secret})>>\nmore"

    def failing(*args: Any) -> Any:
        raise RuntimeError(text)

    monkeypatch.setattr(RedisStore, "census", failing)
    monkeypatch.setattr(RedisStore, "count", failing)
    settings.IDEMPOTENCY = {"STORE": url}
    with pytest.raises(CommandError) as refused:
        call_command("idempotency_stats", "--json")
    [figures] = json.loads(capsys.readouterr().out)["redis_stores"].values()
    assert figures["error"] == "RuntimeError: no answer (AUTH ***) <...>"
    with pytest.raises(CommandError):
        call_command("idempotency_stats")
    call_command("idempotency_cleanup")
    printed = capsys.readouterr().out + str(refused.value)
    assert "RuntimeError: no answer (AUTH ***) <...>" in printed
    assert "s3cret" not in printed and "more" not in printed


def test_the_short_form_of_a_stores_error_redacts_its_secrets() -> None:
    """What the admin and idempotency_recover print of a store that did not answer too."""
    from django_idempotency._conf.values import short_error

    url = "rediss://u:p%2Fw@h/0?ssl_password=k3y&db=1"
    error = ConnectionError("auth p/w and p%2Fw and k3y refused\nsecond line")
    assert short_error(error, url) == "ConnectionError: auth *** and *** and *** refused"
    assert short_error(ValueError(""), url) == "ValueError"


def _docs_stats_example() -> tuple[str, str]:
    """The ``STORE`` and the jq filter of docs/commands.rst's example (``.. stats-example:``)."""
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parent.parent / "docs" / "commands.rst"
    block = page.read_text().partition(".. stats-example:")[2].partition("\n\n(")[0]
    setting = re.search(r'"STORE": "([^"]+)"', block)
    line = next(each for each in block.splitlines() if "| jq '" in each)
    assert setting is not None
    return setting[1], line.partition("| jq '")[2].rpartition("'")[0]


def test_the_docs_jq_example_finds_a_store_whose_url_holds_a_password(settings: Any) -> None:
    """The page sent monitors to ``redis_stores`` and never said how a store whose URL holds a
    password is named: its filter, run by jq on the command's output, finds the store's entry
    (the toy store on the page's URL: the name is the point, not a server), and an outbox it
    does not have is ``null``, not ``0``."""
    import shutil
    import subprocess

    from django_idempotency._conf import stores

    jq = shutil.which("jq")
    if jq is None:
        pytest.skip("jq is not installed")
    setting, jq_filter = (each.replace("redis://", "toy://") for each in _docs_stats_example())
    stores.STORES["toy://"] = "tests.toy_store.ToyStore"
    try:
        settings.IDEMPOTENCY = {"STORE": setting}
        out = StringIO()
        call_command("idempotency_stats", "--json", stdout=out)
    finally:
        del stores.STORES["toy://"]
        store._BOUND.pop(setting, None)
    assert "s3cret" not in out.getvalue()
    found = subprocess.run(
        [jq, jq_filter], input=out.getvalue(), capture_output=True, text=True, check=True
    )
    figures = {"total": 0, "outbox_pending": None, "outbox_failed": None, "error": None}
    assert json.loads(found.stdout) == figures
