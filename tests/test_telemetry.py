"""OpenTelemetry: each outcome counts once in ``idempotency.requests``, spans nest under the
request's span, no attribute carries a key or a scope, and logs carry the same facts.

With OpenTelemetry's SDK (the ``test`` extra): an in-memory metric reader and span exporter on
the global providers, real requests through the test client on a real database.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from django_idempotency import (
    IdempotencyInProgress,
    IdempotencyKey,
    IdempotencyKeyMismatch,
    idempotent_function,
)
from django_idempotency._base.keys import hash_key
from django_idempotency._call import lifecycle, telemetry
from tests.conftest import executions
from tests.test_unavailable import unreachable_store  # noqa: F401  (a fixture)
from tests.testapp.models import Execution

sdk_metrics = pytest.importorskip("opentelemetry.sdk.metrics")
from opentelemetry import metrics, trace  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

pytestmark = pytest.mark.django_db(databases=["default", "unreachable"])

Post = Callable[..., Any]
_reader = InMemoryMetricReader()
_exporter = InMemorySpanExporter()


def _install() -> None:
    """The SDK on the global providers, once per process (OpenTelemetry allows no more)."""
    metrics.set_meter_provider(sdk_metrics.MeterProvider(metric_readers=[_reader]))
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_exporter))
    trace.set_tracer_provider(provider)


_install()


def points(name: str) -> list[Any]:
    data = _reader.get_metrics_data()
    if data is None:
        return []
    return [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        if scope.scope.name == "django_idempotency"
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


def counts() -> Counter[str]:
    """``idempotency.requests`` so far, by outcome (cumulative)."""
    totals: Counter[str] = Counter()
    for point in points("idempotency.requests"):
        totals[point.attributes["idempotency.outcome"]] += point.value
    return totals


class Outcomes:
    """What one block of code added to ``idempotency.requests``."""

    def __init__(self) -> None:
        self.before = counts()
        self.added: Counter[str] = Counter()

    def __enter__(self) -> Outcomes:
        return self

    def __exit__(self, *exc: object) -> None:
        after = counts()
        self.added = Counter(
            {k: after[k] - self.before[k] for k in after if after[k] != self.before[k]}
        )


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    _exporter.clear()
    yield _exporter


def live_again(key: str, *, stale: bool = False) -> None:
    """Put a finished key back in flight, as if another attempt held it (``stale``: crashed)."""
    delta = timedelta(seconds=-1 if stale else 60)
    IdempotencyKey.objects.filter(key_hash=hash_key(key)).update(
        status=IdempotencyKey.Status.PROCESSING,
        lock_token=uuid.uuid4(),
        unlock_at=timezone.now() + delta,
    )


def test_the_api_is_installed_and_enabled() -> None:
    assert telemetry.ENABLED


@pytest.mark.parametrize("path", ["/create/", "/async/", "/drf/", "/atomic/"])
def test_executed_then_replayed(post: Post, key: str, path: str) -> None:
    with Outcomes() as first:
        assert post(path, {"a": 1}, key=key).status_code == 201
    with Outcomes() as second:
        assert post(path, {"a": 1}, key=key)["Idempotent-Replayed"] == "true"
    assert first.added == {"executed": 1}
    assert second.added == {"replayed": 1}


def test_mismatch(post: Post, key: str) -> None:
    post("/create/", {"a": 1}, key=key)
    with Outcomes() as outcomes:
        assert post("/create/", {"a": 2}, key=key).status_code == 422
    assert outcomes.added == {"mismatch": 1}


def test_conflict(post: Post, key: str) -> None:
    post("/create/", {"a": 1}, key=key)
    live_again(key)
    with Outcomes() as outcomes:
        assert post("/create/", {"a": 1}, key=key).status_code == 409
    assert outcomes.added == {"conflict": 1}


def test_waited(post: Post, key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    post("/wait-short/", {"a": 1}, key=key)
    live_again(key)
    sleep = time.sleep

    def other_attempt_finishes(seconds: float) -> None:
        IdempotencyKey.objects.filter(key_hash=hash_key(key)).update(
            status=IdempotencyKey.Status.COMPLETED, lock_token=None, unlock_at=None
        )
        sleep(seconds)

    monkeypatch.setattr(lifecycle.time, "sleep", other_attempt_finishes)
    waits = sum(point.count for point in points("idempotency.wait.duration"))
    with Outcomes() as outcomes:
        assert post("/wait-short/", {"a": 1}, key=key)["Idempotent-Replayed"] == "true"
    assert outcomes.added == {"waited": 1}
    assert sum(point.count for point in points("idempotency.wait.duration")) == waits + 1


def test_takeover_then_executed(post: Post, key: str) -> None:
    post("/create/", {"a": 1}, key=key)
    live_again(key, stale=True)
    with Outcomes() as outcomes:
        assert post("/create/", {"a": 1}, key=key).status_code == 201
    assert outcomes.added == {"takeover": 1, "executed": 1}


@pytest.mark.parametrize("path", ["/status/500/", "/explode/", "/async-explode/"])
def test_released(post: Post, key: str, path: str) -> None:
    # the view's own exception is re-raised by the test client
    with Outcomes() as outcomes, contextlib.suppress(RuntimeError):
        post(path, {"a": 1}, key=key)
    assert outcomes.added == {"released": 1}


def test_invalid_and_missing_key(post: Post) -> None:
    with Outcomes() as invalid:
        assert post("/create/", key="é").status_code == 400
    with Outcomes() as missing:
        assert post("/required/", key=None).status_code == 400
    assert invalid.added == {"invalid_key": 1}
    assert missing.added == {"missing_key": 1}


@pytest.mark.parametrize("path", ["/create/", "/atomic/", "/drf/"])
def test_unavailable(post: Post, key: str, path: str, unreachable_store: None) -> None:  # noqa: F811
    with Outcomes() as outcomes:
        assert post(path, {"a": 1}, key=key).status_code == 503
    assert outcomes.added == {"unavailable": 1}


def test_late_result_refused(key: str) -> None:
    from tests.test_claim import late_owner, send

    with Outcomes() as outcomes:
        send(late_owner(key, []), key)
    assert outcomes.added == {"takeover": 1, "executed": 1, "late_result_refused": 1}


def test_functions_count_the_same_outcomes(key: str) -> None:
    @idempotent_function(key="message_id", name="telemetry.handle")
    def handle(message_id: str, amount: int) -> int:
        Execution.objects.create(label="telemetry")
        if amount < 0:
            raise ValueError("negative")
        return amount

    with Outcomes() as executed:
        assert handle(key, 5) == 5
    with Outcomes() as replayed:
        assert handle(key, 5) == 5
    with Outcomes() as mismatch, pytest.raises(IdempotencyKeyMismatch):
        handle(key, 6)
    live_again(key)
    with Outcomes() as conflict, pytest.raises(IdempotencyInProgress):
        handle(key, 5)
    with Outcomes() as released, pytest.raises(ValueError):
        handle(key + "-other", -1)
    assert [executed.added, replayed.added, mismatch.added, conflict.added, released.added] == [
        {"executed": 1},
        {"replayed": 1},
        {"mismatch": 1},
        {"conflict": 1},
        {"released": 1},
    ]
    assert executions("telemetry") == 1  # in the test's transaction, the raise rolled back
    operations = {p.attributes["idempotency.operation"] for p in points("idempotency.requests")}
    assert "telemetry.handle" in operations


def test_metric_attributes_are_low_cardinality(post: Post, key: str) -> None:
    post("/status/201/", {"a": 1}, key=key)
    post("/status/201/", {"a": 1}, key=key)
    for name in ("idempotency.requests", "idempotency.claim.duration"):
        for point in points(name):
            assert set(point.attributes) <= {
                "idempotency.outcome",
                "idempotency.method",
                "idempotency.operation",
                "idempotency.mode",
            }
            assert_no_secret(point.attributes, key)
    operations = {p.attributes["idempotency.operation"] for p in points("idempotency.requests")}
    assert "status/<int:code>/" in operations  # the route, not the path
    assert "status/201/" not in operations
    assert sum(p.count for p in points("idempotency.claim.duration")) >= 2


def assert_no_secret(attributes: Any, key: str) -> None:
    for name, value in attributes.items():
        assert "key" not in name and "scope" not in name
        text = str(value)
        assert key not in text and hash_key(key)[:12] not in text
        assert "anonymous" not in text  # the default scope


def by_name(spans: InMemorySpanExporter) -> dict[str, list[ReadableSpan]]:
    found: dict[str, list[ReadableSpan]] = {}
    for span in spans.get_finished_spans():
        found.setdefault(span.name, []).append(span)
    return found


@pytest.mark.parametrize("path", ["/create/", "/async/", "/drf/", "/atomic/"])
def test_spans_nest_under_the_request_span(
    post: Post, key: str, path: str, spans: InMemorySpanExporter
) -> None:
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("POST request"):
        post(path, {"a": 1}, key=key)
    with tracer.start_as_current_span("POST retry"):
        post(path, {"a": 1}, key=key)
    found = by_name(spans)
    first, retry = found["POST request"][0], found["POST retry"][0]
    claims = found["idempotency.claim"]
    assert [c.parent.span_id for c in claims if c.parent] == [
        first.context.span_id,
        retry.context.span_id,
    ]
    assert [c.attributes["idempotency.outcome"] for c in claims] == ["claimed", "replayed"]
    assert claims[0].attributes["idempotency.attempt"] == 1
    (stored,) = found["idempotency.store"]  # the replay stores nothing
    assert stored.parent is not None and stored.parent.span_id == first.context.span_id
    assert stored.attributes["idempotency.outcome"] == "executed"
    for span in spans.get_finished_spans():
        assert_no_secret(span.attributes, key)


def test_release_span_and_takeover_attempt(
    post: Post, key: str, spans: InMemorySpanExporter
) -> None:
    post("/create/", {"a": 1}, key=key)
    live_again(key, stale=True)
    post("/create/", {"a": 1}, key=key)
    post("/status/503/", {"a": 1}, key=key + "-b")
    found = by_name(spans)
    takeover = found["idempotency.claim"][1]
    assert takeover.attributes["idempotency.outcome"] == "takeover"
    assert takeover.attributes["idempotency.attempt"] == 2
    assert found["idempotency.store"][1].attributes["idempotency.attempt"] == 2
    (released,) = found["idempotency.release"]
    assert released.attributes["idempotency.outcome"] == "released"


def test_unavailable_claim_span_records_the_error(
    post: Post,
    key: str,
    spans: InMemorySpanExporter,
    unreachable_store: None,  # noqa: F811
) -> None:
    post("/create/", {"a": 1}, key=key)
    (claim,) = by_name(spans)["idempotency.claim"]
    assert claim.attributes["idempotency.outcome"] == "unavailable"
    assert claim.status.status_code is trace.StatusCode.ERROR


def test_log_lines_carry_the_facts(post: Post, key: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="django_idempotency"):
        post("/create/", {"a": 1}, key=key)
        live_again(key, stale=True)
        caplog.clear()
        post("/create/", {"a": 1}, key=key)
        post("/create/", {"a": 2}, key=key)
    ours = [r for r in caplog.records if r.name == "django_idempotency"]
    records = {r.idempotency_outcome: r for r in ours}  # type: ignore[attr-defined]
    assert [r.idempotency_outcome for r in ours] == ["takeover", "executed", "mismatch"]  # type: ignore[attr-defined]
    taken = records["takeover"]
    assert taken.idempotency_key_hash == hash_key(key)[:12]  # type: ignore[attr-defined]
    assert taken.idempotency_scope_hash == telemetry.sha256_hex("anonymous")[:12]  # type: ignore[attr-defined]
    assert taken.idempotency_attempt == 2  # type: ignore[attr-defined]
    assert len(taken.idempotency_lock_token) == 8  # type: ignore[attr-defined]
    # the same attempt's lines: one lock token
    assert records["executed"].idempotency_lock_token == taken.idempotency_lock_token  # type: ignore[attr-defined]
    assert records["mismatch"].idempotency_attempt is None  # type: ignore[attr-defined]
    for record in ours:
        assert key not in record.getMessage()


def _run_alone(script: str) -> str:
    """Run ``script`` in a Python of its own (on SQLite in memory: no test database to share),
    where OpenTelemetry's state is its own: what it printed."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    env.pop("DATABASE_URL", None)
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_without_opentelemetry_nothing_is_imported() -> None:
    """A process where ``import opentelemetry`` fails: the app runs and imports none of it."""
    script = """
import sys
sys.modules["opentelemetry"] = None  # blocks the import
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django.test import Client
from django_idempotency._call import telemetry as _telemetry
assert not _telemetry.ENABLED
client = Client()
headers = {"Idempotency-Key": "no-otel-key"}
def post():
    return client.post("/create/", {}, content_type="application/json", headers=headers)
assert post().status_code == 201
replay = post()
assert replay["Idempotent-Replayed"] == "true"
loaded = [name for name in sys.modules if name.startswith("opentelemetry") and sys.modules[name]]
assert not loaded, loaded
print("ok")
"""
    output = _run_alone(script)
    assert output == "ok"


