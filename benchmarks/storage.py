#!/usr/bin/env python
"""What compression and encryption at rest save and cost (issue 31; ``docs/storage.rst``).

1. ``codecs``: each standard-library codec (zlib and gzip at several levels, lzma, bz2) on a
   200 KB JSON body of charges and on a 1.5 KB one: the ratio, and the CPU time to compress and
   to decompress (the median of repeated runs, ``time.process_time``).
2. ``sizes``: the bytes the record keeps (headers and body columns) of the example project's
   responses (each POST endpoint of ``example_project``, run in-process on a fresh SQLite
   database) and of the 200 KB body, with compression off and on, and with encryption.
3. ``instructions``: the instructions (``valgrind --tool=callgrind``) a protected request
   costs, first execution and replay, for a small JSON body and the 200 KB one, on this
   checkout and on another source tree given with ``--baseline`` (e.g. ``git archive main``
   unpacked): the difference is what this change adds. One callgrind run per tree and body;
   each phase (warm-up, first executions, replays) is cut into its own dump at a call of
   ``getppid()`` (``--dump-before=getppid``), so Django's start-up is never counted.

Run from the repository root::

    .venv/bin/python benchmarks/storage.py codecs sizes
    mkdir -p /tmp/main-src && git archive main | tar -x -C /tmp/main-src
    .venv/bin/python benchmarks/storage.py instructions --baseline /tmp/main-src
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import json
import lzma
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def charges(target: int, seed: int = 31) -> bytes:
    """A JSON list of charges (ids, amounts, names, addresses, card details) of ``target``
    bytes or a little more: what a payments API's list endpoint returns."""
    rnd = random.Random(seed)
    names = ["Ada Lovelace", "Grace Hopper", "Alan Turing", "Edsger Dijkstra", "Barbara Liskov"]
    items: list[dict[str, Any]] = []
    body = b""
    while len(body) < target:
        index = len(items)
        items.append(
            {
                "id": f"ch_{uuid.UUID(int=rnd.getrandbits(128)).hex[:24]}",
                "object": "charge",
                "amount": rnd.randrange(100, 100_000),
                "currency": rnd.choice(["usd", "eur", "gbp"]),
                "status": rnd.choice(["succeeded", "pending", "failed"]),
                "created": 1_764_000_000 + index * 37,
                "customer": {
                    "name": rnd.choice(names),
                    "email": f"user{rnd.randrange(10**6)}@example.com",
                    "address": {
                        "line1": f"{rnd.randrange(1, 999)} Main Street",
                        "city": rnd.choice(["London", "Paris", "Berlin"]),
                        "postal_code": str(rnd.randrange(10_000, 99_999)),
                        "country": rnd.choice(["GB", "FR", "DE"]),
                    },
                },
                "card": {
                    "brand": rnd.choice(["visa", "mastercard"]),
                    "last4": f"{rnd.randrange(10_000):04d}",
                    "exp_month": rnd.randrange(1, 13),
                    "exp_year": rnd.randrange(2026, 2032),
                    "fingerprint": uuid.UUID(int=rnd.getrandbits(128)).hex[:16],
                },
                "metadata": {"order_id": str(rnd.randrange(10**8))},
            }
        )
        body = json.dumps({"object": "list", "data": items}).encode()
    return body


CODECS: dict[str, tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]] = {
    "zlib level 1": (lambda b: zlib.compress(b, 1), zlib.decompress),
    "zlib level 6 (chosen)": (lambda b: zlib.compress(b, 6), zlib.decompress),
    "zlib level 9": (lambda b: zlib.compress(b, 9), zlib.decompress),
    "gzip level 6": (lambda b: gzip.compress(b, 6, mtime=0), gzip.decompress),
    "lzma preset 0": (lambda b: lzma.compress(b, preset=0), lzma.decompress),
    "lzma preset 6": (lambda b: lzma.compress(b, preset=6), lzma.decompress),
    "bz2 level 9": (lambda b: bz2.compress(b, 9), bz2.decompress),
}


