"""Run a generated workload under a generated nemesis against real servers; check the history.

    python tests/verification/run.py --seconds N --seed S [--database sqlite|postgresql|mariadb]
        [--store database|redis] [--plant NAME] [--history PATH] [--failover sync|async]
        [--scenes NAME,...]

From the repository root. It starts servers of its own (a PostgreSQL cluster or a MariaDB
server behind a fault proxy, or a SQLite file; a ``redis-server`` for the Redis store; gunicorn
with threaded workers serving :mod:`tests.verification.views`) on ports of
``IDEMPOTENCY_FAULT_PORTS`` (default ``26400-26459``), prints its progress on stderr, writes the
history as JSON lines and prints, as its last line on stdout, one JSON object: ``seed``,
``histories``, ``requests``, ``faults`` (counts by kind), ``windows``, ``violations`` (each
with its invariant and the smallest history that shows it). Exit status 1 on a violation.

With ``--failover sync|async`` (PostgreSQL) the cluster has a streaming standby, synchronous or
not, and the nemesis fails the primary over to it (``db-failover``): the primary SIGKILLed,
the standby promoted, the proxy pointed at it, a fresh standby made of it. The summary says
the mode (``failover``) and how many violations had a failover in their time
(``violations_at_failover``: asynchronous replication's losses).

The workload and the nemesis's schedule are generated from the seed with ``random.Random``
(not Hypothesis: the servers' interleavings are not the generator's to replay, so shrinking is a
pass over the recorded history, :func:`checker.shrink`): the same seed runs the same schedule.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import importlib.metadata
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("IDEMPOTENCY_FAULT_PORTS", "26400-26459")

import httpx  # noqa: E402

from tests.faults import databases  # noqa: E402
from tests.faults.app import migrate  # noqa: E402
from tests.faults.proxy import FaultProxy  # noqa: E402
from tests.faults.redis_server import RedisServer  # noqa: E402
from tests.servers import harness  # noqa: E402
from tests.verification import checker, witness  # noqa: E402
from tests.verification.ledger import deliveries, newest, read_lines  # noqa: E402
from tests.verification.limits import (  # noqa: E402
    CONSUMER_WORK,
    DRAIN,
    LOCK,
    SETTLE,
    SLOW,
    TTLS,
    password,
)
from tests.verification.plants import PLANTS  # noqa: E402

PRINCIPALS = ("alice", "bob", "anonymous")
#: DRF entry points authenticate by token or by Basic authentication (every other client of a
#: story, :meth:`Run.headers`), ninja's by API key (the same token), the others by session;
#: ninja's operation has no anonymous caller.
DRF_ENTRIES = ("mixin", "function", "function-policy")
WORKERS = 3
THREADS = 8
#: ``connect_timeout`` of tests/faults/settings.py, which the servers' settings extend.
CONNECT_TIMEOUT = 3.0
#: How long a ``consumer-kill`` waits for the Celery worker to be ready (a worker killed while
#: it still imports tests nothing), then for a task working after its effect, before its
#: result (its note younger than :data:`CONSUMER_WORK`).
CONSUMER_READY_WAIT, CONSUMER_KILL_WAIT = 60.0, 4.0
#: Faults with no length.
INSTANT = ("worker-kill", "db-cut", "db-terminate", "relay-kill", "consumer-kill")
#: The outbox's broker (RabbitMQ), shared: each run has a queue of its own, deleted after.
AMQP_URL = os.environ.get("IDEMPOTENCY_VERIFY_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
#: Statuses a client answers by trying again: in progress (``409``, or ``202`` from a view
#: with ``in_progress="accepted"``), unavailable, no answer at all.
RETRY = {202, 409, 503, None}
#: Whom each principal's operations are polled by besides their own (who must get ``404``).
OTHER = {"alice": "bob", "bob": "alice", "anonymous": "alice"}


def log(message: str) -> None:
    print(f"[verify {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# The schedule -----------------------------------------------------------------------------


@dataclass
class Story:
    """``clients`` clients sending one request (``body`` to ``entry`` under ``key`` as
    ``principal``) at ``start``, each until it has a final answer; the first then sends it
    again ``followups`` seconds after its answer."""

    number: int
    start: float
    entry: str
    principal: str
    key: str
    body: bytes
    clients: int
    followups: list[float]
    #: How a DRF entry point's clients authenticate: ``"token"`` or ``"basic"`` for all of
    #: them; ``""``: every other client by Basic authentication, the others by token.
    auth: str = ""
    #: The scene it is part of (:data:`SCENES`); ``""``: the seed's own.
    scene: str = ""


@dataclass
class Fault:
    at: float
    kind: str
    duration: float
    choice: int  # which worker, among the living, sorted by pid
    #: A scene's fault: the worker running this key's view, whichever it is.
    key: str | None = None
    scene: str = ""
    #: A ``consumer-kill``: seconds the Celery worker it kills has been ready before it.
    after_ready: float = 0.0


#: The scenes every run opens with, whatever its seed (keys and numbers from it): each plant's
#: trigger, so that a plant is found from any seed, not only from one whose draws happen to
#: build it (the random workload after them may build them again). ``FENCE_AT``'s view is
#: stopped for ``FENCE_STOP`` seconds ``FENCE_STOP_AFTER`` after it starts, by a nemesis of the
#: scenes' own.
RENEWAL_AT, SCOPE_AT, SCOPE_AGAIN_AT, SHORT_TTL_AT, FAIL_AT, FENCE_AT = 0.3, 0.5, 2.5, 0.7, 0.9, 7.0
ACCEPTED_AT, EXPORT_AT, STEPS_FAIL_AT = 1.1, 1.3, 1.5
#: The recovery point's kill: a ``/steps/`` view working ``STEPS_WORK`` s after its point, its
#: worker SIGKILLed once the point is saved (``STEPS_KILL_AFTER`` s after it starts at the
#: earliest), after the renewal scene's answers and before the fencing scene.
STEPS_KILL_AT, STEPS_WORK, STEPS_KILL_AFTER = 5.0, 2.0, 0.5
#: The renewal scene's duplicates come once its lock would have lapsed without renewal, so that
#: they never wait behind it for a thread (a crowd may hold the workers' threads at first).
RENEWAL_AGAIN_AT = RENEWAL_AT + LOCK + 0.3
FENCE_WORK, FENCE_STOP_AFTER, FENCE_STOP = 1.5, 0.6, 6.0
#: On SQLite a stopped worker excuses every owner (it may hold the only write lock): the
#: random nemesis starts, and the fencing scene's stop, once the renewal scene's view would
#: have been taken over (its lock lapsed, without renewal) and run again, with time to spare
#: on a loaded machine.
SQLITE_NEMESIS_FROM = FENCE_AT
#: Seconds the standby's stream takes to reach it with ``--failover`` (the distance between
#: two machines in one region; on one machine it is none, and an asynchronous standby is
#: never behind when its primary dies): each commit waits that long more with ``sync``; with
#: ``async`` the commits of the last ``REPLICATION_LAG`` before a failover may be lost.
REPLICATION_LAG = 0.05
DATABASE_FAULTS = ("db-blackhole", "db-cut", "db-restart", "db-read-only", "db-terminate")
#: The scenes, by name (``--scenes``: a plant's run may play only its trigger's, and be over
#: sooner; the fencing scene's stop and follow-up take a run to 23 s).
SCENES = ("renewal", "scope", "short-ttl", "fence", "outbox-fail", "accepted", "export", "steps")


def _body(rng: random.Random, entry: str) -> bytes:
    # Its first attempt answers 503: the outbox's before it keeps anything, /steps/'s after its
    # recovery point.
    fail = entry in ("outbox", "steps") and rng.random() < 0.4
    roll = rng.random()
    if entry == "export":  # its work is the consumer's task's
        work = 0.0
    elif roll < 0.65 or entry in ("short-ttl", "atomic"):
        # An atomic view holds its transaction while it works: SQLite's only writer.
        work = rng.uniform(0, 0.2)
    elif roll < 0.82:
        work = rng.uniform(0.5, 1.5)
    else:  # longer than the lock: only renewal keeps it
        work = LOCK + 1.5
    body: dict[str, Any] = {"n": rng.randrange(10**6), "work": round(work, 2)}
    if fail:
        body["fail"] = 1
    return json.dumps(body, separators=(",", ":")).encode()


def _scenes(seed: int, store: str) -> tuple[list[Story], list[Fault]]:
    """The opening of every run: a view working past its lock and its duplicates once the
    lock would have lapsed without renewal (found by ``no-renewal`` and ``early-takeover``),
    one key sent by two principals, the second by Basic authentication (``shared-scope``), a
    short TTL's retry past it (``no-expiry-check``); a ``/steps/`` body failing once after
    its recovery point, whose retry resumes from it, and one whose worker is SIGKILLed after
    its point, whose takeover resumes from it (``resume-from-start``); an outbox body that
    fails once (``release-on-failure``), four clients of a view answering duplicates ``202``,
    whose operation another principal polls
    (``operation-any-reader``), and two of an ``/export/`` whose operation the consumer's
    task completes (``completion-dropped``); and a view whose worker is stopped longer than
    its lock, so that a duplicate takes the record over, answers and is replayed before the
    late owner resumes and writes (``no-fencing``: its write must be fenced off, and the
    replays after it must not change). The fencing scene's first client asks again once the
    late owner has written."""
    rng = random.Random(f"scenes-{seed}")

    def story(at: float, entry: str, principal: str, work: float, clients: int,
              followups: list[float], fail: bool = False, key: str | None = None,
              body: bytes | None = None, auth: str = "", scene: str = "") -> Story:  # fmt: skip
        key = key or str(uuid.UUID(int=rng.getrandbits(128), version=4))
        if body is None:
            given: dict[str, Any] = {"n": rng.randrange(10**6), "work": work}
            body = json.dumps(given | ({"fail": 1} if fail else {}),
                              separators=(",", ":")).encode()  # fmt: skip
        return Story(0, at, entry, principal, key, body, clients, followups, auth, scene)

    scope = story(SCOPE_AT, "mixin", "alice", 0.1, 1, [], auth="token", scene="scope")
    # Bob sends it by Basic authentication: another principal kind.
    again = story(SCOPE_AGAIN_AT, "mixin", "bob", 0.1, 1, [], key=scope.key, body=scope.body,
                  auth="basic", scene="scope")  # fmt: skip
    fence = story(FENCE_AT, "plain", "anonymous", FENCE_WORK, 6,
                  [1.0, FENCE_STOP + FENCE_WORK], scene="fence")  # fmt: skip
    renewal = story(RENEWAL_AT, "function", "bob", LOCK + 1.5, 1, [0.5], scene="renewal")
    duplicates = story(RENEWAL_AGAIN_AT, "function", "bob", 0, 2, [], key=renewal.key,
                       body=renewal.body, scene="renewal")  # fmt: skip
    short = story(SHORT_TTL_AT, "short-ttl", "alice", 0.1, 1, [TTLS["short-ttl"] + 2.5],
                  scene="short-ttl")  # fmt: skip
    stories = [renewal, duplicates, scope, short, again, fence]
    # Every store's: the outbox and in_progress="accepted" (the Redis store's too).
    stories.append(story(FAIL_AT, "outbox", "alice", 0.1, 1, [0.5], fail=True,
                         scene="outbox-fail"))  # fmt: skip
    stories.append(story(ACCEPTED_AT, "accepted", "alice", 1.0, 4, [], scene="accepted"))
    # The scenes below draw after the others, which keep each seed's keys and numbers.
    stories.append(story(STEPS_FAIL_AT, "steps", "alice", 0.1, 1, [0.5], fail=True,
                         scene="steps"))  # fmt: skip
    killed = story(STEPS_KILL_AT, "steps", "bob", STEPS_WORK, 1, [0.5], scene="steps")
    stories.append(killed)
    stories.append(story(EXPORT_AT, "export", "bob", 0, 2, [0.5], scene="export"))
    kill = Fault(STEPS_KILL_AT + STEPS_KILL_AFTER, "worker-kill", 0.0, 0, key=killed.key,
                 scene="steps")  # fmt: skip
    stop = Fault(FENCE_AT + FENCE_STOP_AFTER, "worker-stop", FENCE_STOP, 0, key=fence.key,
                 scene="fence")  # fmt: skip
    return sorted(stories, key=lambda s: s.start), [kill, stop]


def generate(
    seed: int, seconds: float, store: str, database: str, failover: str = "",
    scenes: frozenset[str] = frozenset(SCENES),
) -> tuple[list[Story], list[Fault], list[Fault]]:  # fmt: skip
    """The stories (the scenes', then the seed's), the scenes' faults and the seed's faults.
    With ``failover`` (PostgreSQL only), ``db-failover`` is one more of the database's kinds:
    without it a seed's schedule is what it always was. Only the ``scenes`` named are played
    (each seed's stories are drawn as with all of them: a story of the seed's that reuses a
    scene's key keeps it)."""
    rng = random.Random(seed)
    entries = ["mixin", "function", "function-policy", "plain", "async", "ninja", "call",
               "short-ttl"]  # fmt: skip
    # Atomic mode is the database store's alone (its list, so its seeds' draws, as they were).
    entries += ["atomic", "outbox", "accepted"] if store == "database" else ["outbox", "accepted"]
    stories, scene_faults = _scenes(seed, store)
    t = 0.0
    while True:
        t += rng.expovariate(2.0)  # two new stories a second
        if t >= seconds:
            break
        earlier = rng.choice(stories) if stories and rng.random() < 0.35 else None
        # Now and then a crowd: 16 or 32 clients at once under one key.
        clients = rng.choice((16, 32)) if rng.random() < 0.04 else rng.choice((1, 1, 1, 2, 3, 4, 8))
        followups = sorted(rng.uniform(0.2, 3) for _ in range(rng.choice((0, 1, 1, 2))))
        if earlier is None:
            entry = rng.choice(entries)
            principal = rng.choice(PRINCIPALS)
            key = str(uuid.UUID(int=rng.getrandbits(128), version=4))
            body = _body(rng, entry)
        else:
            entry, principal, key, body = (
                earlier.entry,
                earlier.principal,
                earlier.key,
                earlier.body,
            )
            variant = rng.choice(("changed", "changed", "other-principal", "same"))
            if variant == "changed":
                body = _body(rng, entry)
            elif variant == "other-principal":
                principal = rng.choice([p for p in PRINCIPALS if p != principal])
        if entry == "ninja" and principal == "anonymous":
            principal = rng.choice(PRINCIPALS[:2])
        if json.loads(body)["work"] > LOCK:  # duplicates while it works past its first lock
            clients = max(clients, 2)
        if entry == "short-ttl":  # one retry past the TTL: a new life, never a replay
            followups.append(TTLS[entry] + 2.5)
        stories.append(Story(0, round(t, 3), entry, principal, key, body, clients,
                             followups))  # fmt: skip
    stories += _more(seed, seconds, store)
    stories = [each for each in stories if not each.scene or each.scene in scenes]
    scene_faults = [fault for fault in scene_faults if fault.scene in scenes]
    stories.sort(key=lambda each: each.start)
    for number, each in enumerate(stories):
        each.number = number
    kinds = ["worker-kill", "worker-stop", "worker-stop", "worker-stop"]
    if store == "redis":
        kinds += ["redis-stop", "redis-stop", "redis-kill"]
    kinds.append("relay-kill")
    opening = DATABASE_FAULTS + (("db-failover",) if failover else ())
    if database != "sqlite":
        kinds += ["db-blackhole", *opening]
    # The nemesis has its own generator: a workload widened keeps each seed's schedule.
    rng = random.Random(f"nemesis-{seed}")
    # A server's run opens with one fault of each of the database's kinds, in the seed's
    # order, one of them longer than the lock: a short run meets every kind.
    first = rng.sample(opening, len(opening)) if database != "sqlite" else []
    long_one = rng.choice([k for k in first if k not in INSTANT]) if first else None
    faults: list[Fault] = []
    t = 1.0 if first else SQLITE_NEMESIS_FROM
    while True:
        t += rng.uniform(0.5, 1.5) if first else rng.uniform(0.5, 2.5)
        opening = bool(first)
        kind = first.pop(0) if opening else rng.choice(kinds)
        # Shorter than the remaining lock (two thirds of it, renewed), or longer than the lock.
        long = kind == long_one if opening else rng.random() >= 0.5
        duration = rng.uniform(LOCK + 0.5, LOCK + 4) if long else rng.uniform(0.3, 1.2)
        if kind in INSTANT:
            duration = 0.0
        if t + duration >= seconds:
            break
        faults.append(Fault(round(t, 3), kind, round(duration, 3), rng.randrange(1000)))
        t += duration
    return stories, scene_faults, faults


def _more(seed: int, seconds: float, store: str) -> list[Story]:
    """The stories of ``/steps/`` (a recovery point between two effects) and ``/export/`` (an
    operation the consumer's task completes), on every store: one every 3 s, a quarter of them
    reusing an earlier one's key as the others do, from a generator of their own, so that each
    seed's other stories are what they were."""
    rng = random.Random(f"more-{seed}")
    entries = ["steps", "export"]
    stories: list[Story] = []
    t = 0.0
    while True:
        t += rng.expovariate(1 / 3)
        if t >= seconds:
            return stories
        clients = rng.choice((1, 1, 2, 3, 4))
        followups = sorted(rng.uniform(0.2, 3) for _ in range(rng.choice((0, 1, 1, 2))))
        if stories and rng.random() < 0.25:
            earlier = rng.choice(stories)
            entry, principal, key = earlier.entry, earlier.principal, earlier.key
            body = earlier.body
            variant = rng.choice(("changed", "other-principal", "same"))
            if variant == "changed":
                body = _body(rng, entry)
            elif variant == "other-principal":
                principal = rng.choice([p for p in PRINCIPALS if p != principal])
        else:
            entry = rng.choice(entries)
            principal = rng.choice(PRINCIPALS)
            key = str(uuid.UUID(int=rng.getrandbits(128), version=4))
            body = _body(rng, entry)
        if json.loads(body)["work"] > LOCK:  # duplicates while it works past its first lock
            clients = max(clients, 2)
        stories.append(Story(0, round(t, 3), entry, principal, key, body, clients, followups))


def consumer_faults(seed: int, seconds: float, store: str) -> list[Fault]:
    """The Celery worker's SIGKILLs (``consumer-kill``), on every store: each once the worker
    has been ready 4 to 12 s (``after_ready``), from a generator of their own, so that the
    other schedules of a seed stay what they were; then (at most
    :data:`CONSUMER_KILL_WAIT` s) once a task is between its effect and its result.

    Counted from the worker's readiness, not from the last kill: a worker takes seconds to
    start on a loaded machine, and a kill every 4 to 12 s from the last one left it ready for
    about a second each time once its start took as long (a soak's load), so that it consumed
    fewer messages than the run staged and the backlog grew for the whole run."""
    rng = random.Random(f"consumer-{seed}")
    faults = []
    t = 0.0
    while True:
        gap = rng.uniform(4, 12)
        t += gap
        if t >= seconds:
            return faults
        faults.append(Fault(round(t, 3), "consumer-kill", 0.0, rng.randrange(1000),
                            after_ready=round(gap, 3)))  # fmt: skip


# The servers ------------------------------------------------------------------------------


def _migrated_sqlite(path: Path) -> None:
    """A SQLite file with the tables made: a copy of one migrated before, kept in the temporary
    directory under the hash of every migration's source and the packages' versions (a
    migration costs a Django process seconds; most runs are on SQLite)."""
    digest = hashlib.sha256()
    for package in ("django", "djangorestframework"):
        digest.update(importlib.metadata.version(package).encode())
    for source in sorted(ROOT.glob("django_idempotency/migrations/*.py")) + sorted(
        ROOT.glob("tests/*/migrations/*.py")
    ):
        digest.update(source.name.encode() + source.read_bytes())
    template = Path(tempfile.gettempdir()) / f"idem-verify-{digest.hexdigest()[:16]}.sqlite3"
    if not template.exists():
        fresh = template.with_name(f"{template.name}.{os.getpid()}")
        migrate(f"sqlite:///{fresh}")
        os.replace(fresh, template)  # whole, even with two runs migrating at once
    shutil.copyfile(template, path)


@dataclass
class Servers:
    database: str
    store: str
    plant: str
    #: ``"sync"`` or ``"async"``: the PostgreSQL primary has a streaming standby to fail over to.
    failover: str = ""
    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="idem-verify-")))
    server: Any = None
    proxy: FaultProxy | None = None
    #: With ``failover``, the standby's stream passes it: :data:`REPLICATION_LAG`.
    distance: FaultProxy | None = None
    redis: RedisServer | None = None
    gunicorn: harness.Server | None = None
    #: The outbox's relay (``manage.py idempotency_relay``) and consumer (a Celery worker, in a
    #: session of its own: its process group is its pool too); on the Redis store the relay
    #: serves the store's outbox (``--store``).
    helpers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    #: When each helper was started (a ready note of the consumer is its own only if later:
    #: the kernel's pids wrap within a long run, and a new worker may get a dead one's pid).
    started: dict[str, float] = field(default_factory=dict)
    #: The Celery queue of this run on the shared RabbitMQ (and the exchange of that name).
    queue: str = field(default_factory=lambda: f"idem-verify-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    env: dict[str, str] = field(default_factory=dict)

    def start(self) -> None:
        if self.database == "sqlite":
            self.server = databases.SQLiteFile()
            url = self.server.url()
            _migrated_sqlite(self.server.path)
        else:
            self.server = (
                databases.PostgresCluster()
                if self.database == "postgresql"
                else databases.MariaDBServer()
            )
            if self.failover:
                self.distance = FaultProxy(databases.free_port(), self.server.port,
                                           lag=REPLICATION_LAG).start()  # fmt: skip
                self.server.via = self.distance.port
                self.server.create(replication=self.failover)
            else:
                self.server.create()
            self.proxy = FaultProxy(databases.free_port(), self.server.port).start()
            url = self.server.url(port=self.proxy.port)
            migrate(self.server.url())
        env = dict(os.environ)
        env.update(
            DJANGO_SETTINGS_MODULE="tests.verification.settings",
            DATABASE_URL=url,
            IDEMPOTENCY_FAULT_DIR=str(self.folder),
            IDEMPOTENCY_VERIFY_LEDGER=str(self.folder),
            IDEMPOTENCY_VERIFY_PLANT=self.plant,
            IDEMPOTENCY_VERIFY_QUEUE=self.queue,
            IDEMPOTENCY_VERIFY_AMQP_URL=AMQP_URL,
            PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
            PYTHONUNBUFFERED="1",
        )
        env.pop("IDEMPOTENCY_TEST_DB", None)
        if self.store == "redis":
            self.redis = RedisServer()
            self.redis.start()
            env["IDEMPOTENCY_VERIFY_REDIS_URL"] = self.redis.url()
        port = databases.free_port()
        command = [
            sys.executable, "-m", "gunicorn",
            "--workers", str(WORKERS), "--threads", str(THREADS), "--worker-class", "gthread",
            "--worker-connections", str(THREADS), "--preload", "--bind", f"127.0.0.1:{port}",
            "--backlog", "256", "--timeout", "120", "--graceful-timeout", "2",
            "--log-level", "info", "--error-logfile", "-", *harness._no_control_socket(),
            "django.core.wsgi:get_wsgi_application()",
        ]  # fmt: skip
        self.gunicorn = harness.Server("gunicorn", command, port, env, WORKERS)
        self.gunicorn.start()
        assert self.gunicorn.process is not None
        databases.track(self.gunicorn.process.pid, "gunicorn")
        self.env = env
        self.start_helper("relay")
        self.start_helper("consumer")

    def start_helper(self, name: str) -> None:
        """The relay or the consumer (a Celery worker of two pool processes taking only the
        run's queue), logging to a file of the run's folder."""
        command = {
            # On the Redis store the relay serves the store's outbox (``--store``: its URL).
            "relay": [sys.executable, "-m", "django", "idempotency_relay", "--interval", "0.5",
                      *(["--store", self.env["IDEMPOTENCY_VERIFY_REDIS_URL"]]
                        if self.store == "redis" else [])],
            "consumer": [
                sys.executable, "-m", "celery", "--app=tests.verification.consumer", "worker",
                "--pool=prefork", "--concurrency=2", f"--queues={self.queue}",
                f"--hostname={self.queue}@%h", "--loglevel=INFO", "--without-gossip",
                "--without-mingle", "--without-heartbeat",
            ],
        }[name]  # fmt: skip
        if name == "consumer" and os.environ.get("IDEMPOTENCY_VERIFY_CONSUMER_NICE"):
            # The consumer alone starved of CPU, as every process is under a soak's load.
            command = ["nice", "-n", os.environ["IDEMPOTENCY_VERIFY_CONSUMER_NICE"], *command]
        with (self.folder / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(command, cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL,
                                       stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=name == "consumer")  # fmt: skip
        databases.track(process.pid, name)
        self.helpers[name] = process
        self.started[name] = time.time()

    def kill_helper(self, name: str) -> None:
        """SIGKILL the relay, or the consumer's whole process group (its worker and pool)."""
        process = self.helpers[name]
        with contextlib.suppress(ProcessLookupError):
            if name == "consumer":
                os.killpg(process.pid, signal.SIGKILL)
            else:
                os.kill(process.pid, signal.SIGKILL)
        process.wait()
        databases.untrack(process.pid)

    def queued(self) -> int | None:
        """Messages ready in the run's queue (``None``: not known, the queue not declared
        yet)."""
        from kombu import Connection

        try:
            with Connection(AMQP_URL, connect_timeout=10) as connection:
                connection.ensure_connection(max_retries=1)  # a broker gone: no retry for ever
                _, count, _ = connection.default_channel.queue_declare(self.queue, passive=True)
        except Exception:
            return None
        return int(count)

    def remove_queue(self) -> None:
        """The run's queue and its exchange gone from the shared broker."""
        from kombu import Connection

        try:
            with Connection(AMQP_URL, connect_timeout=10) as connection:
                connection.ensure_connection(max_retries=1)
                channel = connection.default_channel
                channel.queue_delete(self.queue)
                channel.exchange_delete(self.queue)
        except Exception as exc:  # the run's result stands; the leftover is named
            log(f"queue {self.queue} not removed: {exc!r}")

    def fail_over(self, pause: float) -> tuple[float, int]:
        """The primary killed, its standby promoted ``pause`` seconds later and the proxy
        pointed at it, a fresh standby made of it (:meth:`PostgresCluster.fail_over`): when
        the new primary was promoted and pointed at, and the bytes of flushed WAL the standby
        lacked."""
        assert self.proxy is not None
        proxy, distance = self.proxy, self.distance
        assert distance is not None

        def repoint(port: int) -> None:
            proxy.repoint(port)
            distance.repoint(port)
            distance.admit()

        began = time.time()
        # The primary's machine and its link gone at once: the stream's bytes on their way
        # (REPLICATION_LAG's) never reach the standby.
        self.server, promoted, behind = self.server.fail_over(pause, repoint, distance.refuse)
        log(f"failover: promoted in {promoted - began:.1f}s ({behind} bytes of WAL behind), "
            f"a new standby streaming {time.time() - promoted:.1f}s later")  # fmt: skip
        return float(promoted), int(behind)

    @property
    def url(self) -> str:
        assert self.gunicorn is not None
        return self.gunicorn.url

    def workers(self) -> list[int]:
        """gunicorn's live workers: the pids it booted that are still its children. Alive is
        not enough: a run forks thousands of processes (database sessions, relays, re-forked
        workers) and the kernel's pids wrap (32768 here) within minutes, so a dead worker's
        pid soon names another process, which a worker fault would have SIGKILLed."""
        assert self.gunicorn is not None and self.gunicorn.process is not None
        master = self.gunicorn.process.pid
        return sorted(pid for pid in self.gunicorn.worker_pids() if _parent(pid) == master)

    def busy(self) -> int | None:
        """The worker of an effect whose view is still working (the ledgers' last lines),
        the one with the most work left."""
        best: tuple[float, int] | None = None
        now = time.time()
        for path in self.folder.glob("effects-*.jsonl"):
            with path.open("rb") as ledger:
                ledger.seek(max(0, path.stat().st_size - 4096))
                lines = ledger.read().splitlines()[-THREADS:]
            for raw in lines:
                with contextlib.suppress(ValueError, KeyError):
                    line = json.loads(raw)
                    left = line["t"] + line["work"] - now
                    if left > 0 and (best is None or left > best[0]):
                        best = (left, line["pid"])
        return None if best is None else best[1]

    def ledger(self) -> list[dict[str, Any]]:
        effects = []
        for path in sorted(self.folder.glob("effects-*.jsonl")):
            effects += [json.loads(line) for line in path.read_text().splitlines() if line]
        return effects

    def stop(self, keep_log: Path | None = None) -> None:
        for name in self.helpers:
            # At once, as gunicorn below: the outbox was drained, and a relay ends its pass
            # before it heeds a SIGTERM.
            self.kill_helper(name)
            if keep_log is not None:
                with keep_log.with_suffix(f".{name}.log").open("wb") as out:
                    out.write((self.folder / f"{name}.log").read_bytes())
        if self.gunicorn is not None:
            for pid in self.workers():  # none left stopped
                os.kill(pid, signal.SIGCONT)
            # At once: the run has what it needs (a graceful stop costs its 2 s).
            if self.gunicorn.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.gunicorn.process.pid, signal.SIGKILL)
                self.gunicorn.process.wait()
                databases.untrack(self.gunicorn.process.pid)
            if keep_log is not None:
                shutil.copy(self.gunicorn.log_path, keep_log)
            self.gunicorn.discard_log()
        for proxy in (self.proxy, self.distance):
            if proxy is not None:
                proxy.stop()
        if self.helpers:
            self.remove_queue()
        if self.redis is not None:
            self.redis.destroy()
        if self.server is not None:
            self.server.destroy()
        shutil.rmtree(self.folder, ignore_errors=True)


def _parent(pid: int) -> int | None:
    """The parent of a live process ``pid`` (``None`` for one gone, a zombie, or a thread's
    id: a worker's thread has the master as its parent too)."""
    if databases.started_at(pid) is None:
        return None
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return None


# The run ----------------------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.ops = 0

    def add(self, event: dict[str, Any]) -> None:
        with self.lock:
            self.events.append(event)

    def op(self) -> str:
        with self.lock:
            self.ops += 1
            return f"op{self.ops}"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


class Run:
    def __init__(self, servers: Servers, stories: list[Story], faults: list[list[Fault]],
                 seconds: float, seed: int) -> None:  # fmt: skip
        self.servers = servers
        self.stories = stories
        #: Schedules run side by side (the scenes' and the seed's), each one fault at a time.
        self.faults = faults
        #: Workers stopped now: never chosen by the other schedule (its SIGCONT would end the
        #: stop early).
        self.held: set[int] = set()
        self.seconds = seconds
        self.seed = seed
        self.recorder = Recorder()
        self.credentials: dict[str, dict[str, str]] = {}
        self.start = 0.0
        self.healed = threading.Event()
        #: The operations' status URLs the ``202`` s gave, with the principal they were given to.
        self.operations: set[tuple[str, str]] = set()
        #: The operations whose answer was a ``2xx`` the view ran for (not a replay).
        self.fresh: set[str] = set()
        #: The requests (principal, key, body) a client gave up on (``unsettled``).
        self.unsettled: set[tuple[str, str, bytes]] = set()
        self.heal_time = float("inf")
        #: When the server last answered a pulse slowly (:meth:`pulse`).
        self.slow_until = 0.0
        self.pulsing = threading.Event()
        #: Faults the nemesis could not inflict (a failover whose standby did not come up).
        self.nemesis_errors: list[str] = []
        # One client for every thread: a client made per request costs the run's process (and
        # the fault proxy's threads in it) milliseconds of CPU each. No connection is kept:
        # each request its own, as before, so a killed worker costs only its own requests.
        self.http = httpx.Client(timeout=30, limits=httpx.Limits(max_keepalive_connections=0,
                                                                 max_connections=None))  # fmt: skip

    def log_in(self) -> None:
        for name in PRINCIPALS[:2]:
            response = httpx.get(f"{self.servers.url}/setup/", params={"user": name}, timeout=30)
            response.raise_for_status()
            self.credentials[name] = {
                "token": response.json()["token"],
                "cookie": "; ".join(f"{k}={v}" for k, v in response.cookies.items()),
            }

    @staticmethod
    def auth(story: Story, index: int) -> str:
        """How client ``index`` of ``story`` proves its principal: ``basic`` or ``token`` on
        a DRF entry point (every other client by Basic, unless the story says), else the
        entry point's one kind."""
        if story.principal not in PRINCIPALS[:2]:
            return "none"
        if story.entry in DRF_ENTRIES:
            return story.auth or ("basic" if (story.number + index) % 2 else "token")
        return "api-key" if story.entry == "ninja" else "session"

    def headers(self, story: Story, index: int = 0) -> dict[str, str]:
        headers = {"Idempotency-Key": story.key, "Content-Type": "application/json"}
        if story.principal in self.credentials:
            given = self.credentials[story.principal]
            if self.auth(story, index) == "basic":
                secret = f"{story.principal}:{password(story.principal)}".encode()
                headers["Authorization"] = f"Basic {base64.b64encode(secret).decode()}"
            elif story.entry in DRF_ENTRIES:
                headers["Authorization"] = f"Token {given['token']}"
            elif story.entry == "ninja":
                headers["X-API-Key"] = given["token"]
            else:
                headers["Cookie"] = given["cookie"]
        return headers

    def send(self, story: Story, index: int = 0) -> tuple[str, int | None]:
        """One request of client ``index``, recorded: its operation and final status
        (``None``: none yet)."""
        op = self.recorder.op()
        self.recorder.add({
            "type": "invoke", "op": op, "t": time.time(), "story": story.number,
            "principal": story.principal, "key": story.key, "entry": story.entry,
            "body": _digest(story.body), "auth": self.auth(story, index),
        })  # fmt: skip
        done: dict[str, Any] = {"type": "complete", "op": op, "status": None}
        try:
            response = self.http.post(f"{self.servers.url}/{story.entry}/", content=story.body,
                                      headers=self.headers(story, index))  # fmt: skip
        except httpx.HTTPError as exc:
            done["error"] = type(exc).__name__
        else:
            done.update(
                status=response.status_code,
                response=_digest(response.content),
                replayed=response.headers.get("Idempotent-Replayed") == "true",
            )
            if response.status_code == 202:  # a duplicate: the operation's status URL
                done["location"] = response.headers.get("Location")
            elif 200 <= response.status_code < 300:
                answer = response.json()
                done.update(execution=answer.get("execution"), **{"as": answer.get("principal")})
                if "first" in answer:  # /steps/: the first step its second built on
                    done["first"] = answer["first"]
        done["t"] = time.time()
        self.recorder.add(done)
        if "execution" in done and not done["replayed"]:
            self.fresh.add(op)
        if done.get("location"):
            self.operations.add((story.principal, done["location"]))
            self.poll(story.principal, done["location"])
        if done["status"] in RETRY:
            return op, None
        return op, int(done["status"])

    def poll(self, owner: str, location: str, *, final: bool = False) -> None:
        """GET an operation's status URL as its principal and as another (who must get
        ``404``), recorded as ``poll`` events; ``final``: once every key has settled."""
        for principal in (owner, OTHER[owner]):
            event: dict[str, Any] = {"type": "poll", "t": time.time(), "owner": owner,
                                     "principal": principal, "operation": location,
                                     "final": final, "status": None}  # fmt: skip
            given = self.credentials.get(principal)
            headers = {"Cookie": given["cookie"]} if given else {}
            try:
                response = self.http.get(str(httpx.URL(self.servers.url).join(location)),
                                         headers=headers)  # fmt: skip
            except httpx.HTTPError as exc:
                event["error"] = type(exc).__name__
            else:
                event["status"] = response.status_code
                if response.status_code == 200:
                    document = response.json()
                    event["state"] = document.get("state")
                    body = (document.get("response") or {}).get("body")
                    if isinstance(body, dict):
                        event["execution"] = body.get("execution")
            self.recorder.add(event)

    def until_final(self, story: Story, rng: random.Random, index: int = 0) -> bool:
        return self.final_answer(story, rng, index) is not None

    def final_answer(self, story: Story, rng: random.Random, index: int = 0) -> str | None:
        """Send ``story`` (as client ``index``) until it has a final answer: its operation
        (``None``: none came within the settling time, from its first send or the nemesis's
        healing, whichever came last). The time runs from the first send, not from each: a
        key answered ``409`` or ``202`` for good (a completion never stored) is unsettled, not
        a client retrying until the run is killed."""
        began = time.time()
        while True:
            op, status = self.send(story, index)
            if status is not None:
                return op
            deadline = max(self.heal_time, began, self.slow_until) + LOCK + SETTLE
            if time.time() > deadline:
                self.recorder.add({"type": "unsettled", "op": op, "t": time.time()})
                self.unsettled.add((story.principal, story.key, story.body))
                return None
            time.sleep(rng.uniform(0.2, 0.6))

    def probe(self, story: Story) -> None:
        """Once every key has settled, ``story`` once more: the answer its key keeps for good.
        Run anew (its record expired, or was left ``processing`` by a result write a fault
        lost, and taken over), it is sent again, so that a replay names what it kept (the
        checker's invariants 6 and 7 read the kept result from the replays)."""
        if (story.principal, story.key, story.body) in self.unsettled:
            return  # a client's settling time ran out already: another would too
        rng = random.Random(story.number)
        op = self.final_answer(story, rng)
        if op is not None and op in self.fresh:
            self.until_final(story, rng)

    def client(self, story: Story, index: int) -> None:
        rng = random.Random(f"{self.seed}-{story.number}-{index}")
        if not self.until_final(story, rng, index) or index:
            return
        for delay in story.followups:
            time.sleep(delay)
            if not self.until_final(story, rng, index):
                return

    def pulse(self) -> None:
        """A trivial request (``/health/``: no database, no key) once a second while the run
        goes: one answered in :data:`SLOW` seconds or more (or given up on as late) is the server
        overloaded (a load the machine made, no nemesis), an observed ``server-slow`` fault.
        It excuses a request left unanswered in its time, and the clients' settling time
        counts from its end, as from the nemesis's healing; it excuses no double run."""
        while self.pulsing.is_set():
            sent = time.time()
            with contextlib.suppress(httpx.HTTPError):
                self.http.get(f"{self.servers.url}/health/")
            answered = time.time()
            if answered - sent >= SLOW:
                self.slow_until = max(self.slow_until, answered)
                self.recorder.add({"type": "fault", "kind": "server-slow", "observed": True,
                                   "start": sent, "end": answered,
                                   "duration": answered - sent, "long": False})  # fmt: skip
            time.sleep(max(0.0, 1.0 - (answered - sent)))

    def nemesis(self) -> None:
        schedules = [threading.Thread(target=self.faults_run, args=(faults,), daemon=True)
                     for faults in self.faults]  # fmt: skip
        try:
            for schedule in schedules:
                schedule.start()
            for schedule in schedules:
                schedule.join()
            if "consumer" in self.servers.helpers:  # the last kill's worker is up again
                self.consumer_ready()
        finally:  # whatever happened, the clients' settling time counts from now
            self.heal_time = time.time()
            self.healed.set()

    def owner(self, key: str, *, at_point: bool = False) -> int | None:
        """The worker of ``key``'s view still working, once its effect is in a ledger (at
        most 10 s from now: a loaded machine, or a database fault, may start the view late);
        ``at_point``: once its ``/steps/`` recovery point is saved too (a kill before it would
        test a takeover from the start, not from the point: on a loaded machine the point's
        write came 0.5 s after the first step)."""
        deadline = time.time() + 10
        while time.time() < deadline:
            if at_point:
                for line in read_lines(self.servers.folder, "points-*.jsonl"):
                    if line["key"] == key and line["t"] + STEPS_WORK > time.time():
                        return int(line["pid"])
            else:
                for line in self.servers.ledger():
                    if line["key"] == key and line["t"] + line["work"] > time.time():
                        return int(line["pid"])
            time.sleep(0.05)
        return None

    def faults_run(self, faults: list[Fault]) -> None:
        for fault in faults:
            wait = self.start + fault.at - time.time()
            if wait > 0:
                time.sleep(wait)
            event: dict[str, Any] = {"type": "fault", "kind": fault.kind,
                                     "duration": fault.duration}  # fmt: skip
            # A connection made during the proxy's blackhole stays silent for good: an owner
            # that reconnects then waits for the connect timeout too (3 s, the fault settings').
            cost = fault.duration + (CONNECT_TIMEOUT if fault.kind == "db-blackhole" else 0)
            event["long"] = fault.kind == "worker-kill" or cost >= LOCK * 2 / 3
            event["start"] = time.time()
            try:
                if fault.kind.startswith("worker"):
                    workers = [pid for pid in self.servers.workers() if pid not in self.held]
                    if fault.key is not None:
                        owner = self.owner(fault.key, at_point=fault.scene == "steps")
                        workers = [owner] if owner in workers else []
                        event["start"] = time.time()
                    if not workers:
                        log(f"fault {fault.kind}: no worker to take")
                        continue
                    pid = workers[fault.choice % len(workers)]
                    busy = self.servers.busy()
                    if fault.key is None and fault.choice % 10 < 7 and busy in workers:
                        pid = busy  # mostly a worker mid-view
                    event["pid"] = pid
                    with contextlib.suppress(ProcessLookupError):  # it died meanwhile
                        if fault.kind == "worker-kill":
                            os.kill(pid, signal.SIGKILL)
                        else:
                            self.held.add(pid)
                            try:
                                os.kill(pid, signal.SIGSTOP)
                                time.sleep(fault.duration / 2)
                                event["waits"] = self.lock_waits()
                                time.sleep(fault.duration / 2)
                                os.kill(pid, signal.SIGCONT)
                            finally:
                                self.held.discard(pid)
                elif fault.kind == "db-blackhole":
                    assert self.servers.proxy is not None
                    self.servers.proxy.blackhole()
                    time.sleep(fault.duration)
                    self.servers.proxy.heal()
                elif fault.kind == "db-cut":
                    assert self.servers.proxy is not None
                    self.servers.proxy.cut_all()
                elif fault.kind == "db-terminate":  # the server ends every session of the app
                    self.servers.server.terminate_backends()
                elif fault.kind == "db-restart":  # down for the length, then started again
                    self.servers.server.stop_for(fault.duration)
                elif fault.kind == "db-failover":  # the primary killed, its standby promoted
                    event["mode"] = self.servers.failover
                    event["promoted"], event["behind"] = self.servers.fail_over(fault.duration)
                elif fault.kind == "db-read-only":
                    self.servers.server.read_only(True)
                    time.sleep(fault.duration)
                    self.servers.server.read_only(False)
                elif fault.kind in ("relay-kill", "consumer-kill"):
                    name = fault.kind.partition("-")[0]
                    if name == "consumer":  # a worker ready a while, mostly mid-task
                        busy = self.consumer_busy(fault.after_ready, self.start + self.seconds)
                        if busy is None:
                            # Its worker's start and work take it past the workload's end:
                            # the schedule ends with the run's time, not later.
                            log(f"consumer-kill at {fault.at}: not done, the run is over")
                            break
                        event["ready"], event["mid_task"] = busy
                    event["pid"] = self.servers.helpers[name].pid
                    self.servers.kill_helper(name)
                    self.servers.start_helper(name)  # a new one at once, as a supervisor would
                elif fault.kind == "redis-stop":
                    assert self.servers.redis is not None
                    self.servers.redis.freeze()
                    time.sleep(fault.duration)
                    self.servers.redis.thaw()
                elif fault.kind == "redis-kill":
                    assert self.servers.redis is not None
                    self.servers.redis.kill()
                    time.sleep(fault.duration)
                    self.servers.redis.start()
            except Exception as exc:  # the run goes on, and says so (nemesis_errors)
                event["error"] = repr(exc)
                self.nemesis_errors.append(f"{fault.kind} at {fault.at}: {exc!r}")
                log(f"fault {fault.kind} failed: {exc!r}")
            event["end"] = time.time()
            if fault.kind in ("db-restart", "db-read-only", "redis-kill"):  # a start takes time too
                event["long"] = event["end"] - event["start"] >= LOCK * 2 / 3
            if fault.kind == "db-failover" and "promoted" in event:
                # The app's fault ends once the new primary is pointed at; the new standby's
                # making, after, is the nemesis's own time (the next fault waits for it).
                event["standby"], event["end"] = event["end"], event["promoted"]
                event["long"] = event["end"] - event["start"] >= LOCK * 2 / 3
            self.recorder.add(event)
            log(f"fault {fault.kind} {fault.duration:.1f}s")

    def consumer_ready(self) -> float | None:
        """Wait (at most :data:`CONSUMER_READY_WAIT` s) for the Celery worker to be ready:
        when it was (``None``: not in that time)."""
        folder, pid = self.servers.folder, self.servers.helpers["consumer"].pid
        started = self.servers.started["consumer"]
        deadline = time.time() + CONSUMER_READY_WAIT
        notes = folder / "consumer-ready.jsonl"
        while True:
            for raw in notes.read_text().splitlines() if notes.exists() else []:
                with contextlib.suppress(ValueError):  # a line still being written
                    line = json.loads(raw)
                    if line["pid"] == pid and line["t"] >= started:
                        return float(line["t"])
            if time.time() > deadline:
                return None
            time.sleep(0.1)

    def consumer_busy(self, after_ready: float, until: float) -> tuple[bool, bool] | None:
        """Wait for the Celery worker to be ready (:meth:`consumer_ready`) and to have been
        ready ``after_ready`` s, then (at most :data:`CONSUMER_KILL_WAIT` s) for a task that
        noted its effect within the last :data:`CONSUMER_WORK` s: whether it was ready, and
        whether one did; ``None`` at once if that time ends at ``until`` or later (the run's
        end)."""
        folder = self.servers.folder
        ready = self.consumer_ready()
        if ready is None:
            return False, False
        if ready + after_ready >= until:
            return None
        time.sleep(max(0.0, ready + after_ready - time.time()))
        deadline = time.time() + CONSUMER_KILL_WAIT
        while time.time() - newest(folder, "working-*.jsonl") >= CONSUMER_WORK:
            if time.time() > deadline:
                return True, False
            time.sleep(0.05)
        return True, True

    def lock_waits(self) -> list[Any]:
        """MariaDB's transactions waiting for a lock and the ones they wait for, in the middle
        of a stopped worker's time (which statements a stopped process holds up)."""
        if self.servers.database != "mariadb":
            return []
        try:
            return [list(map(str, row)) for row in self.servers.server.execute(
                "SELECT r.trx_mysql_thread_id, r.trx_query, b.trx_mysql_thread_id, b.trx_query, "
                "b.trx_started FROM information_schema.INNODB_LOCK_WAITS w "
                "JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id "
                "JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id"
            )]  # fmt: skip
        except Exception as exc:  # a diagnosis only
            return [repr(exc)]

    def go(self) -> list[dict[str, Any]]:
        self.log_in()
        self.start = time.time()
        self.pulsing.set()
        threading.Thread(target=self.pulse, name="pulse", daemon=True).start()
        nemesis = threading.Thread(target=self.nemesis, name="nemesis", daemon=True)
        nemesis.start()
        clients = []
        for story in self.stories:
            wait = self.start + story.start - time.time()
            if wait > 0:
                time.sleep(wait)
            for index in range(story.clients):
                thread = threading.Thread(target=self.client, args=(story, index), daemon=True)
                thread.start()
                clients.append(thread)
        nemesis.join()
        log(f"healed; {len(clients)} clients settling")
        for thread in clients:
            thread.join()
        # Once all is settled, each request once more: the answer its key keeps for good (a
        # late owner's write that was not fenced off shows here, if no retry saw it before).
        probes = {(s.principal, s.key, s.body): s for s in self.stories if s.entry != "short-ttl"}
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(self.probe, probes.values()))
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda given: self.poll(*given, final=True), sorted(self.operations)))
        log(f"settled; every request sent once more, {len(self.operations)} operations polled")
        effects = self.servers.ledger()
        if "atomic" in {story.entry for story in self.stories}:
            response = httpx.get(f"{self.servers.url}/atomic-effects/", timeout=30)
            effects += response.json()["effects"]
        for effect in effects:
            self.recorder.add({"type": "effect", **effect})
        for point in read_lines(self.servers.folder, "points-*.jsonl"):
            self.recorder.add({"type": "point", **point})
        for fault in witness.observed(self.servers.folder, effects):
            self.recorder.add(fault)
        if self.servers.helpers:
            self.drain()
        self.pulsing.clear()
        return self.recorder.events

    def drain(self) -> None:
        """Wait until the outbox has nothing undelivered, the run's queue nothing ready, and
        the consumer has an effect for every message sent and every delivery (at most
        :data:`DRAIN` seconds), then record the deliveries and the effects. (A copy of a
        message consumed already, waiting for a retry's countdown in the worker, may start
        after: a replay, not recorded.)"""
        deadline = time.time() + DRAIN
        drained = False
        while True:
            reply = httpx.get(f"{self.servers.url}/outbox-state/", timeout=30)
            if reply.status_code != 200:  # the view's error, shown rather than a JSON error
                log(reply.text[:3000])
            state = reply.json()
            delivered = deliveries(self.servers.folder)
            consumed = {row["message"] for row in state["consumed"]}
            if (
                not any(state["undelivered"].values())
                and consumed >= set(state["sent"]) | {each["message"] for each in delivered}
                and self.servers.queued() == 0
            ):
                drained = True
                break
            if time.time() > deadline:
                log(f"outbox not drained after {DRAIN:g} s: undelivered "
                    f"{state['undelivered']}, queued {self.servers.queued()}")  # fmt: skip
                self.recorder.add({"type": "undrained", "t": time.time(),
                                   "undelivered": state["undelivered"]})  # fmt: skip
                break
            time.sleep(0.5)
        if drained:  # said once, and never after "not drained"
            log("outbox drained")
        for delivery in delivered:
            self.recorder.add({"type": "delivery", **delivery})
        for row in state["consumed"]:
            self.recorder.add({"type": "consumed", **row})


