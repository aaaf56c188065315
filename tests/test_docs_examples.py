"""The examples of docs/outbox.rst and docs/operations.rst, run from the pages' own text
(issue 49: the pages' views answered ``403`` for want of ``csrf_exempt``, one used ``timedelta``
without importing it, and the outbox's consumer had no ``acks_late`` and lost messages).

How the pages mark their blocks: each ``code-block`` of docs/outbox.rst, docs/operations.rst and
docs/consumers.rst follows an rst comment (invisible on the page) that says what it is:

- ``.. example: PATH``: a part of the pages' project. The test makes a project as the page tells
  a reader to (``django-admin startproject shop .`` and ``manage.py startapp orders``), appends
  each such block, in page order (outbox.rst, then operations.rst), to the file PATH, then
  makes its migrations and migrates.
- ``.. example-session:``: a curl session, replayed against that project under ``runserver``
  with a Celery worker and the relay, printing what the page shows.
- ``.. run-by: tests/FILE.py``: run by that test (the example project's session).
- ``.. not-run: REASON``: not for pasting (the wrong way, a sketch needing a service).

Why the pages' text and not files under ``docs/examples/`` shown with ``literalinclude``: the
text is what the reader copies, the page reads whole on GitHub (which renders no
``literalinclude``), and a block cannot drift from what runs, since it is what runs. The
markers check themselves: a block without one fails
:func:`test_every_code_block_says_whether_it_runs`.

The project's Celery worker is SIGKILLed at each point of each documented consumer (the
outbox's receipt, the operation's export), on RabbitMQ and on Redis: before the effect (its
record claimed), after the effect and before the result is stored, and after the result is
stored and before the task is acknowledged. Each message must come back and have one effect.
The test parks the worker through a small app of its own (``killpoints``: Django's
``pre_save``/``post_save`` of the effect's model, Celery's ``task_postrun``), so the pages'
code is run untouched. Its settings add only the test's broker, queue, database and short
timeouts: ``visibility_timeout`` 10 s and ``unacked_restore_interval`` 1 s (the page sets
both, 3600 s and 10 s) and ``LOCK_TIMEOUT`` 5 s (30 s by default), so that a killed worker's
message and key come back within seconds.

Run by CI's ``celery`` leg (SQLite: the project's own database file, as ``startproject`` makes
it); the marker check runs everywhere.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.test_example_project import (
    TRIMMED,
    Exchange,
    console_session,
    run_curl,
    same_status,
)
from tests.test_example_project import _free_port as free_port

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
#: The pages of the project, in the order their blocks are appended.
PROJECT_PAGES = ("outbox.rst", "operations.rst")
#: The pages whose every block is marked.
MARKED_PAGES = (*PROJECT_PAGES, "consumers.rst")
MARKER = re.compile(r"^\s*\.\. (example|example-session|run-by|not-run):(?: (.+))?$")
BLOCK = re.compile(r"^(\s*)\.\. (code-block|literalinclude):: ?(\S*)")
DEADLINE = 180
BROKERS = {
    "rabbitmq": os.environ.get("IDEMPOTENCY_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//"),
    "redis": os.environ.get("IDEMPOTENCY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"),
}


@dataclass
class Block:
    page: str
    line: int
    kind: str  # a marker's name, or "" for none
    argument: str
    language: str
    code: str


def blocks(page: str) -> list[Block]:
    """Every ``code-block`` and ``literalinclude`` of ``page``, with the marker before it."""
    lines = (DOCS / page).read_text().splitlines()
    found = []
    for index, line in enumerate(lines):
        match = BLOCK.match(line)
        if match is None:
            continue
        indent, directive, language = match.groups()
        marker = MARKER.match(lines[index - 1]) if index else None
        kind, argument = (marker.group(1), marker.group(2) or "") if marker else ("", "")
        body = []
        cursor = index + 1
        while cursor < len(lines) and (
            not lines[cursor].strip() or lines[cursor].startswith(indent + "   ")
        ):
            body.append(lines[cursor])
            cursor += 1
        code = textwrap.dedent("\n".join(body)).strip("\n")
        if directive == "literalinclude":
            kind = kind or "literalinclude"
        found.append(Block(page, index + 1, kind, argument, language, code + "\n"))
    return found


def test_every_code_block_says_whether_it_runs() -> None:
    unmarked = []
    for page in MARKED_PAGES:
        for block in blocks(page):
            where = f"docs/{page}:{block.line}"
            if block.kind == "":
                unmarked.append(where)
            elif block.kind == "run-by":
                test = ROOT / block.argument
                assert test.is_file(), where
                assert page in test.read_text(), f"{where}: {block.argument} never names {page}"
            elif block.kind == "not-run":
                assert block.argument, f"{where}: say why it is not run"
            elif block.kind == "example":
                assert re.fullmatch(r"(shop|orders)/\w+\.py", block.argument), where
                assert block.code.startswith(f"# {block.argument}\n"), (
                    f"{where}: an example block starts with a comment naming its file"
                )
    assert unmarked == [], "blocks without a marker (see this module's docstring)"
    parts = [b for page in PROJECT_PAGES for b in blocks(page) if b.kind == "example"]
    assert {b.argument for b in parts} >= {
        "shop/settings.py",
        "shop/urls.py",
        "shop/celery.py",
        "orders/models.py",
        "orders/views.py",
        "orders/tasks.py",
    }
    for block in parts:  # each is Python as it stands (the project runs them together)
        compile(block.code, f"docs/{block.page}:{block.line}", "exec")


# The project, its worker and its web process.

KILLPOINTS = '''\
"""tests/test_docs_examples.py's own app: parks a Celery worker at a point of a documented
consumer, to be SIGKILLed there, and notes each task that succeeded."""

import os
import time
import uuid
from pathlib import Path

from django.apps import AppConfig


class KillPoints(AppConfig):
    name = "killpoints"

    def ready(self):
        from celery.signals import task_postrun
        from django.apps import apps
        from django.db import transaction
        from django.db.models.signals import post_save, pre_save

        point = os.environ.get("DOCS_TEST_KILL_AT")
        marker = Path(os.environ.get("DOCS_TEST_DIR", ".")) / "parked"

        def park(**kwargs):
            if marker.exists():
                return
            marker.write_text(str(os.getpid()))
            while True:
                time.sleep(60)

        if point == "before-effect":
            effect = apps.get_model(os.environ["DOCS_TEST_EFFECT"])
            pre_save.connect(park, sender=effect, weak=False)
        elif point == "after-effect":  # the effect and its recovery point committed
            effect = apps.get_model(os.environ["DOCS_TEST_EFFECT"])
            post_save.connect(
                lambda **kwargs: transaction.on_commit(park), sender=effect, weak=False
            )
        elif point == "before-ack":  # the result stored, the task not acknowledged
            task_postrun.connect(
                lambda state=None, **kwargs: park() if state == "SUCCESS" else None, weak=False
            )

        def succeeded(task_id=None, state=None, **kwargs):
            if state == "SUCCESS" and os.environ.get("DOCS_TEST_DIR"):
                done = Path(os.environ["DOCS_TEST_DIR"]) / "succeeded"
                done.mkdir(exist_ok=True)
                (done / f"{task_id}.{uuid.uuid4().hex}").touch()

        task_postrun.connect(succeeded, weak=False)
'''

#: Appended to shop/settings.py after the pages' blocks: the test's broker, queue and
#: database, and short timeouts (see the module's docstring).
TEST_SETTINGS = """