def _median_cpu(function: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.process_time()
        function()
        times.append(time.process_time() - started)
    return statistics.median(times)


def codecs() -> None:
    print("## codecs (ratio = original / compressed; CPU per body, median)")
    for label, body in (("200 KB JSON", charges(200_000)), ("1.5 KB JSON", charges(1_500))):
        print(f"\n{label}: {len(body):,} bytes")
        print(f"{'codec':24} {'bytes':>9} {'ratio':>6} {'compress':>11} {'decompress':>11}")
        rounds = 15 if len(body) > 10_000 else 300
        for name, (compress, decompress) in CODECS.items():
            packed = compress(body)
            assert decompress(packed) == body
            pack = _median_cpu(partial(compress, body), rounds)
            unpack = _median_cpu(partial(decompress, packed), rounds)
            print(
                f"{name:24} {len(packed):>9,} {len(body) / len(packed):>6.2f} "
                f"{pack * 1e3:>8.3f} ms {unpack * 1e3:>8.3f} ms"
            )


def _django(database: str) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "example_project.settings"
    os.environ["DATABASE_URL"] = f"sqlite:///{database}"
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def _example_records() -> list[tuple[str, list[list[str]], bytes]]:
    """Each POST endpoint of the example, run once; what its record stores (unsealed)."""
    from django.conf import settings
    from django.core.management import call_command
    from django.test import Client, override_settings

    from django_idempotency import IdempotencyKey
    from django_idempotency._store import sealing

    call_command("migrate", verbosity=0)
    client = Client()
    # The example's charge sends its receipt through the outbox (a thread that mails to the
    # console and claims a record of its own): neither belongs in these figures, and the mail
    # would land in the table printed here. Its message stays staged for a relay never run.
    # The example's tasks are in-process stand-ins, not Celery's: E056 (an outbox setting
    # with nothing to deliver) is for a project without them.
    quiet = override_settings(
        IDEMPOTENCY={**settings.IDEMPOTENCY, "OUTBOX_FAST_PATH": False},
        EMAIL_BACKEND="django.core.mail.backends.locmem.EmailBackend",
        SILENCED_SYSTEM_CHECKS=[*settings.SILENCED_SYSTEM_CHECKS, "django_idempotency.E056"],
    )
    quiet.enable()

    def post(path: str, data: dict[str, Any]) -> Any:
        key = {"Idempotency-Key": str(uuid.uuid4())}
        response = client.post(path, data, content_type="application/json", headers=key)
        assert response.status_code < 300, (path, response.status_code, response.content)
        return response

    charge = post("/api/charges/", {"amount": 4200, "currency": "usd", "description": "Order 1"})
    charge_id = charge.json()["id"]
    post(f"/api/charges/{charge_id}/refunds/", {"amount": 1200})
    post("/payouts/", {"amount": 900, "currency": "usd"})
    post(f"/charges/{charge_id}/receipt/", {"email": "ada@example.com"})
    records = []
    for record in IdempotencyKey.objects.order_by("pk"):
        headers, body = sealing.unseal(
            record.response_headers, record.response_body, (record.scope, record.key_hash)
        )
        records.append((f"{record.method} {record.path}", headers, body or b""))
    quiet.disable()
    return records


def _stored(headers: Any, body: bytes | None) -> int:
    return len(json.dumps(headers, separators=(", ", ": "))) + len(body or b"")


def sizes() -> None:
    """The record's headers and body columns, in bytes, under each setting."""
    with tempfile.TemporaryDirectory() as directory:
        _django(str(Path(directory) / "db.sqlite3"))
        from cryptography.fernet import Fernet
        from django.test import override_settings

        from django_idempotency._store import sealing

        records = _example_records()
        big = charges(200_000)
        records.append(("a 200 KB JSON body", [["Content-Type", "application/json"]], big))
        modes = {
            "as sent": {"COMPRESSION": False},
            "compressed": {},
            "encrypted": {"COMPRESSION": False, "ENCRYPTION_KEYS": [Fernet.generate_key()]},
            "compressed+encrypted": {"ENCRYPTION_KEYS": [Fernet.generate_key()]},
        }
        print("\n## bytes stored (headers column + body column)")
        print(f"{'response':40} {'body':>8} " + " ".join(f"{m:>21}" for m in modes))
        for name, headers, body in records:
            row = []
            for settings in modes.values():
                with override_settings(IDEMPOTENCY=settings):
                    row.append(_stored(*sealing.seal(headers, body, ("user:1", "0" * 64))))
            cells = " ".join(f"{n:>12,} ({n / row[0]:>5.0%})" for n in row)
            print(f"{name[:40]:40} {len(body):>8,} {cells}")


# --- instructions ---------------------------------------------------------------------------


WORKER = r"""
import io, json, os, sys, uuid
sys.path.insert(0, sys.argv[1])
import django
from django.conf import settings
big = open(sys.argv[3], "rb").read()
settings.configure(
    DEBUG=False,
    SECRET_KEY="x",
    ALLOWED_HOSTS=["*"],
    USE_TZ=True,
    ROOT_URLCONF=__name__,
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_idempotency"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": sys.argv[2]}},
    IDEMPOTENCY={"HEARTBEAT": False, **json.loads(sys.argv[6])},
)
django.setup()
from django.core.handlers.wsgi import WSGIHandler
from django.core.management import call_command
from django.http import HttpResponse, JsonResponse
from django.urls import path
from django_idempotency import idempotent

@idempotent
def small(request):
    return JsonResponse({"id": 1234, "amount": 4200, "currency": "usd", "status": "succeeded"})

@idempotent
def large(request):
    return HttpResponse(big, content_type="application/json")

urlpatterns = [path("small/", small), path("large/", large)]
call_command("migrate", verbosity=0, run_syncdb=True)
handler = WSGIHandler()

def request(route, key):
    body = b'{"amount": 4200}'
    environ = {
        "REQUEST_METHOD": "POST", "PATH_INFO": route, "SERVER_NAME": "testserver",
        "SERVER_PORT": "80", "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(body),
        "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body)),
        "HTTP_IDEMPOTENCY_KEY": key, "wsgi.errors": sys.stderr,
    }
    response = handler(environ, lambda status, headers: None)
    b"".join(response)
    response.close()

route, count = sys.argv[4], int(sys.argv[5])
keys = [str(uuid.UUID(int=i)) for i in range(count + 20)]
for key in keys[:20]:  # warm-up: every cache filled, every module imported
    request(route, key)
    request(route, key)
os.getppid()  # dump: start-up and warm-up
for key in keys[20:]:
    request(route, key)
os.getppid()  # dump: first executions
for key in keys[20:]:
    request(route, key)
os.getppid()  # dump: replays
"""


def _callgrind(
    tree: Path, route: str, count: int, big: Path, settings: dict[str, Any] | None = None
) -> tuple[float, float]:
    """Instructions per first execution and per replay of ``route``, with ``tree``'s app and
    ``settings`` as ``IDEMPOTENCY``."""
    with tempfile.TemporaryDirectory() as directory:
        worker = Path(directory) / "worker.py"
        worker.write_text(WORKER)
        out = Path(directory) / "callgrind.out"
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--dump-before=getppid",
                f"--callgrind-out-file={out}",
                sys.executable,
                str(worker),
                str(tree),
                str(Path(directory) / "db.sqlite3"),
                str(big),
                route,
                str(count),
                json.dumps(settings or {}),
            ],
            check=True,
            env=env,
            capture_output=True,
        )
        totals = []
        dumps = sorted(Path(directory).glob("callgrind.out.*"), key=lambda p: int(p.suffix[1:]))
        for dump in dumps:
            for line in dump.read_text().splitlines():
                if line.startswith(("summary:", "totals:")):
                    totals.append(int(line.split()[1]))
                    break
    # dumps 2 and 3: the first executions, the replays
    return totals[1] / count, totals[2] / count


