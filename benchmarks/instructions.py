#!/usr/bin/env python
"""Client-side instructions per request, counted by valgrind's callgrind: ours and the peer's.

The app's cost in the one unit that load does not move: the instructions the application's
process runs (Python, Django, psycopg, libpq) per request, counted by callgrind. The database
server is another process and is not counted, so the figures are the same on a quiet machine
and a busy one, and a 3% change is a change of the code (or of a pinned version).

The view is the wall-clock benchmark's (``benchmarks/overhead_project/``: authenticate one
user by a query, parse a JSON body, insert a row, render it), served bare, protected by this
app in two-phase and atomic mode, and by drf-idempotency (``pip install drf-idempotency``, the
peer): its decorator alone, and inside ``transaction.atomic`` (the peer's atomic counterpart).
Each path runs ``--requests`` requests through Django's WSGI handler after a warm-up; a first
execution gets a fresh key each time, and its replay sends each of those keys again.

How the count is kept to the measured requests: valgrind starts with instrumentation and
collection off (``--instr-atstart=no --collect-atstart=no``); a helper compiled from
valgrind's ``callgrind.h`` (gcc, at the first run) turns instrumentation on once, after the
warm-up, then zeroes the counters and toggles collection on just before each path's requests
and off just after them, and dumps the counts under the path's name. Every thread of the
process is counted (a renewer's wake-up is the app's cost too). The cyclic garbage collector is
run before each path and kept off during it, so that where its passes happen to fall does not
move the figures.

It runs in an environment of its own (``--env``, made at the first run): the versions pinned
in ``benchmarks/instructions-requirements.txt`` and this checkout, installed editable (and,
for a MySQL or MariaDB server, ``mysqlclient``). It creates its own database on the server
given (``--database``) and drops it at the end. From the repository root::

    python3.11 benchmarks/instructions.py --server postgres://postgres@127.0.0.1:5432/test
    python3.11 benchmarks/instructions.py --server mysql://root@127.0.0.1:3306/test

``--auth lazy`` reads the request's user only when something reads it, as Django's
``AuthenticationMiddleware`` does (``overhead.py --auth``).

``--check benchmarks/instructions-baseline.json`` fails (exit 1) when any of our paths runs
more than 3% more instructions per request than the baseline file says; ``--write-baseline
FILE`` writes the figures of this run as a new baseline, with ``--why`` (the baseline changes
only in a commit that says why). Needs Debian's ``valgrind`` and ``gcc``.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REQUIREMENTS = ROOT / "benchmarks" / "instructions-requirements.txt"
BASELINE = ROOT / "benchmarks" / "instructions-baseline.json"
#: How much more than the baseline one of our paths may cost before the check fails.
TOLERANCE = 0.03
#: The driver installed in the environment for a MySQL or MariaDB server (not pinned in the
#: requirements: it builds from source, against the client library).
MYSQL_DRIVER = "mysqlclient==2.3.2"
#: The issue's goal for a first execution: at most this many instructions over the bare view.
FIRST_GOAL = 900_000

#: Each measured path: its name, its URL, and whether it sends a fresh key, the key of the first
#: execution before it (a replay), or none. The bare view inside ``transaction.atomic`` is not
#: guarded: it says what Django's transaction costs an atomic-mode request on its own.
OURS = [
    ("bare", "/bare/", None),
    ("bare in a transaction", "/bare-atomic/", None),
    ("two-phase first", "/two-phase/", "first"),
    ("two-phase replay", "/two-phase/", "replay"),
    ("atomic first", "/atomic/", "first"),
    ("atomic replay", "/atomic/", "replay"),
]
PEER = [
    ("peer two-phase first", "/peer-two-phase/", "first"),
    ("peer two-phase replay", "/peer-two-phase/", "replay"),
    ("peer atomic first", "/peer-atomic/", "first"),
    ("peer atomic replay", "/peer-atomic/", "replay"),
]
#: The paths the check guards: ours.
GUARDED = [name for name, _, key in OURS if key is not None]

HELPER_C = r"""
#include <valgrind/callgrind.h>
static int instrumented = 0;
void bench_start(void) {
    if (!instrumented) { CALLGRIND_START_INSTRUMENTATION; instrumented = 1; }
    CALLGRIND_ZERO_STATS;
    CALLGRIND_TOGGLE_COLLECT;
}
void bench_stop(const char *label) {
    CALLGRIND_TOGGLE_COLLECT;
    CALLGRIND_DUMP_STATS_AT(label);
}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--server",
        default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
        help="a PostgreSQL or MySQL/MariaDB URL whose server gets the benchmark database "
        "(default: DATABASE_URL)",
    )
    parser.add_argument("--auth", choices=["eager", "lazy"], default="eager")
    parser.add_argument("--database", default="bench_instructions", help="created, then dropped")
    parser.add_argument("--requests", type=int, default=20, help="measured requests per path")
    parser.add_argument("--warmup", type=int, default=20, help="requests per path before")
    parser.add_argument(
        "--env",
        type=Path,
        default=Path(tempfile.gettempdir()) / f"django-idempotency-instructions-{_python()}",
        help="the benchmark's own virtual environment (made when missing or out of date)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument(
        "--keep-dumps", type=Path, help="copy callgrind's dumps there (for callgrind_annotate)"
    )
    parser.add_argument("--check", type=Path, help="fail when a path of ours grew over this")
    parser.add_argument("--write-baseline", type=Path, help="write this run's figures there")
    parser.add_argument("--why", default="", help="with --write-baseline: why it changes")
    parser.add_argument("--stage", choices=["prepare", "measure", "drop"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.requests < 1 or args.warmup < 1:
        parser.error("--requests and --warmup must be positive")
    if not args.database.isidentifier():
        parser.error("--database must be a plain identifier")
    if not urlsplit(args.server).scheme.startswith(("postgres", "mysql")):
        parser.error("--server must be a postgres:// or mysql:// URL")
    if args.write_baseline and not args.why:
        parser.error("--write-baseline needs --why: the baseline changes only with a reason")
    bench_url = urlunsplit(urlsplit(args.server)._replace(path=f"/{args.database}"))
    if args.stage == "prepare":
        prepare(args.server, args.database)
    elif args.stage == "measure":
        measure(args, bench_url)
    elif args.stage == "drop":
        from benchmarks.databases import drop_database

        drop_database(args.server, args.database)
    else:
        sys.exit(run(args, bench_url))


def _python() -> str:
    return f"py{sys.version_info[0]}.{sys.version_info[1]}"


# --- the outer process: environment, database, valgrind, report --------------------------------


def run(args: argparse.Namespace, bench_url: str) -> int:
    for tool in ("valgrind", "gcc"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is needed (Debian: apt-get install {tool})")
    python = environment(args.env)
    if urlsplit(args.server).scheme.startswith("mysql"):
        with_mysql_driver(python)
    helper = compile_helper(args.env)
    itself = [str(python), str(Path(__file__).resolve())]
    common = ["--server", args.server, "--database", args.database]
    uptime_before = uptime()
    subprocess.run([*itself, "--stage", "prepare", *common], check=True, cwd=ROOT)
    try:
        with tempfile.TemporaryDirectory(prefix="instructions-") as out:
            started = time.monotonic()
            command = [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                "--collect-atstart=no",
                f"--callgrind-out-file={out}/callgrind.out.%p",
                *itself,
                "--stage",
                "measure",
                *common,
                "--requests",
                str(args.requests),
                "--warmup",
                str(args.warmup),
                "--out",
                f"{out}/environment.json",
            ]
            env = {
                **os.environ,
                "PYTHONHASHSEED": "0",
                "BENCH_CALLGRIND_HELPER": str(helper),
                "BENCH_DATABASE_URL": bench_url,
                "DJANGO_SETTINGS_MODULE": "benchmarks.overhead_project.settings",
                "BENCH_AUTH": args.auth,
            }
            done = subprocess.run(command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
            if done.returncode:
                sys.stderr.write(done.stderr[-5000:])
                raise SystemExit(f"the measuring process failed (exit {done.returncode})")
            elapsed = time.monotonic() - started
            totals = read_dumps(Path(out))
            if args.keep_dumps:
                shutil.copytree(out, args.keep_dumps, dirs_exist_ok=True)
            described = json.loads(Path(out, "environment.json").read_text())
    finally:
        subprocess.run([*itself, "--stage", "drop", *common], check=True, cwd=ROOT)
    per_request = {name: totals[name] / args.requests for name in totals}
    figures = {
        "environment": described,
        "requests": args.requests,
        "instructions": {name: round(value) for name, value in per_request.items()},
    }
    report(figures, elapsed, uptime_before, uptime())
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    if args.write_baseline:
        baseline = {"why": args.why, **figures}
        args.write_baseline.write_text(json.dumps(baseline, indent=2) + "\n")
        print(f"Baseline written to {args.write_baseline}.")
    if args.check:
        return check(figures, json.loads(args.check.read_text()), args.check)
    return 0


def environment(venv: Path) -> Path:
    """The benchmark's own virtual environment: the pinned versions and this checkout."""
    python = venv / "bin" / "python"
    wanted = hashlib.sha256(
        REQUIREMENTS.read_bytes() + str(ROOT).encode() + sys.version.encode()
    ).hexdigest()
    marker = venv / "instructions-requirements.sha256"
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    print(f"Making the benchmark's environment in {venv} ...", flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "-r", str(REQUIREMENTS)], check=True)
    subprocess.run([*pip, "--no-deps", "-e", str(ROOT)], check=True)
    marker.write_text(wanted)
    return python


def with_mysql_driver(python: Path) -> None:
    """``mysqlclient`` in the environment, for a MySQL or MariaDB server."""
    found = subprocess.run([str(python), "-c", "import MySQLdb"], capture_output=True)
    if found.returncode:
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             MYSQL_DRIVER],
            check=True,
        )  # fmt: skip


def compile_helper(venv: Path) -> Path:
    """The shared library whose two functions start and stop counting (callgrind.h's macros)."""
    source = venv / "callgrind_helper.c"
    library = venv / "callgrind_helper.so"
    if not (library.exists() and source.exists() and source.read_text() == HELPER_C):
        source.write_text(HELPER_C)
        subprocess.run(
            ["gcc", "-O1", "-shared", "-fPIC", "-o", str(library), str(source)], check=True
        )
    return library


def dumps(directory: Path) -> dict[str, int]:
    """Each label's instructions (``Ir``), from the dump its stop wrote (named by its label)."""
    totals: dict[str, int] = {}
    for dump in directory.glob("callgrind.out.*"):
        text = dump.read_text(errors="replace")
        trigger = re.search(r"^desc: Trigger: Client Request: (.+)$", text, re.M)
        count = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
        if trigger and count:
            totals[trigger.group(1).strip()] = int(count.group(1))
    return totals


def read_dumps(directory: Path) -> dict[str, int]:
    """Each of this benchmark's paths' instructions; a path without a dump stops it."""
    totals = dumps(directory)
    missing = [name for name, _, _ in [*OURS, *PEER] if name not in totals]
    if missing:
        raise SystemExit(f"callgrind wrote no counts for {missing}")
    return totals


def report(figures: dict[str, Any], elapsed: float, before: str, after: str) -> None:
    counts = figures["instructions"]
    described = figures["environment"]
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"# django-idempotency instruction counts ({now})")
    print(
        f"Python {described['python']}, Django {described['django']}, psycopg "
        f"{described['psycopg']}, drf-idempotency {described['drf-idempotency']}, "
        f"{described['valgrind']}, {described['server']}, auth {described.get('auth', 'eager')}"
    )
    print(
        f"Instructions of the app's process per request (callgrind Ir), {figures['requests']} "
        f"requests per path ({elapsed:.0f} s under valgrind)"
    )
    print(f"uptime before: {before}")
    print(f"uptime after:  {after}")
    print()
    bare = counts["bare"]
    print(f"{'path':<18} {'ours':>8} {'over bare':>10}   {'drf-idempotency':>15} {'over bare':>10}")
    print(f"{'bare':<18} {_m(bare):>8} {'':>10}   {_m(bare):>15}")
    in_atomic = counts["bare in a transaction"]
    print(
        f"{'bare in atomic()':<18} {_m(in_atomic):>8} {_m(in_atomic - bare, sign=True):>10}   "
        "(Django's transaction alone: what atomic mode pays before any of the app's work)"
    )
    for name in GUARDED:
        ours, peer = counts[name], counts[f"peer {name}"]
        print(
            f"{name:<18} {_m(ours):>8} {_m(ours - bare, sign=True):>10}   "
            f"{_m(peer):>15} {_m(peer - bare, sign=True):>10}"
        )
    print()
    for name in GUARDED:
        ours, peer = counts[name], counts[f"peer {name}"]
        if name.endswith("first"):
            added = ours - bare
            verdict = "met" if added <= FIRST_GOAL else "MISSED"
            print(f"goal {name}: {_m(added, sign=True)} over bare <= +0.90M {verdict}")
        else:
            verdict = "met" if ours <= peer else "MISSED"
            print(f"goal {name}: {_m(ours)} <= drf-idempotency's {_m(peer)} {verdict}")
    print()


