"""Run a generated workload under a generated nemesis against real servers; check the history.

    python tests/verification/run.py --seconds N --seed S [--database sqlite|postgresql|mariadb]
        [--store database|redis] [--plant NAME] [--history PATH]

From the repository root. It starts servers of its own (a PostgreSQL cluster or a MariaDB
server behind a fault proxy, or a SQLite file; a ``redis-server`` for the Redis store; gunicorn
with threaded workers serving :mod:`tests.verification.views`) on ports of
``IDEMPOTENCY_FAULT_PORTS`` (default ``26200-26259``), prints its progress on stderr, writes the
history as JSON lines and prints, as its last line on stdout, one JSON object: ``seed``,
``histories``, ``requests``, ``faults`` (counts by kind), ``windows``, ``violations`` (each
with its invariant and the smallest history that shows it). Exit status 1 on a violation.

The workload and the nemesis's schedule are generated from the seed with ``random.Random``
(not Hypothesis: the servers' interleavings are not the generator's to replay, so shrinking is a
pass over the recorded history, :func:`checker.shrink`): the same seed runs the same schedule.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
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
os.environ.setdefault("IDEMPOTENCY_FAULT_PORTS", "26200-26259")

import httpx  # noqa: E402

from tests.faults import databases  # noqa: E402
from tests.faults.app import migrate  # noqa: E402
from tests.faults.proxy import FaultProxy  # noqa: E402
from tests.faults.redis_server import RedisServer  # noqa: E402
from tests.servers import harness  # noqa: E402
from tests.verification import checker  # noqa: E402
from tests.verification.consumer import deliveries  # noqa: E402
from tests.verification.limits import DRAIN, LOCK, SETTLE, TTLS  # noqa: E402
from tests.verification.plants import PLANTS  # noqa: E402

PRINCIPALS = ("alice", "bob", "anonymous")
#: DRF entry points authenticate by token, ninja's by API key (the same token), the others by
#: session; ninja's operation has no anonymous caller.
DRF_ENTRIES = ("mixin", "function", "function-policy")
WORKERS = 3
THREADS = 8
#: ``connect_timeout`` of tests/faults/settings.py, which the servers' settings extend.
CONNECT_TIMEOUT = 3.0
#: Faults with no length.
INSTANT = ("worker-kill", "db-cut", "db-terminate", "relay-kill")
#: Statuses a client answers by trying again: in progress, unavailable, no answer at all.
RETRY = {409, 503, None}


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


@dataclass
class Fault:
    at: float
    kind: str
    duration: float
    choice: int  # which worker, among the living, sorted by pid


def _body(rng: random.Random, entry: str) -> bytes:
    fail = entry == "outbox" and rng.random() < 0.4  # its first attempt answers 503
    roll = rng.random()
    if roll < 0.65 or entry in ("short-ttl", "atomic"):
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


def generate(
    seed: int, seconds: float, store: str, database: str
) -> tuple[list[Story], list[Fault]]:
    rng = random.Random(seed)
    entries = ["mixin", "function", "function-policy", "plain", "async", "ninja", "call",
               "short-ttl"]  # fmt: skip
    if store == "database":
        entries += ["atomic", "outbox"]
    stories: list[Story] = []
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
        stories.append(Story(len(stories), round(t, 3), entry, principal, key, body, clients,
                             followups))  # fmt: skip
    kinds = ["worker-kill", "worker-stop", "worker-stop", "worker-stop"]
    if store == "redis":
        kinds += ["redis-stop", "redis-stop", "redis-kill"]
    else:
        kinds.append("relay-kill")
    if database != "sqlite":
        kinds += ["db-blackhole", "db-blackhole", "db-cut", "db-restart", "db-read-only",
                  "db-terminate"]  # fmt: skip
    # The nemesis has its own generator: a workload widened keeps each seed's schedule.
    rng = random.Random(f"nemesis-{seed}")
    faults: list[Fault] = []
    t = 1.0
    while True:
        t += rng.uniform(0.5, 2.5)
        kind = rng.choice(kinds)
        # Shorter than the remaining lock (two thirds of it, renewed), or longer than the lock.
        duration = (
            rng.uniform(0.3, 1.2) if rng.random() < 0.5 else rng.uniform(LOCK + 0.5, LOCK + 4)
        )
        if kind in INSTANT:
            duration = 0.0
        if t + duration >= seconds:
            break
        faults.append(Fault(round(t, 3), kind, round(duration, 3), rng.randrange(1000)))
        t += duration
    return stories, faults


# The servers ------------------------------------------------------------------------------


@dataclass
class Servers:
    database: str
    store: str
    plant: str
    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="idem-verify-")))
    server: Any = None
    proxy: FaultProxy | None = None
    redis: RedisServer | None = None
    gunicorn: harness.Server | None = None
    #: The outbox's relay (``manage.py idempotency_relay``) and consumer, database store only.
    helpers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    def start(self) -> None:
        if self.database == "sqlite":
            self.server = databases.SQLiteFile()
            url = direct = self.server.url()
        else:
            self.server = (
                databases.PostgresCluster()
                if self.database == "postgresql"
                else databases.MariaDBServer()
            )
            self.server.create()
            self.proxy = FaultProxy(databases.free_port(), self.server.port).start()
            url, direct = self.server.url(port=self.proxy.port), self.server.url()
        migrate(direct)
        env = dict(os.environ)
        env.update(
            DJANGO_SETTINGS_MODULE="tests.verification.settings",
            DATABASE_URL=url,
            IDEMPOTENCY_FAULT_DIR=str(self.folder),
            IDEMPOTENCY_VERIFY_LEDGER=str(self.folder),
            IDEMPOTENCY_VERIFY_PLANT=self.plant,
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
        if self.store == "database":
            self.env = env
            self.start_helper("relay")
            self.start_helper("consumer")

    def start_helper(self, name: str) -> None:
        """The relay or the consumer, logging to a file of the run's folder."""
        command = {
            "relay": [sys.executable, "-m", "django", "idempotency_relay", "--interval", "0.5"],
            "consumer": [sys.executable, "-m", "tests.verification.consumer"],
        }[name]
        with (self.folder / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(command, cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL,
                                       stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        databases.track(process.pid, name)
        self.helpers[name] = process

    @property
    def url(self) -> str:
        assert self.gunicorn is not None
        return self.gunicorn.url

    def workers(self) -> list[int]:
        assert self.gunicorn is not None
        return sorted(pid for pid in self.gunicorn.worker_pids() if databases.alive(pid))

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
        for name, process in self.helpers.items():
            databases.end(process.pid)
            process.wait()
            if keep_log is not None:
                with keep_log.with_suffix(f".{name}.log").open("wb") as out:
                    out.write((self.folder / f"{name}.log").read_bytes())
        if self.gunicorn is not None:
            for pid in self.gunicorn.worker_pids():  # none left stopped
                if databases.alive(pid):
                    os.kill(pid, signal.SIGCONT)
            self.gunicorn.stop()
            if self.gunicorn.process is not None:
                databases.untrack(self.gunicorn.process.pid)
            if keep_log is not None:
                shutil.copy(self.gunicorn.log_path, keep_log)
            self.gunicorn.discard_log()
        if self.proxy is not None:
            self.proxy.stop()
        if self.redis is not None:
            self.redis.destroy()
        if self.server is not None:
            self.server.destroy()
        shutil.rmtree(self.folder, ignore_errors=True)


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
    def __init__(self, servers: Servers, stories: list[Story], faults: list[Fault],
                 seconds: float, seed: int) -> None:  # fmt: skip
        self.servers = servers
        self.stories = stories
        self.faults = faults
        self.seconds = seconds
        self.seed = seed
        self.recorder = Recorder()
        self.credentials: dict[str, dict[str, str]] = {}
        self.start = 0.0
        self.healed = threading.Event()
        self.heal_time = float("inf")
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

    def headers(self, story: Story) -> dict[str, str]:
        headers = {"Idempotency-Key": story.key, "Content-Type": "application/json"}
        if story.principal in self.credentials:
            given = self.credentials[story.principal]
            if story.entry in DRF_ENTRIES:
                headers["Authorization"] = f"Token {given['token']}"
            elif story.entry == "ninja":
                headers["X-API-Key"] = given["token"]
            else:
                headers["Cookie"] = given["cookie"]
        return headers

    def send(self, story: Story) -> tuple[str, int | None]:
        """One request, recorded: its operation and final status (``None``: none yet)."""
        op = self.recorder.op()
        self.recorder.add({
            "type": "invoke", "op": op, "t": time.time(), "story": story.number,
            "principal": story.principal, "key": story.key, "entry": story.entry,
            "body": _digest(story.body),
        })  # fmt: skip
        done: dict[str, Any] = {"type": "complete", "op": op, "status": None}
        try:
            response = self.http.post(f"{self.servers.url}/{story.entry}/", content=story.body,
                                      headers=self.headers(story))  # fmt: skip
        except httpx.HTTPError as exc:
            done["error"] = type(exc).__name__
        else:
            done.update(
                status=response.status_code,
                response=_digest(response.content),
                replayed=response.headers.get("Idempotent-Replayed") == "true",
            )
            if 200 <= response.status_code < 300:
                answer = response.json()
                done.update(execution=answer.get("execution"), **{"as": answer.get("principal")})
        done["t"] = time.time()
        self.recorder.add(done)
        if done["status"] in RETRY:
            return op, None
        return op, int(done["status"])

    def until_final(self, story: Story, rng: random.Random) -> bool:
        while True:
            began = time.time()
            op, status = self.send(story)
            if status is not None:
                return True
            deadline = max(self.heal_time, began) + LOCK + SETTLE
            if time.time() > deadline:
                self.recorder.add({"type": "unsettled", "op": op, "t": time.time()})
                return False
            time.sleep(rng.uniform(0.2, 0.6))

    def client(self, story: Story, index: int) -> None:
        rng = random.Random(f"{self.seed}-{story.number}-{index}")
        if not self.until_final(story, rng) or index:
            return
        for delay in story.followups:
            time.sleep(delay)
            if not self.until_final(story, rng):
                return

    def nemesis(self) -> None:
        try:
            self.faults_run()
        finally:  # whatever happened, the clients' settling time counts from now
            self.heal_time = time.time()
            self.healed.set()

    def faults_run(self) -> None:
        for fault in self.faults:
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
            if fault.kind.startswith("worker"):
                workers = self.servers.workers()
                if not workers:
                    continue
                pid = workers[fault.choice % len(workers)]
                busy = self.servers.busy()
                if fault.choice % 10 < 7 and busy in workers:  # mostly a worker mid-view
                    pid = busy
                event["pid"] = pid
                with contextlib.suppress(ProcessLookupError):  # it died meanwhile
                    if fault.kind == "worker-kill":
                        os.kill(pid, signal.SIGKILL)
                    else:
                        os.kill(pid, signal.SIGSTOP)
                        time.sleep(fault.duration / 2)
                        event["waits"] = self.lock_waits()
                        time.sleep(fault.duration / 2)
                        os.kill(pid, signal.SIGCONT)
            elif fault.kind == "db-blackhole":
                assert self.servers.proxy is not None
                self.servers.proxy.blackhole()
                time.sleep(fault.duration)
                self.servers.proxy.restore()
            elif fault.kind == "db-cut":
                assert self.servers.proxy is not None
                self.servers.proxy.cut_all()
            elif fault.kind == "db-terminate":  # the server ends every session of the app
                self.servers.server.terminate_backends()
            elif fault.kind == "db-restart":  # down for the length, then started again
                self.servers.server.stop_for(fault.duration)
            elif fault.kind == "db-read-only":
                self.servers.server.read_only(True)
                time.sleep(fault.duration)
                self.servers.server.read_only(False)
            elif fault.kind == "relay-kill":  # a new relay at once, as a supervisor would
                os.kill(self.servers.helpers["relay"].pid, signal.SIGKILL)
                self.servers.helpers["relay"].wait()
                self.servers.start_helper("relay")
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
            event["end"] = time.time()
            if fault.kind in ("db-restart", "db-read-only"):  # a stop and a start take time too
                event["long"] = event["end"] - event["start"] >= LOCK * 2 / 3
            self.recorder.add(event)
            log(f"fault {fault.kind} {fault.duration:.1f}s")

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
            list(pool.map(lambda story: self.until_final(story, random.Random(story.number)),
                          probes.values()))  # fmt: skip
        effects = self.servers.ledger()
        if "atomic" in {story.entry for story in self.stories}:
            response = httpx.get(f"{self.servers.url}/atomic-effects/", timeout=30)
            effects += response.json()["effects"]
        for effect in effects:
            self.recorder.add({"type": "effect", **effect})
        if self.servers.helpers:
            self.drain()
        return self.recorder.events

    def drain(self) -> None:
        """Wait until the outbox has nothing undelivered and the consumer has had every
        delivery (at most :data:`DRAIN` seconds), then record both."""
        deadline = time.time() + DRAIN
        while True:
            state = httpx.get(f"{self.servers.url}/outbox-state/", timeout=30).json()
            delivered = deliveries(self.servers.folder)
            consumed = {row["message"] for row in state["consumed"]}
            if not any(state["undelivered"].values()) and all(
                delivery["message"] in consumed for delivery in delivered
            ):
                break
            if time.time() > deadline:
                log(f"outbox not drained: {state['undelivered']}")
                self.recorder.add({"type": "undrained", "t": time.time(),
                                   "undelivered": state["undelivered"]})  # fmt: skip
                break
            time.sleep(0.5)
        for delivery in delivered:
            self.recorder.add({"type": "delivery", **delivery})
        for row in state["consumed"]:
            self.recorder.add({"type": "consumed", **row})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--database", choices=("sqlite", "postgresql", "mariadb"), default="sqlite")
    parser.add_argument("--store", choices=("database", "redis"), default="database")
    parser.add_argument("--plant", choices=sorted(PLANTS), default="")
    parser.add_argument("--history", type=Path, help="where the JSON lines go")
    args = parser.parse_args(argv)
    if args.store == "redis" and args.database != "sqlite":
        parser.error("the Redis store keeps the app's own tables on SQLite: --database sqlite")
    stories, faults = generate(args.seed, args.seconds, args.store, args.database)
    log(f"seed {args.seed}: {len(stories)} stories, {len(faults)} faults, "
        f"{args.database}/{args.store}{' plant ' + args.plant if args.plant else ''}")  # fmt: skip
    history = args.history or Path(tempfile.gettempdir()) / (
        f"idempotency-verification-{args.seed}-{args.database}-{args.store}"
        f"{'-' + args.plant if args.plant else ''}.jsonl"
    )
    servers = Servers(args.database, args.store, args.plant)
    began = time.monotonic()
    try:
        servers.start()
        log("servers up")
        events = Run(servers, stories, faults, args.seconds, args.seed).go()
    finally:
        servers.stop(keep_log=history.with_suffix(".log"))
    with history.open("w") as out:
        for event in events:
            out.write(json.dumps(event) + "\n")
    limits = checker.Limits(
        lock=LOCK,
        ttl=TTLS,
        worker_faults_global=args.database == "sqlite" and args.store == "database",
    )
    result = checker.check(events, limits)
    violations = []
    seen = set()
    for violation in result.violations:
        found = (violation["invariant"], violation["principal"], violation["key"])
        if found in seen or len(violations) >= 10:
            continue
        seen.add(found)
        violations.append({**violation, "history": checker.shrink(events, violation, limits)})
    statuses = Counter(str(e["status"]) for e in events if e["type"] == "complete")
    summary = {
        "seed": args.seed,
        "seconds": args.seconds,
        "database": args.database,
        "store": args.store,
        "plant": args.plant or None,
        "histories": 1,
        "keys": len({(s.principal, s.key) for s in stories}),
        "requests": sum(1 for e in events if e["type"] == "invoke"),
        "statuses": dict(sorted(statuses.items())),
        "effects": sum(1 for e in events if e["type"] == "effect"),
        "faults": dict(sorted(Counter(e["kind"] for e in events if e["type"] == "fault").items())),
        "windows": result.windows,
        "violations": violations,
        "violations_total": len(result.violations),
        "history": str(history),
        "server_log": str(history.with_suffix(".log")),
        "wall_seconds": round(time.monotonic() - began, 1),
    }
    print(json.dumps(summary))
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