def said(violation: dict[str, Any]) -> str:
    """A reported violation on one line of stderr: its invariant, principal, key and what it
    saw (its first line, cut at 200 characters); the JSON keeps the whole of it."""
    what = str(violation.get("what", "")).strip().splitlines() or [""]
    summary = what[0] if len(what[0]) <= 200 else what[0][:199] + "…"
    return (
        f"violation of invariant {violation['invariant']}: principal "
        f"{violation['principal']}, key {violation['key']}: {summary}"
    )


def unreachable_broker() -> str | None:
    """Why the outbox's broker cannot be used now (``None``: it answers). Asked before the run:
    without it the relay's sends fail, the consumer waits for it for ever, and the run neither
    drained nor ended."""
    from kombu import Connection

    try:
        with Connection(AMQP_URL, connect_timeout=5) as connection:
            connection.ensure_connection(max_retries=1)
            where = connection.as_uri()  # its password masked
    except Exception as exc:
        return f"{Connection(AMQP_URL).as_uri()}: {type(exc).__name__}: {exc}"
    log(f"broker {where} answers")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--database", choices=("sqlite", "postgresql", "mariadb"), default="sqlite")
    parser.add_argument("--store", choices=("database", "redis"), default="database")
    parser.add_argument("--plant", choices=sorted(PLANTS), default="")
    parser.add_argument("--history", type=Path, help="where the JSON lines go")
    parser.add_argument(
        "--scenes",
        default=",".join(SCENES),
        help=f"the opening's scenes to play, by name: {','.join(SCENES)} (default: all)",
    )
    parser.add_argument(
        "--failover",
        choices=("sync", "async"),
        default="",
        help="PostgreSQL: a streaming standby, synchronous or not, and db-failover faults",
    )
    args = parser.parse_args(argv)
    if args.store == "redis" and args.database != "sqlite":
        parser.error("the Redis store keeps the app's own tables on SQLite: --database sqlite")
    if args.failover and args.database != "postgresql":
        parser.error("--failover promotes a PostgreSQL standby: --database postgresql")
    scenes = frozenset(filter(None, args.scenes.split(",")))
    if scenes - set(SCENES):
        parser.error(f"--scenes: no scene {', '.join(sorted(scenes - set(SCENES)))}")
    if broker := unreachable_broker():
        print(
            f"verification: the outbox's broker does not answer ({broker}); start RabbitMQ or "
            "set IDEMPOTENCY_VERIFY_AMQP_URL",
            file=sys.stderr,
        )
        return 1
    stories, scene_faults, faults = generate(
        args.seed, args.seconds, args.store, args.database, args.failover, scenes
    )
    consumer_kills = consumer_faults(args.seed, args.seconds, args.store)
    log(f"seed {args.seed}: {len(stories)} stories, "
        f"{len(faults) + len(scene_faults) + len(consumer_kills)} faults, "
        f"{args.database}/{args.store}{' plant ' + args.plant if args.plant else ''}"
        f"{' failover ' + args.failover if args.failover else ''}")  # fmt: skip
    history = args.history or Path(tempfile.gettempdir()) / (
        f"idempotency-verification-{args.seed}-{args.database}-{args.store}"
        f"{'-' + args.plant if args.plant else ''}"
        f"{'-failover-' + args.failover if args.failover else ''}.jsonl"
    )
    servers = Servers(args.database, args.store, args.plant, args.failover)
    began = time.monotonic()
    try:
        servers.start()
        log("servers up")
        run = Run(servers, stories, [scene_faults, faults, consumer_kills], args.seconds,
                  args.seed)  # fmt: skip
        events = run.go()
    finally:
        servers.stop(keep_log=history.with_suffix(".log"))
        log("servers stopped")
    with history.open("w") as out:
        for event in events:
            out.write(json.dumps(event) + "\n")
    limits = checker.Limits(
        lock=LOCK,
        ttl=TTLS,
        worker_faults_global=args.database == "sqlite" and args.store == "database",
    )
    result = checker.check(events, limits)
    log(f"checked: {len(result.violations)} violations")
    violations = []
    seen = set()
    # At most 10, one per invariant, principal and key; each invariant found among them (a
    # plant's run may break several, one of them many times).
    firsts = {violation["invariant"]: violation for violation in reversed(result.violations)}
    for violation in [*firsts.values(), *result.violations]:
        found = (violation["invariant"], violation["principal"], violation["key"])
        if found in seen or len(violations) >= 10:
            continue
        seen.add(found)
        violations.append({**violation, "history": checker.shrink(events, violation, limits)})
    for violation in violations:
        log(said(violation))
    if len(result.violations) > len(violations):
        log(f"... and {len(result.violations) - len(violations)} more (violations_total)")
    statuses = Counter(str(e["status"]) for e in events if e["type"] == "complete")
    basic = {e["op"] for e in events if e["type"] == "invoke" and e.get("auth") == "basic"}
    exports = {e["op"] for e in events if e["type"] == "invoke" and e["entry"] == "export"}
    given = {e["location"] for e in events if e.get("op") in exports and e.get("location")}
    # What the run exercised of the recovery points, the operations a task completes, the
    # outbox's consumer and Basic authentication (a clean run asserts each).
    exercised = {
        "basic_answered": sum(1 for e in events if e["type"] == "complete" and e["op"] in basic
                              and e["status"] is not None and 200 <= e["status"] < 300),
        "points_saved": sum(1 for e in events if e["type"] == "point"),
        "steps_resumed": sum(1 for e in events if e["type"] == "effect" and e.get("resumed")),
        "operations_completed": sum(1 for e in events if e["type"] == "poll" and e["final"]
                                    and e["operation"] in given and e["principal"] == e["owner"]
                                    and e.get("state") == "succeeded"),
        "messages_consumed": sum(1 for e in events if e["type"] == "consumed"),
    }  # fmt: skip
    summary = {
        "seed": args.seed,
        "seconds": args.seconds,
        "database": args.database,
        "store": args.store,
        "plant": args.plant or None,
        "failover": args.failover or None,
        "scenes": sorted(scenes),
        "histories": 1,
        "keys": len({(s.principal, s.key) for s in stories}),
        "requests": sum(1 for e in events if e["type"] == "invoke"),
        "entries": dict(
            sorted(Counter(e["entry"] for e in events if e["type"] == "invoke").items())
        ),
        "statuses": dict(sorted(statuses.items())),
        "effects": sum(1 for e in events if e["type"] == "effect"),
        "exercised": exercised,
        "faults": dict(sorted(Counter(e["kind"] for e in events if e["type"] == "fault").items())),
        "windows": result.windows,
        "violations": violations,
        "violations_total": len(result.violations),
        # Violations of the lost-write kinds (1, 2, 5) with a failover in their time: with
        # asynchronous replication, the acknowledged writes the promoted standby never had.
        "violations_at_failover": sum(1 for v in result.violations if v.get("failover")),
        "nemesis_errors": run.nemesis_errors,
        "history": str(history),
        "server_log": str(history.with_suffix(".log")),
        "wall_seconds": round(time.monotonic() - began, 1),
    }
    print(json.dumps(summary))
    return 1 if result.violations or run.nemesis_errors else 0


if __name__ == "__main__":
    sys.exit(main())