# tests/test_docs_examples.py's own settings, not the pages'.
import os as _os

INSTALLED_APPS += ["killpoints"]
CELERY_BROKER_URL = _os.environ.get("DOCS_TEST_BROKER_URL", "memory://")
CELERY_TASK_DEFAULT_QUEUE = _os.environ.get("DOCS_TEST_QUEUE", "celery")
CELERY_WORKER_ENABLE_REMOTE_CONTROL = False  # no reply queues left on a shared broker
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {
    **CELERY_BROKER_TRANSPORT_OPTIONS,
    "visibility_timeout": 10,
    "unacked_restore_interval": 1,
    "global_keyprefix": _os.environ.get("DOCS_TEST_PREFIX", ""),
}
DATABASES["default"]["NAME"] = _os.environ.get("DOCS_TEST_DB", DATABASES["default"]["NAME"])
DATABASES["default"]["OPTIONS"] = {"timeout": 30}
IDEMPOTENCY = {"LOCK_TIMEOUT": 5}
"""


def run(project: Path, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, *args],
        cwd=project,
        env=env or environment(project),
        capture_output=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, (args, done.stdout.decode()[-2000:], done.stderr.decode()[-4000:])
    return done.stdout.decode()


def environment(project: Path, **extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "PYTHONPATH")
    }
    # The app under test from this checkout, the project's own modules from its directory.
    return {**env, "PYTHONPATH": f"{project}{os.pathsep}{ROOT}", "PYTHONUNBUFFERED": "1", **extra}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pages' project, made and migrated as a reader would; its database is the template
    each test copies."""
    pytest.importorskip("celery")
    where = tmp_path_factory.mktemp("docs-project")
    run(where, "-m", "django", "startproject", "shop", ".")
    run(where, "manage.py", "startapp", "orders")
    for page in PROJECT_PAGES:
        for block in blocks(page):
            if block.kind == "example":
                target = where / block.argument
                existing = target.read_text() if target.exists() else ""
                target.write_text(existing + "\n\n" + block.code)
    (where / "killpoints").mkdir()
    (where / "killpoints" / "__init__.py").write_text("")
    (where / "killpoints" / "apps.py").write_text(KILLPOINTS)
    with (where / "shop" / "settings.py").open("a") as settings:
        settings.write(TEST_SETTINGS)
    run(where, "manage.py", "check", "--fail-level", "WARNING")
    run(where, "manage.py", "makemigrations", "orders")
    run(where, "manage.py", "migrate", "--noinput")
    return where