def instructions(baseline: Path, count: int) -> None:
    with tempfile.NamedTemporaryFile(suffix=".json") as big:
        big.write(charges(200_000))
        big.flush()
        print(f"\n## instructions per request (callgrind, {count} of each, after a warm-up)")
        print(
            f"{'body':8} {'path':16} {'baseline':>12} {'this tree':>12} {'added':>8} "
            f"{'with keys':>12} {'added':>8}"
        )
        keys = {"ENCRYPTION_KEYS": ["a" * 43 + "="]}
        for route in ("/small/", "/large/"):
            before = _callgrind(baseline, route, count, Path(big.name))
            after = _callgrind(ROOT, route, count, Path(big.name))
            sealed = _callgrind(ROOT, route, count, Path(big.name), keys)
            labels = ("first execution", "replay")
            for label, old, new, key in zip(labels, before, after, sealed, strict=True):
                print(
                    f"{route.strip('/'):8} {label:16} {old:>12,.0f} {new:>12,.0f} "
                    f"{(new - old) / old:>+8.1%} {key:>12,.0f} {(key - old) / old:>+8.1%}"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("parts", nargs="+", choices=["codecs", "sizes", "instructions"])
    parser.add_argument("--baseline", type=Path, help="The source tree to compare with.")
    parser.add_argument("--count", type=int, default=50, help="Requests per phase (default 50).")
    args = parser.parse_args()
    for part in args.parts:
        if part == "codecs":
            codecs()
        elif part == "sizes":
            sizes()
        else:
            if args.baseline is None:
                parser.error("instructions needs --baseline")
            instructions(args.baseline, args.count)


if __name__ == "__main__":
    main()