def _m(value: float, *, sign: bool = False) -> str:
    return f"{value / 1e6:{'+' if sign else ''}.2f}M"


def check(figures: dict[str, Any], baseline: dict[str, Any], path: Path) -> int:
    """1 when a path of ours costs more than the baseline allows, else 0."""
    for what in ("server", "auth"):
        was = baseline["environment"].get(what, "eager" if what == "auth" else None)
        now = figures["environment"].get(what, "eager" if what == "auth" else None)
        if what == "server":  # the server's kind, not its minor version
            was, now = str(was).split(" ")[0], str(now).split(" ")[0]
        if was != now:
            print(f"The baseline ({path}) was measured with {what} {was}, this run {now}.")
            return 1
    if baseline["environment"]["versions"] != figures["environment"]["versions"]:
        print(
            f"The baseline ({path}) was measured with other versions: "
            f"{baseline['environment']['versions']}, this run "
            f"{figures['environment']['versions']}. Measure it again (--write-baseline, --why).",
        )
        return 1
    failed = 0
    print(f"Check against {path} ({baseline['why']}), at most +{TOLERANCE:.0%}:")
    for name in GUARDED:
        was, now = baseline["instructions"][name], figures["instructions"][name]
        change = now / was - 1
        verdict = "ok"
        if change > TOLERANCE:
            verdict, failed = "GREW (fails)", 1
        elif change < -TOLERANCE:
            verdict = "fell: lower the baseline in a commit that says why"
        print(f"  {name:<18} {_m(was)} -> {_m(now)} ({change:+.1%}) {verdict}")
    return failed


