"""One protected call from start to end, written once for every entry point.

Claim (or answer without running), run the protected code, then store its result or release
the claim: :func:`steps` is that state machine as a generator, and :func:`run` and
:func:`arun` drive it, sync and async. It yields the seconds a waiting claim sleeps and
:data:`RUN` when the protected code is due; the driver runs it (a call, or an ``await``) and
sends its result back, or throws its exception in. An :class:`Adapter` supplies only what
differs between the view decorator, the DRF mixin and ``idempotent_function``: where the key
comes from, and how a found record, a result or a refusal becomes what the caller gets.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.core.exceptions import ImproperlyConfigured

from django_idempotency import _engine as engine
from django_idempotency import _heartbeat as heartbeat
from django_idempotency._options import Policy
from django_idempotency.claim import Claim
from django_idempotency.exceptions import LockWaitTimeout, StoreUnavailable

R = TypeVar("R")
T = TypeVar("T")


@dataclass(frozen=True)
class Answer(Generic[R]):
    """What the caller gets instead of running the protected code: a replay, a problem."""

    value: R


class _Run:
    """Yielded by :func:`steps` when the protected code is due."""


RUN = _Run()
Step = float | _Run


class Adapter(Generic[R]):
    """What one entry point adds to the lifecycle; one instance per protected call."""

    #: Whether the claim is made inside the protected code (DRF claims after authentication,
    #: in ``initial()``) rather than before it; :attr:`claim` is then read after it ran.
    claims_inside = False

    def __init__(self) -> None:
        self.claim: Claim | None = None
        #: The attempt :func:`begin` claimed for (what the engine's reports are about).
        self.subject: engine.Attempt | None = None

    def attempt(self, policy: Policy) -> engine.Attempt | Answer[R] | None:
        """The attempt to claim, an answer without one (a bad key), or ``None``: run the
        protected code unprotected."""
        raise NotImplementedError

    def hold(self, claim: Claim | None) -> None:
        """Keep the claim the protected code runs with (``None``: it runs without one)."""
        self.claim = claim

    def found(self, found: engine.Found) -> Answer[R]:
        """The answer when another attempt's record holds the key (or raise)."""
        raise NotImplementedError

    def refused(self, exc: StoreUnavailable | LockWaitTimeout, policy: Policy) -> Answer[R]:
        """The answer when the store cannot claim (or raise); ``policy.atomic``: the error
        ended the whole transaction."""
        raise exc

    def finish(self, claim: Claim, result: R, policy: Policy) -> R:
        """Store the protected code's result (or release the claim) and return what the
        caller gets."""
        raise NotImplementedError


def is_async(func: Callable[..., Any], label: str, kind: str, *, atomic: bool) -> bool:
    """Whether ``func`` is driven by :func:`arun`; atomic mode needs a sync ``kind``."""
    if not iscoroutinefunction(func):
        return False
    if atomic:
        raise ImproperlyConfigured(
            f"{label}: atomic=True needs a sync {kind}; Django's transactions cannot span an "
            f"async {kind}."
        )
    return True


def begin(adapter: Adapter[R], policy: Policy) -> engine.Steps[Answer[R] | Claim | None]:
    """Claim the adapter's attempt, or say what to answer instead."""
    attempt = adapter.attempt(policy)
    if not isinstance(attempt, engine.Attempt):
        return attempt
    adapter.subject = attempt
    try:
        outcome = yield from engine.acquire(attempt, policy)
    except LockWaitTimeout as exc:
        if policy.atomic:
            raise  # the transaction is broken: run() answers outside it
        return adapter.refused(exc, policy)
    except StoreUnavailable as exc:
        return adapter.refused(exc, policy)
    if isinstance(outcome, Claim):
        heartbeat.start(outcome, policy, attempt.request)
        return outcome
    return adapter.found(outcome)


def steps(adapter: Adapter[R], policy: Policy) -> Generator[Step, Any, R]:
    """The lifecycle of one protected call; see the module's docstring."""
    if not adapter.claims_inside:
        decision = yield from begin(adapter, policy)
        if isinstance(decision, Answer):
            return decision.value
        adapter.hold(decision)
    try:
        try:
            result = yield RUN
        finally:  # before the final write, and when abandoned (a cancelled task, a dying process)
            heartbeat.stop(adapter.claim)
    except Exception:  # a dying process (SystemExit...) is a crash: recovered later
        if adapter.claim is not None:
            assert adapter.subject is not None
            engine.abort(adapter.claim, policy, adapter.subject, reason="exception")
        raise
    if adapter.claim is None:
        return result  # type: ignore[no-any-return]
    return adapter.finish(adapter.claim, result, policy)


def run(adapter: Adapter[R], policy: Policy, call: Callable[[Claim | None], R]) -> R:
    """Drive the lifecycle synchronously; atomic mode runs it in one transaction.

    In atomic mode a duplicate's claim waits on the first attempt's uncommitted row, at most
    ``wait_timeout``, and a crash rolls everything back and leaves no record behind.
    """
    if not policy.atomic:
        return run_steps(steps(adapter, policy), lambda: call(adapter.claim))
    try:
        with engine.atomic_attempt(policy):
            return run_steps(steps(adapter, policy), lambda: call(adapter.claim))
    except (StoreUnavailable, LockWaitTimeout) as exc:
        if adapter.subject is None:  # the store's database refused the connection
            attempt = adapter.attempt(policy)
            if isinstance(attempt, engine.Attempt):
                engine.refused(attempt, policy, exc)
        return adapter.refused(exc, policy).value


def run_steps(lifecycle: Generator[Step, Any, T], call: Callable[[], Any] | None = None) -> T:
    """Drive a generator of this module or of the engine synchronously; ``call`` runs the
    protected code when it is due."""
    sent: Any = None
    thrown: Exception | None = None
    while True:
        done, step = _advance(lifecycle, sent, thrown)
        if done:
            return step  # type: ignore[no-any-return]
        sent = thrown = None
        if not isinstance(step, _Run):
            time.sleep(step)
            continue
        assert call is not None, "a lifecycle needs the protected code to run"
        try:
            sent = call()
        except Exception as exc:  # handed to the lifecycle, which re-raises it
            thrown = exc


async def arun(
    adapter: Adapter[R], policy: Policy, call: Callable[[Claim | None], Awaitable[R]]
) -> R:
    """Drive it from async code: database work in a thread, sleeping and the protected
    coroutine on the event loop. Always two-phase: no transaction spans an ``await``."""
    lifecycle = steps(adapter, policy)
    advance = sync_to_async(_advance)
    sent: Any = None
    thrown: Exception | None = None
    while True:
        done, step = await advance(lifecycle, sent, thrown)
        if done:
            return step  # type: ignore[no-any-return]
        sent = thrown = None
        if not isinstance(step, _Run):
            await asyncio.sleep(step)
        elif adapter.claim is None:
            return await call(None)  # unprotected: nothing to store, no thread to enter
        else:
            try:
                sent = await call(adapter.claim)
            except Exception as exc:  # handed to the lifecycle, which re-raises it
                thrown = exc


def _advance(
    lifecycle: Generator[Any, Any, Any], sent: Any, thrown: Exception | None
) -> tuple[bool, Any]:
    try:
        step = lifecycle.send(sent) if thrown is None else lifecycle.throw(thrown)
    except StopIteration as stop:
        return True, stop.value
    return False, step
