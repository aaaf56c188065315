"""One protected call from start to end, written once for every entry point.

Claim (or answer without running), run the protected code, then store its result or release
the claim: :func:`steps` is that state machine as a generator, and :func:`run` and
:func:`arun` drive it, sync and async; :func:`wrap` makes the one wrapper of a decorated view or
function, sync or async as it is. The generator yields the seconds a waiting claim sleeps and
:data:`RUN` when the protected code is due; the driver runs it (a call, or an ``await``) and
sends its result back, or throws its exception in. An :class:`Adapter` supplies only what
differs between the view decorator, the DRF mixin and ``idempotent_function``: its policy,
where the key comes from, and how a found record, a result or a refusal becomes what the caller
gets.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_idempotency._base.errors import LockLost, LockWaitTimeout, StoreUnavailable
from django_idempotency._call import claiming, heartbeat, writing
from django_idempotency._call.attempt import Attempt
from django_idempotency._call.claim import Claim
from django_idempotency._call.identity import Identity
from django_idempotency._conf.options import Policy
from django_idempotency._conf.values import DATABASE
from django_idempotency._store import served

R = TypeVar("R")
T = TypeVar("T")


@dataclass(frozen=True)
class Answer(Generic[R]):
    """What the caller gets instead of running the protected code: a replay, a problem."""

    value: R


class _Run:
    """Yielded by :func:`steps` when the protected code is due."""


RUN = _Run()
#: The app's own exceptions that may stop two-phase protected code after its claim
#: (:meth:`.Claim.set_recovery_point`'s); each an answer of the adapter's.
INTERRUPTIONS = (StoreUnavailable, LockWaitTimeout, LockLost)
Interruption = StoreUnavailable | LockWaitTimeout | LockLost
Step = float | _Run
_UNKNOWN: Any = object()


class Adapter(Generic[R]):
    """What one entry point adds to the lifecycle; one instance per protected call."""

    #: Whether the claim is made inside the protected code (DRF claims after authentication,
    #: in ``initial()``) rather than before it; :attr:`claim` is then read after it ran.
    claims_inside = False
    #: What signal receivers get as ``request`` (:attr:`.Attempt.request`): the view
    #: adapter's ``HttpRequest``; ``None`` for a function.
    request: object = None

    def __init__(self) -> None:
        #: Set by :func:`run` or :func:`arun` (``None``: the call runs unprotected).
        self.policy: Policy | None = None
        #: The attempt a claim was asked for (what the reports are about), and its claim.
        self.attempt: Attempt | None = None
        #: Atomic mode's: the connection whose transaction the call runs in.
        self.connection: BaseDatabaseWrapper | None = None
        self._identified: Identity | Answer[R] | None = _UNKNOWN

    @property
    def claim(self) -> Claim | None:
        """The claim the protected code runs with (``None``: it runs without one)."""
        attempt = self.attempt
        return None if attempt is None else attempt.claim

    def resolve(self, *, asynchronous: bool) -> Policy | None:
        """The policy of this call; ``None``: run the protected code as if undecorated."""
        raise NotImplementedError

    def identify(self, policy: Policy) -> Identity | Answer[R] | None:
        """The call's identity, an answer without one (a bad key), or ``None``: run the
        protected code unprotected. Called through :meth:`identified`, once per call."""
        raise NotImplementedError

    def identified(self, policy: Policy) -> Identity | Answer[R] | None:
        """:meth:`identify`, computed once: the scope and fingerprint functions are the
        project's, run once per call whatever happens to the claim."""
        if self._identified is _UNKNOWN:
            self._identified = self.identify(policy)
        return self._identified

    def hold(self, claim: Claim | None) -> None:
        """Hand the protected code its claim (``None``: it runs without one)."""

    def found(self, found: claiming.Found) -> Answer[R]:
        """The answer when another call's record holds the key (or raise)."""
        raise NotImplementedError

    def misconfigured(self, exc: ImproperlyConfigured) -> R:
        """What the caller gets when the policy cannot be made (a setting that can never work:
        :func:`._conf.usable`), before anything is claimed or run (or raise)."""
        raise exc

    def refused(self, exc: StoreUnavailable | LockWaitTimeout, policy: Policy) -> Answer[R]:
        """The answer when the store cannot claim (or raise); ``policy.atomic``: the error
        ended the whole transaction."""
        raise exc

    def interrupted(self, exc: Interruption) -> Answer[R]:
        """The answer when the protected code stopped on the app's own exception after its
        claim (a recovery point the store could not save, a lock lost), or raise it."""
        raise exc

    def finish(self, attempt: Attempt, result: R) -> R:
        """Store the protected code's result (or release the attempt's claim) and return
        what the caller gets."""
        raise NotImplementedError

    def arguments(self, kwargs: dict[str, Any], claim: Claim | None) -> dict[str, Any]:
        """The keyword arguments the protected code is called with."""
        return kwargs

    def unprotected(self, result: Any) -> R:
        """What the caller gets from protected code run without a claim (no policy, or no
        key where it is optional)."""
        return result  # type: ignore[no-any-return]

    def unprotected_in_thread(self) -> bool:
        """Whether :meth:`unprotected` has database or broker work to do (async code runs it
        in a thread)."""
        return False