def test_without_a_provider_no_span_is_started_nor_measurement_made() -> None:
    """With the API installed and no SDK configured, a protected request calls none of the
    API's no-op instruments (issue 28); once providers are set, the same process records."""
    script = """
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django.test import Client
from django_idempotency._call import telemetry as _telemetry
assert _telemetry.ENABLED
def refuse(*args, **kwargs):
    raise AssertionError("an OpenTelemetry call without a provider")
tracer, counter, histogram = _telemetry._tracer, _telemetry._requests, _telemetry._claim_duration
for instrument, name in ((tracer, "start_span"), (counter, "add"), (histogram, "record")):
    setattr(instrument, name, refuse)
client = Client()
def post(key):
    return client.post("/create/", {}, content_type="application/json",
                       headers={"Idempotency-Key": key})
assert post("no-provider").status_code == 201
assert post("no-provider")["Idempotent-Replayed"] == "true"
for instrument, name in ((tracer, "start_span"), (counter, "add"), (histogram, "record")):
    delattr(instrument, name)
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
reader, exporter = InMemoryMetricReader(), InMemorySpanExporter()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
assert post("with-provider").status_code == 201
spans = sorted({span.name for span in exporter.get_finished_spans()})
names = sorted(metric.name for resource in reader.get_metrics_data().resource_metrics
               for scope in resource.scope_metrics for metric in scope.metrics)
print(spans, names)
"""
    output = _run_alone(script)
    assert output == (
        "['idempotency.claim', 'idempotency.store'] "
        "['idempotency.claim.duration', 'idempotency.requests']"
    )