class Scratch:
    """One test's copy of the project's database, its broker queue (and Redis key prefix),
    its workers."""

    def __init__(self, project: Path, directory: Path, broker: str) -> None:
        self.project = project
        self.directory = directory
        self.broker = broker
        self.url = BROKERS[broker]
        run_id = uuid.uuid4().hex[:12]
        self.queue = f"idem-docs-{run_id}"
        self.prefix = f"idem-docs-{run_id}:" if broker == "redis" else ""
        self.database = directory / "db.sqlite3"
        shutil.copyfile(project / "db.sqlite3", self.database)
        self.workers: list[subprocess.Popen[bytes]] = []

    def env(self, **extra: str) -> dict[str, str]:
        return environment(
            self.project,
            DOCS_TEST_BROKER_URL=self.url,
            DOCS_TEST_QUEUE=self.queue,
            DOCS_TEST_PREFIX=self.prefix,
            DOCS_TEST_DB=str(self.database),
            DOCS_TEST_DIR=str(self.directory),
            **extra,
        )

    def worker(self, name: str, concurrency: int, **extra: str) -> subprocess.Popen[bytes]:
        log = (self.directory / f"{name}.log").open("wb")
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "celery", "-A", "shop", "worker", "--pool=prefork"),
                *("--loglevel=INFO", "--without-gossip", "--without-mingle"),
                *("--without-heartbeat", f"--concurrency={concurrency}"),
                *(f"--hostname={name}-{self.queue}@%h", f"--queues={self.queue}"),
            ],
            cwd=self.project,
            env=self.env(**extra),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.workers.append(process)
        return process

    def shell(self, code: str) -> str:
        return run(self.project, "manage.py", "shell", "-c", code, env=self.env())

    def rows(self, sql: str) -> list[tuple[object, ...]]:
        with sqlite3.connect(self.database, timeout=30) as connection:
            return list(connection.execute(sql))

    def succeeded(self) -> set[str]:
        done = self.directory / "succeeded"
        return {name.split(".")[0] for name in os.listdir(done)} if done.exists() else set()

    def wait_for(self, condition: object, what: str, within: float = DEADLINE) -> None:
        deadline = time.monotonic() + within
        while not condition():  # type: ignore[operator]
            if time.monotonic() > deadline:
                logs = {p.name: p.read_text()[-2000:] for p in self.directory.glob("*.log")}
                raise AssertionError(f"timed out waiting for {what}: {logs}")
            time.sleep(0.2)

    def close(self) -> None:
        for process in self.workers:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(timeout=30)
        if self.broker == "redis":
            import redis

            client = redis.Redis.from_url(self.url)
            keys = list(client.scan_iter(match=f"{self.prefix}*"))
            if keys:
                client.delete(*keys)
        else:
            from kombu import Connection

            with Connection(self.url) as connection:
                connection.default_channel.queue_delete(self.queue)