def wrap(
    func: Callable[..., Any],
    adapter: Callable[[tuple[Any, ...], dict[str, Any]], Adapter[Any]],
    *,
    label: str,
    kind: str,
    atomic: bool,
) -> Callable[..., Any]:
    """The wrapper of a decorated view or function: ``async def`` for a coroutine function,
    ``def`` otherwise, both driving the same lifecycle with an ``adapter(args, kwargs)`` made
    for each call. Atomic mode needs a sync ``kind``."""
    if not iscoroutinefunction(func):

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            call = adapter(args, kwargs)
            return run(call, lambda claim: func(*args, **call.arguments(kwargs, claim)))

        return wrapper
    if atomic:
        raise ImproperlyConfigured(
            f"{label}: atomic=True needs a sync {kind}; Django's transactions cannot span an "
            f"async {kind}."
        )

    async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
        call = adapter(args, kwargs)
        return await arun(call, lambda claim: func(*args, **call.arguments(kwargs, claim)))

    return async_wrapper


def narrow_store(policy: Policy) -> ImproperlyConfigured | None:
    """E034's error, in its words, when the MySQL or MariaDB database the policy claims on
    would fold or refuse a scope (a session or table not ``utf8mb4``: two tenants one record);
    asked once per database settings (:func:`.charsets.known_narrow`), ``None`` elsewhere, or
    when the database does not answer now (the claim meets that and says so)."""
    if policy.store != DATABASE:
        return None
    store = served(policy.alias)
    if store is None or store.features.keeps_every_scope:  # none: the claim meets it, and says so
        return None
    from django_idempotency._conf.settings import words
    from django_idempotency._store import charsets, deadlines

    try:
        # Bounded as the app's statements are, and by the least of their deadlines: on a
        # silenced connection it gives up within a second (asked again next time), and the
        # claim meets the fault within its own bound (unbounded, a blackholed MariaDB
        # connection held the request past 26 s).
        found = store.narrow_charsets(deadlines.LEAST)
    except DatabaseError:
        return None
    if found is None:
        return None
    message = charsets.error(policy.alias, found)
    return None if message.is_silenced() else ImproperlyConfigured(words(message))