def test_every_log_line_of_the_app_carries_the_fields(
    post: Post, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    fields = {
        "idempotency_outcome",
        "idempotency_key_hash",
        "idempotency_scope_hash",
        "idempotency_attempt",
        "idempotency_lock_token",
    }
    with caplog.at_level(logging.DEBUG, logger="django_idempotency"):
        post("/create/", {"a": 1}, key=key)
        post("/create/", {"a": 1}, key=key)
        with override_settings(IDEMPOTENCY={"MAX_BODY_SIZE": 10}):
            post("/large/", {"a": 1}, key=key + "-large")
        post("/status/500/", {"a": 1}, key=key + "-500")
        post("/create/", key="é")
        live_again(key, stale=True)
        call_command("idempotency_recover", "--release", stdout=io.StringIO())
    ours = [r for r in caplog.records if r.name == "django_idempotency"]
    outcomes = [r.idempotency_outcome for r in ours]  # type: ignore[attr-defined]
    assert {"claimed", "executed", "replayed", "body_not_stored", "released"} <= set(outcomes)
    assert {"invalid_key", "recovered"} <= set(outcomes)
    for record in ours:
        assert fields <= set(vars(record)), record.getMessage()


@pytest.mark.django_db(transaction=True)
def test_the_relay_gauges_the_outbox_backlog() -> None:
    """Issue 41: after each pass the relay sets the undelivered messages by state and the
    oldest one's age."""
    from datetime import timedelta

    from django.utils import timezone

    from django_idempotency import IdempotencyKey
    from django_idempotency._ops.relay import Relay
    from django_idempotency.models import OutboxMessage

    record = IdempotencyKey.objects.create(
        scope="s",
        key_hash="h" * 64,
        method="POST",
        path="/",
        request_hash="r",
        expires_at=timezone.now() + timedelta(hours=1),
    )
    OutboxMessage.objects.create(
        record=record,
        message_id="m1",
        engine="celery",
        task="t",
        arguments="{}",
        state="failed",
        released_at=timezone.now() - timedelta(hours=1),
    )
    Relay("default").run(once=True)
    pending = {
        p.attributes["idempotency.outbox.state"]: p.value
        for p in points("idempotency.outbox.pending")
    }
    assert pending == {"pending": 0, "failed": 1}
    [age] = points("idempotency.outbox.oldest_age")
    assert 3600 <= age.value < 3700


def test_every_instrument_is_documented_with_its_kind() -> None:
    """docs/observability.rst lists each instrument the app creates (SPEC section 1's metrics,
    the outbox's gauges of issue 41 among them) as ``name`` (kind): a new one, or a renamed
    one, fails here until the docs say so."""
    import re
    from pathlib import Path

    from django_idempotency._call import telemetry as module

    source = Path(module.__file__).read_text()
    created = re.findall(r'create_(counter|histogram|gauge)\(\s*"([a-z_.]+)"', source)
    assert {name for _, name in created} >= {
        "idempotency.outbox.pending",
        "idempotency.outbox.oldest_age",
    }
    docs = (Path(__file__).resolve().parent.parent / "docs" / "observability.rst").read_text()
    for kind, name in created:
        assert re.search(rf"^``{re.escape(name)}`` \({kind}\b", docs, re.MULTILINE), name