@pytest.fixture(params=sorted(BROKERS))
def scratch(project: Path, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Scratch]:
    own = Scratch(project, tmp_path, request.param)
    try:
        yield own
    finally:
        own.close()


POST_ORDERS = """
from django.test import Client
client = Client(HTTP_HOST="localhost")
for number in range(1, 4):
    response = client.post(
        "/orders/", {"email": f"buyer{number}@example.com"}, content_type="application/json",
        headers={"Idempotency-Key": f"order-{number}-5f0c2a7e-8b1d-4c3e"},
    )
    assert response.status_code == 201, response.content
"""

POST_EXPORT = """
from django.test import Client
from orders.models import Order
for number in range(1, 4):
    Order.objects.create(email=f"buyer{number}@example.com")
response = Client(HTTP_HOST="localhost").post(
    "/exports/", headers={"Idempotency-Key": "export-0b7e4a52-2d3c-4a8e"}
)
assert response.status_code == 202, response.content
print(response["Location"])
"""

KILL_POINTS = ["before-effect", "after-effect", "before-ack"]


@pytest.mark.celery
@pytest.mark.parametrize("point", KILL_POINTS)
def test_the_outbox_consumer_has_one_effect_per_message_with_its_worker_killed(
    scratch: Scratch, point: str
) -> None:
    first = scratch.worker("first", 1, DOCS_TEST_KILL_AT=point, DOCS_TEST_EFFECT="orders.Receipt")
    scratch.shell(POST_ORDERS)  # the fast path hands the three receipts to the broker
    messages = {
        str(m) for (m,) in scratch.rows("SELECT message_id FROM django_idempotency_outboxmessage")
    }
    assert len(messages) == 3
    scratch.wait_for(
        lambda: (scratch.directory / "parked").exists(), f"a worker parked {point}", 60
    )
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    scratch.worker("second", 2)
    scratch.wait_for(lambda: scratch.succeeded() >= messages, "every message, the killed one's too")
    receipts = sorted(int(str(o)) for (o,) in scratch.rows("SELECT order_id FROM orders_receipt"))
    assert receipts == [1, 2, 3]  # one effect each
    records = scratch.rows(
        "SELECT status, attempt FROM django_idempotency_idempotencykey"
        " WHERE path = 'orders.tasks.deliver_receipt' ORDER BY attempt"
    )
    taken_over = 1 if point == "before-ack" else 2  # replayed, or taken over and resumed
    assert records == [("completed", 1), ("completed", 1), ("completed", taken_over)]
    states = scratch.rows("SELECT state FROM django_idempotency_outboxmessage")
    assert states == [("sent",)] * 3


@pytest.mark.celery
@pytest.mark.parametrize(
    ("scratch", "point"),
    # Each point once, on both brokers between them: what differs between the brokers, the
    # redelivery of an unacknowledged task, the outbox consumer's test above meets at each point
    # on each; here the operation's states are the point.
    [("rabbitmq", "before-effect"), ("redis", "after-effect"), ("redis", "before-ack")],
    indirect=["scratch"],
)
def test_the_operations_export_completes_once_with_its_worker_killed(
    scratch: Scratch, point: str
) -> None:
    first = scratch.worker("first", 1, DOCS_TEST_KILL_AT=point, DOCS_TEST_EFFECT="orders.Export")
    scratch.shell(POST_EXPORT)
    ((message,),) = scratch.rows("SELECT message_id FROM django_idempotency_outboxmessage")
    scratch.wait_for(
        lambda: (scratch.directory / "parked").exists(), f"a worker parked {point}", 60
    )
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    scratch.worker("second", 2)
    scratch.wait_for(lambda: str(message) in scratch.succeeded(), "the killed worker's message")
    assert scratch.rows("SELECT COUNT(*) FROM orders_export") == [(1,)]
    ((export_id,),) = scratch.rows("SELECT id FROM orders_export")
    assert scratch.rows(
        "SELECT status, attempt FROM django_idempotency_idempotencykey"
        " WHERE path = 'orders.tasks.run_export'"
    ) == [("completed", 1 if point == "before-ack" else 2)]
    ((status, body),) = scratch.rows(
        "SELECT response_status, response_body FROM django_idempotency_idempotencykey"
        " WHERE method = 'POST'"
    )
    assert status == 201  # completed once: the final response replaces the 202
    assert json.loads(bytes(body)) == {"export": export_id}  # type: ignore[arg-type]