def begin(adapter: Adapter[R], policy: Policy) -> claiming.Steps[Answer[R] | Claim | None]:
    """Claim the adapter's identity, or say what to answer instead."""
    identity = adapter.identified(policy)
    if not isinstance(identity, Identity):
        return identity
    if (narrow := narrow_store(policy)) is not None:
        return Answer(adapter.misconfigured(narrow))
    attempt = adapter.attempt = Attempt(identity, policy, adapter.request)
    try:
        outcome = yield from claiming.acquire(attempt)
    except (LockWaitTimeout, StoreUnavailable) as exc:
        if policy.atomic:
            # The transaction is broken: run() answers outside it, or starts it again on a new
            # connection.
            raise
        return adapter.refused(exc, policy)
    if isinstance(outcome, Claim):
        heartbeat.start(attempt)
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
    except Exception as exc:  # a dying process (SystemExit...) is a crash: recovered later
        # A lost lock is not this attempt's to release: another owns the record.
        if adapter.claim is not None and not isinstance(exc, LockLost):
            assert adapter.attempt is not None
            writing.release(adapter.attempt, reason="exception", raised=True)
        raise
    attempt = adapter.attempt
    if attempt is None or attempt.claim is None:
        return adapter.unprotected(result)
    return adapter.finish(attempt, result)


def run(adapter: Adapter[R], call: Callable[[Claim | None], R]) -> R:
    """Drive the lifecycle synchronously; atomic mode runs it in one transaction.

    In atomic mode a duplicate's claim waits on the first call's uncommitted row, at most
    ``wait_timeout``, and a crash rolls everything back and leaves no record behind. A claim
    that met a fault on a connection it left unusable (a pooled or persistent connection a
    restart killed, one cut at its bound) is made again in a new transaction on a new
    connection, the view not having run (:func:`.claiming.claim_again`).
    """
    try:
        policy = adapter.policy = adapter.resolve(asynchronous=False)
    except ImproperlyConfigured as exc:
        return adapter.misconfigured(exc)
    if policy is None:
        return adapter.unprotected(call(None))
    if not policy.atomic:
        try:
            return run_steps(steps(adapter, policy), lambda: call(adapter.claim))
        except INTERRUPTIONS as exc:
            return adapter.interrupted(exc).value
    answer = _answered_before(adapter, policy)
    if answer is not None:
        return answer.value
    refusal: StoreUnavailable | LockWaitTimeout
    try:
        for tries in range(claiming.RECONNECTS + 1):
            try:
                with claiming.atomic_attempt(policy) as adapter.connection:
                    return run_steps(steps(adapter, policy), lambda: call(adapter.claim))
            except (StoreUnavailable, LockWaitTimeout) as exc:
                refusal = exc
            if not (
                isinstance(refusal, StoreUnavailable)
                and adapter.claim is None  # the view has not run
                and not adapter.claims_inside
                and not isinstance(refusal, claiming.Unreachable)  # connecting again would fail too
                and tries < claiming.RECONNECTS
                and claiming.claim_again(policy, connections[policy.alias], refusal)
            ):
                break
    finally:
        if adapter.claim is not None:  # its transaction ended: committed or rolled back
            assert adapter.attempt is not None
            claiming.let_go(adapter.attempt)
    if adapter.attempt is None:  # refused before the claim: connecting, SQLite's BEGIN
        refusal = _refused_before_claim(adapter, policy, refusal)
    return adapter.refused(refusal, policy).value


def _refused_before_claim(
    adapter: Adapter[R], policy: Policy, refusal: StoreUnavailable | LockWaitTimeout
) -> StoreUnavailable | LockWaitTimeout:
    """An atomic attempt refused before its claim is reported as a claim's refusal would be,
    its key known: a wait for SQLite's write lock while this process holds the key is a
    ``409``, as a wait on a server's row lock is (:func:`.claiming.held_here`)."""
    identity = adapter.identified(policy)
    if isinstance(identity, Identity):
        attempt = Attempt(identity, policy, adapter.request)
        if isinstance(refusal, StoreUnavailable):
            refusal = claiming.held_here(attempt, refusal)
        claiming.refused(attempt, refusal)
    return refusal


