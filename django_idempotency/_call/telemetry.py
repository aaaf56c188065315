"""OpenTelemetry metrics and spans, and the facts every log line carries.

OpenTelemetry is optional (the ``otel`` extra): without ``opentelemetry-api`` nothing is
imported and every function here returns at once. With it, the instruments come from the
global providers, and an application that never configures an SDK pays not even the API's
no-op calls: no span is started and no measurement made while no provider is set.
Attributes are low-cardinality on purpose: the outcome, the method, the operation (the URL
route, or the function's name) and the mode; never the key or the scope.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from django_idempotency._store.limits import sha256_hex

try:
    from opentelemetry import metrics, trace
except ImportError:  # the otel extra is not installed
    metrics = trace = None  # type: ignore[assignment]

NAME = "django_idempotency"

#: Every value of the ``idempotency.outcome`` attribute of ``idempotency.requests``.
OUTCOMES = frozenset(
    {
        "executed",
        "replayed",
        "conflict",
        "waited",
        "mismatch",
        "invalid_key",
        "invalid_scope",
        "missing_key",
        "released",
        "takeover",
        "late_result_refused",
        "unavailable",
    }
)

if metrics is not None and trace is not None:
    _meter = metrics.get_meter(NAME)
    _tracer: Any = trace.get_tracer(NAME)
    _requests: Any = _meter.create_counter(
        "idempotency.requests", unit="{request}", description="Protected calls by outcome."
    )
    _claim_duration: Any = _meter.create_histogram(
        "idempotency.claim.duration", unit="s", description="Time to claim a key or find it live."
    )
    _wait_duration: Any = _meter.create_histogram(
        "idempotency.wait.duration",
        unit="s",
        description="Time a wait-mode retry waited for the attempt in flight.",
    )
    #: The outbox's backlog, set by the relay after each pass.
    _outbox_pending: Any = _meter.create_gauge(
        "idempotency.outbox.pending", unit="{message}", description="Undelivered messages."
    )
    _outbox_age: Any = _meter.create_gauge(
        "idempotency.outbox.oldest_age",
        unit="s",
        description="Age of the oldest undelivered outbox message (0: none).",
    )
    ENABLED = True
else:
    ENABLED = False


def _tracing() -> bool:
    """Whether a span would be recorded. Until an application sets a tracer provider (an
    SDK's), the API's proxy tracer hands out no-op spans; this asks what the proxy asks (is a
    global provider set?) without a span's calls, so an application that never configures an
    SDK pays nothing per request. A tracer that is not the proxy always records."""
    return not isinstance(_tracer, trace.ProxyTracer) or (
        getattr(trace, "_TRACER_PROVIDER", _tracer) is not None
    )


def _metering(instrument: Any) -> bool:
    """Whether ``instrument`` records: the API's proxy instrument drops every measurement
    until a meter provider is set, which gives it a real instrument (the same test it makes)."""
    return getattr(instrument, "_real_instrument", instrument) is not None


def labels(method: str, operation: str, atomic: bool) -> dict[str, str]:
    """The attributes every instrument and span gets."""
    return {
        "idempotency.method": method,
        "idempotency.operation": operation,
        "idempotency.mode": "atomic" if atomic else "two_phase",
    }


def count(outcome: str, attributes: dict[str, str]) -> None:
    """Count one outcome (one of :data:`OUTCOMES`) in ``idempotency.requests``."""
    if counting():
        _requests.add(1, {**attributes, "idempotency.outcome": outcome})


def counting() -> bool:
    """Whether :func:`count` records (ask first where its attributes cost something to make)."""
    return ENABLED and _metering(_requests)


def gauging_outbox() -> bool:
    """Whether :func:`outbox_backlog` records (the relay reads the backlog only then)."""
    return ENABLED and _metering(_outbox_pending)


def outbox_backlog(pending: int, failed: int, oldest_age: float) -> None:
    """The outbox's backlog: pending and failed messages (``idempotency.outbox.state``), and
    the oldest undelivered one's age in seconds."""
    _outbox_pending.set(pending, {"idempotency.outbox.state": "pending"})
    _outbox_pending.set(failed, {"idempotency.outbox.state": "failed"})
    _outbox_age.set(oldest_age)


def record_wait(seconds: float, attributes: dict[str, str]) -> None:
    if ENABLED and _metering(_wait_duration):
        _wait_duration.record(seconds, attributes)


def log_facts(
    outcome: str,
    key_hash: str = "",
    scope: str = "",
    attempt: int | None = None,
    lock_token: uuid.UUID | str | None = None,
) -> dict[str, Any]:
    """The ``extra`` of a log line: what a JSON formatter shows (docs: "Observability")."""
    return {
        "idempotency_outcome": outcome,
        "idempotency_key_hash": key_hash[:12],
        "idempotency_scope_hash": sha256_hex(scope)[:12] if scope else "",
        "idempotency_attempt": attempt,
        "idempotency_lock_token": str(lock_token)[:8] if lock_token else "",
    }


class Span:
    """One span of the app (or nothing without OpenTelemetry); see :func:`span`."""

    def __init__(self, otel_span: Any) -> None:
        self._span = otel_span
        self.outcome = ""

    def finish(self, outcome: str, attempt: int | None = None) -> None:
        """Set the span's outcome and the attempt number."""
        self.outcome = outcome
        if self._span is not None:
            self._span.set_attribute("idempotency.outcome", outcome)
            if attempt is not None:
                self._span.set_attribute("idempotency.attempt", attempt)


class _Unrecorded(Span):
    """The span of a call nothing records: one for every call, and its own context manager
    (a generator's would cost each protected call more than the rest of this module)."""

    def __init__(self) -> None:
        super().__init__(None)

    def finish(self, outcome: str, attempt: int | None = None) -> None:
        pass

    def __enter__(self) -> Span:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


_UNRECORDED = _Unrecorded()


def span(
    name: str, method: str, operation: str, atomic: bool, *, duration: bool = False
) -> AbstractContextManager[Span]:
    """A child of the current span (the request's, under Django's instrumentation), with the
    :func:`labels` of a call (made only if something records them): plain values, so that
    telemetry knows no type of the layers that use it.

    It is not made current: the claim loop's generators yield inside it and may resume in another
    thread, where a context attached here could not be detached. ``duration`` records it in
    ``idempotency.claim.duration``.
    """
    tracing = ENABLED and _tracing()
    timed = duration and ENABLED and _metering(_claim_duration)
    if not (tracing or timed):
        return _UNRECORDED
    return _recorded(name, labels(method, operation, atomic), tracing=tracing, timed=timed)


@contextmanager
def _recorded(
    name: str, attributes: dict[str, str], *, tracing: bool, timed: bool
) -> Iterator[Span]:
    started = time.monotonic()
    otel_span = _tracer.start_span(name, attributes=attributes) if tracing else None
    result = Span(otel_span)
    try:
        yield result
    except BaseException as exc:
        if otel_span is not None:
            otel_span.record_exception(exc)
            otel_span.set_status(trace.StatusCode.ERROR, type(exc).__name__)
        raise
    finally:
        if otel_span is not None:
            otel_span.end()
        if timed:
            _claim_duration.record(
                time.monotonic() - started,
                {**attributes, "idempotency.outcome": result.outcome or "error"},
            )