FAILING_EXPORT = (
    POST_EXPORT
    + """
import json
from django.db import connection
from orders.tasks import export_orders
location = response["Location"]
with connection.cursor() as cursor:  # the work cannot succeed: its table is gone
    cursor.execute("DROP TABLE orders_export")
assert export_orders.apply(args=[location.rsplit("/", 1)[1]]).failed()
print(json.dumps(Client(HTTP_HOST="localhost").get(location).json()))
retry = Client(HTTP_HOST="localhost").post(
    "/exports/", headers={"Idempotency-Key": "export-0b7e4a52-2d3c-4a8e"}
)
print(retry.status_code, retry["Idempotent-Replayed"])
"""
)


@pytest.mark.celery
def test_the_operations_task_that_raises_fails_its_operation(project: Path, tmp_path: Path) -> None:
    """The page's task, run where its work raises: the operation is failed with the page's
    problem, not left running until its TTL (issue 49)."""
    database = tmp_path / "db.sqlite3"
    shutil.copyfile(project / "db.sqlite3", database)
    out = run(
        project,
        "manage.py",
        "shell",
        "-c",
        FAILING_EXPORT,
        env=environment(project, DOCS_TEST_DB=str(database), DOCS_TEST_DIR=str(tmp_path)),
    )
    _location, state, replayed = out.strip().splitlines()[-3:]
    shown = json.loads(state)
    assert shown["state"] == "failed", shown
    assert shown["response"]["status"] == 500
    assert shown["response"]["body"]["detail"] == "The export could not be made; start a new one."
    assert replayed == "500 true"


def page_session(page: str) -> list[Exchange | float]:
    """The ``example-session`` block of ``page``: each ``$ curl`` with what it prints."""
    lines = (DOCS / page).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(".. example-session:"))
    end = start + 2
    while end < len(lines) and (not lines[end].strip() or lines[end].startswith("    ")):
        end += 1
    return console_session(lines[start:end])


@pytest.mark.celery
def test_the_outbox_session_prints_what_the_page_says(project: Path, tmp_path: Path) -> None:
    """The page's curl session against its project under ``runserver``, with a worker: the
    answers the page shows (a request without a key included: ``201``, never a ``500``), and
    one receipt per order."""
    if shutil.which("curl") is None:
        pytest.skip("needs curl, which the session runs")
    session = page_session("outbox.rst")
    assert len(session) == 3
    own = Scratch(project, tmp_path, "rabbitmq")
    port = free_port()
    log = (tmp_path / "runserver.log").open("wb")
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=project,
        env=own.env(),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    url = f"http://127.0.0.1:{port}"
    try:
        own.worker("consumer", 2)
        own.wait_for(lambda: _answers(url), "runserver", 60)
        for step in session:
            assert isinstance(step, Exchange)
            observed = run_curl(step.command, url)
            where = f"docs/outbox.rst: {step.command}"
            assert same_status(step.status, observed.status), (where, observed.status)
            shown = {k: v for k, v in observed.headers.items() if k not in SAYS_NOTHING}
            assert shown == step.headers, (where, shown)
            assert observed.body == step.body, (where, observed.body)
        # operations.rst's view requires the key: a clear 400 before it runs, never a 500.
        refused = httpx.post(url + "/exports/", timeout=30)
        assert refused.status_code == 400, refused.text
        assert refused.json()["type"].endswith("missing-idempotency-key")
        own.wait_for(
            lambda: len(own.rows("SELECT order_id FROM orders_receipt")) >= 2, "the receipts"
        )
        own.wait_for(lambda: len(own.succeeded()) >= 2, "the tasks to end")
    finally:
        server.terminate()
        server.wait(timeout=30)
        own.close()
    assert sorted(own.rows("SELECT order_id FROM orders_receipt")) == [(1,), (2,)]
    # The keyed order's receipt went through the outbox; the keyless one's was sent directly.
    assert own.rows("SELECT state FROM django_idempotency_outboxmessage") == [("sent",)]


#: The headers the page leaves out: those of the example project's session, and
#: ``X-Frame-Options``, which startproject's middleware adds.
SAYS_NOTHING = TRIMMED | {"x-frame-options"}


def _answers(url: str) -> bool:
    try:
        httpx.get(url + "/admin/login/", timeout=2)
    except httpx.TransportError:
        return False
    return True