def _answered_before(adapter: Adapter[R], policy: Policy) -> Answer[R] | None:
    """Atomic mode's answer from a finished record, read before its transaction opens (a
    replay, a mismatch: :func:`.claiming.finished`); ``None``: run the transaction,
    whose :func:`begin` makes the attempt that claims."""
    if adapter.claims_inside:
        return None
    identity = adapter.identified(policy)
    if not isinstance(identity, Identity):
        return None  # answered (a bad key) or run unprotected, as before
    if (narrow := narrow_store(policy)) is not None:  # before a replay read by a folded scope
        return Answer(adapter.misconfigured(narrow))
    attempt = Attempt(identity, policy, adapter.request)
    found = claiming.finished(attempt)
    if found is None:
        return None
    adapter.attempt = attempt
    return adapter.found(found)


def run_steps(lifecycle: Generator[Step, Any, T], call: Callable[[], Any] | None = None) -> T:
    """Drive a generator of this module or of the claim loop synchronously; ``call`` runs the
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
        except BaseException:
            abandon(lifecycle)
            raise


async def arun(adapter: Adapter[R], call: Callable[[Claim | None], Awaitable[R]]) -> R:
    """Drive it from async code: database work in a thread, sleeping and the protected
    coroutine on the event loop. Always two-phase: no transaction spans an ``await``."""
    try:
        policy = adapter.policy = adapter.resolve(asynchronous=True)
    except ImproperlyConfigured as exc:
        return adapter.misconfigured(exc)
    if policy is None:
        return await _unprotected(adapter, await call(None))
    try:
        return await _arun_steps(adapter, policy, call)
    except INTERRUPTIONS as exc:
        return adapter.interrupted(exc).value


async def _arun_steps(
    adapter: Adapter[R], policy: Policy, call: Callable[[Claim | None], Awaitable[R]]
) -> R:
    lifecycle = steps(adapter, policy)
    advance = sync_to_async(_advance)
    sent: Any = None
    thrown: Exception | None = None
    while True:
        try:
            done, step = await advance(lifecycle, sent, thrown)
        except asyncio.CancelledError:
            # Cancelled while a step ran in its thread (the claim, say), which goes on: the
            # lifecycle is ended there once that step is done, before the task ends, so that a
            # claim made meanwhile is not renewed for a task that is gone.
            await asyncio.shield(sync_to_async(abandon)(lifecycle))
            raise
        if done:
            return step  # type: ignore[no-any-return]
        sent = thrown = None
        if not isinstance(step, _Run):
            await asyncio.sleep(step)
        elif adapter.claim is None:
            # Unprotected: nothing to store, no thread to enter unless the code staged messages.
            return await _unprotected(adapter, await call(None))
        else:
            try:
                sent = await call(adapter.claim)
            except Exception as exc:  # handed to the lifecycle, which re-raises it
                thrown = exc
            except BaseException:  # a cancelled task
                abandon(lifecycle)
                raise


async def _unprotected(adapter: Adapter[R], result: Any) -> R:
    if adapter.unprotected_in_thread():
        return await sync_to_async(adapter.unprotected)(result)
    return adapter.unprotected(result)


def abandon(lifecycle: Generator[Any, Any, Any]) -> None:
    """End a lifecycle whose protected code died (``SystemExit``, a cancelled task, a test's
    crash): its ``finally`` stops the lock's renewal now. Left to the garbage collector, it
    would run only once the traceback the caller keeps, which holds the lifecycle, is
    collected: until then the renewer kept a dead attempt's key locked. Nothing else happens:
    the record stays ``processing``, to be taken over once its lock expires."""
    lifecycle.close()


def _advance(
    lifecycle: Generator[Any, Any, Any], sent: Any, thrown: Exception | None
) -> tuple[bool, Any]:
    try:
        step = lifecycle.send(sent) if thrown is None else lifecycle.throw(thrown)
    except StopIteration as stop:
        return True, stop.value
    return False, step