def uptime() -> str:
    """``uptime``'s line (the load while measuring), its clock in UTC: a process that set up
    Django has its ``TIME_ZONE`` in ``TZ``."""
    env = {**os.environ, "TZ": "UTC"}
    return subprocess.run(["uptime"], capture_output=True, text=True, env=env).stdout.strip()


# --- the stages run in the benchmark's environment ---------------------------------------------


def prepare(server: str, database: str) -> None:
    """The database, migrated, and the user every request authenticates as."""
    from benchmarks.databases import create_database

    create_database(server, database)
    os.environ["BENCH_DATABASE_URL"] = urlunsplit(urlsplit(server)._replace(path=f"/{database}"))
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.overhead_project.settings"
    import django
    from django.core.management import call_command

    django.setup()
    from django.contrib.auth.models import User

    from benchmarks.overhead import USER

    call_command("migrate", verbosity=0)
    User.objects.create(username=USER)


def measure(args: argparse.Namespace, bench_url: str) -> None:
    """Under valgrind: warm every path up, then count each one's requests alone."""
    import ctypes

    import django

    django.setup()
    import psycopg
    from django.db import connection

    from benchmarks.overhead import wsgi_call

    helper = ctypes.CDLL(os.environ["BENCH_CALLGRIND_HELPER"])
    helper.bench_stop.argtypes = [ctypes.c_char_p]
    paths = [*OURS, *PEER]

    def send(path: str, keys: list[str | None]) -> None:
        for key in keys:
            status = wsgi_call(path, key)
            assert status == 201, f"{path}: {status}"

    def keys_for(kind: str | None, count: int, first: list[str | None]) -> list[str | None]:
        if kind is None:
            return [None] * count
        if kind == "replay":
            return first
        return [str(uuid.uuid4()) for _ in range(count)]

    warm: list[str | None] = []
    for _, path, kind in paths:
        warm = keys_for(kind, args.warmup, warm)
        send(path, warm)
    first: list[str | None] = []
    for name, path, kind in paths:
        first = keys_for(kind, args.requests, first)
        gc.collect()
        gc.disable()
        helper.bench_start()
        send(path, first)
        helper.bench_stop(name.encode())
        gc.enable()
    with connection.cursor() as cursor:
        cursor.execute("SELECT version()")
        (server,) = cursor.fetchone()
    if connection.vendor == "mysql":
        number = server.split("-")[0]
        server = f"MariaDB {number}" if "MariaDB" in server else f"MySQL {number}"
    else:
        server = f"PostgreSQL {server.split()[1]}"
    from importlib.metadata import version

    versions = {
        "python": platform.python_version(),
        "django": django.get_version(),
        "psycopg": psycopg.__version__,
        "drf-idempotency": version("drf-idempotency"),
    }
    valgrind = subprocess.run(["valgrind", "--version"], capture_output=True, text=True)
    described = {
        **versions,
        "versions": versions,
        "valgrind": valgrind.stdout.strip(),
        "server": server,
        "auth": os.environ.get("BENCH_AUTH", "eager"),
    }
    args.out.write_text(json.dumps(described))


if __name__ == "__main__":
    main()
