"""Helpers for a project's own tests of its protected views and functions (``docs/testing.rst``).

Plain functions, for pytest and unittest alike; the pytest plugin (:mod:`._pytest_plugin`) adds
two fixtures. The key states (:func:`hold_key`, :func:`stale_key`, :func:`expire_key`) are made
for a request as the app will see it: the view is found by its path, and the key, scope and
fingerprint are computed by the app's own code with the view's own options, then claimed
through the store. No row is written by hand, so the records cannot drift from the app's.
"""

from __future__ import annotations

import asyncio
import difflib
import importlib
import json
import re
import secrets
import string
import threading
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from datetime import timedelta
from typing import Any, Literal, TypeVar, overload

from django.apps import apps
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponseBase
from django.test import RequestFactory
from django.urls import Resolver404, resolve

from django_idempotency._base.keys import ANY, MAX_KEY_LENGTH, KeyFormat, hash_key
from django_idempotency._call.claim import Claim
from django_idempotency._call.identity import Identity
from django_idempotency._call.lifecycle import Answer
from django_idempotency._conf.options import Options, Policy
from django_idempotency._conf.settings import conf
from django_idempotency._conf.values import store_alias
from django_idempotency._http import adapter as protocol
from django_idempotency._http import responses
from django_idempotency._publish.policy import view_options
from django_idempotency._store import using
from django_idempotency.models import IdempotencyKey

__all__ = [
    "assert_replayed",
    "concurrently",
    "expire_key",
    "hold_key",
    "key_records",
    "new_key",
    "outbox_sent",
    "stale_key",
]

T = TypeVar("T")

#: A protected request or call: ``"POST", "/orders/", data`` (with ``user=`` and the test
#: client's keyword arguments), an ``HttpRequest``, or an ``idempotent_function`` and its
#: arguments.
Target = str | HttpRequest | Callable[..., Any]

#: Methods whose ``RequestFactory`` method takes a body as the test client's does.
_BODY_METHODS = ("POST", "PUT", "PATCH", "DELETE")


def new_key(view: object = None) -> str:
    """A fresh key that the view accepts: a random UUID, or another random key where the
    view's ``key_format`` (or ``KEY_FORMAT`` without a view) or ``MIN_KEY_LENGTH`` asks for it.

    ``view`` is a protected view (as ``describe()`` takes it, or its URL path) or an
    ``idempotent_function``. Raises ``ValueError`` for a pattern none of its tries match.
    """
    spec = getattr(view, "idempotency_spec", None)
    if spec is not None:  # a function's keys: only its own key_format, no MIN_KEY_LENGTH
        key_format: KeyFormat = spec.options.get("key_format") or ANY
        min_length = 1
    else:
        key_format = conf.KEY_FORMAT if view is None else _policy_of(view).key_format
        min_length = conf.MIN_KEY_LENGTH
    for key in _candidates(key_format, min_length):
        if (
            min_length <= len(key) <= MAX_KEY_LENGTH
            and key.isascii()
            and key.isprintable()
            and (key_format.pattern is None or key_format.pattern.fullmatch(key))
        ):
            return key
    raise ValueError(
        f"new_key() found no key matching {key_format.description}; make one yourself "
        "(unique for each test), as your clients do."
    )


def _candidates(key_format: KeyFormat, min_length: int) -> list[str]:
    """Random keys of the usual shapes, then keys drawn from the pattern itself."""
    random = uuid.uuid4()
    long = (random.hex + uuid.uuid4().hex * ((min_length // 32) + 1))[:MAX_KEY_LENGTH]
    shapes = [str(random), random.hex, str(random).upper(), random.hex.upper(), long]
    if key_format.pattern is None:
        return shapes
    drawn = []
    for _ in range(10):
        try:
            drawn.append(_draw(_parse(key_format.pattern)))
        except ValueError:  # a construct _draw does not know: the shapes may still match
            break
    return shapes + drawn


def _parse(pattern: re.Pattern[str]) -> Any:
    """The parse tree ``re`` compiles the pattern from (``re._parser``; ``sre_parse`` on
    Python 3.10, where importing it does not warn)."""
    try:
        parser = importlib.import_module("re._parser")
    except ImportError:  # Python 3.10
        parser = importlib.import_module("sre_parse")
    return parser.parse(pattern.pattern, pattern.flags)


#: What a drawn character is picked from, where a class allows it.
_ALPHABET = string.ascii_letters + string.digits + "-_"
_CATEGORIES = {
    "CATEGORY_DIGIT": string.digits,
    "CATEGORY_WORD": string.ascii_letters + string.digits + "_",
    "CATEGORY_SPACE": " ",
    "CATEGORY_NOT_DIGIT": string.ascii_letters,
    "CATEGORY_NOT_WORD": "-",
    "CATEGORY_NOT_SPACE": _ALPHABET,
}


def _draw(tree: Any) -> str:
    """A random string of a parsed pattern: long where a repeat allows (so it is fresh),
    printable ASCII. ``ValueError`` for what it cannot draw (back references...)."""
    out = []
    for op, value in tree:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(value))
        elif name == "NOT_LITERAL":
            out.append(secrets.choice(_ALPHABET.replace(chr(value), "")))
        elif name == "ANY":
            out.append(secrets.choice(_ALPHABET))
        elif name == "IN":
            out.append(_draw_class(value))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, item = value
            count = min(high, max(low, 32))
            out.extend(_draw(item) for _ in range(count))
        elif name == "SUBPATTERN":
            out.append(_draw(value[-1]))
        elif name == "BRANCH":
            out.append(_draw(secrets.choice(value[1])))
        elif name == "AT":
            continue
        else:
            raise ValueError(name)
    return "".join(out)


def _draw_class(items: list[tuple[Any, Any]]) -> str:
    allowed: list[str] = []
    negated = False
    for op, value in items:
        name = str(op)
        if name == "NEGATE":
            negated = True
        elif name == "LITERAL":
            allowed.append(chr(value))
        elif name == "RANGE":
            allowed.extend(chr(code) for code in range(value[0], value[1] + 1))
        elif name == "CATEGORY" and str(value) in _CATEGORIES:
            allowed.extend(_CATEGORIES[str(value)])
        else:
            raise ValueError(name)
    if negated:
        allowed = [char for char in _ALPHABET if char not in allowed]
    allowed = [char for char in allowed if char.isascii() and char.isprintable()]
    if not allowed:
        raise ValueError("IN")
    return secrets.choice(allowed)


def assert_replayed(replay: HttpResponseBase, original: HttpResponseBase) -> None:
    """Assert that ``replay`` is the app's replay of ``original``: ``Idempotent-Replayed:
    true``, the same status, the same body bytes and the same stored headers (those of
    ``REPLAYED_HEADERS``). Raises ``AssertionError`` with a diff of the two otherwise."""
    problems = []
    if replay.get(responses.REPLAYED_HEADER) != "true":
        problems.append(
            f"the response has no '{responses.REPLAYED_HEADER}: true' header: it was not "
            "replayed (the view ran again, or the first was not stored)"
        )
    if original.get(responses.REPLAYED_HEADER) is not None:
        problems.append("the original response is itself a replay")
    first, second = _stored_view(original), _stored_view(replay)
    if first != second:
        problems.append("it differs from the original (- original, + replay):")
        problems.extend(_diff(first, second, _content(original), _content(replay)))
    if problems:
        raise AssertionError("Not a replay: " + "\n".join(problems))


def _content(response: HttpResponseBase) -> bytes:
    if response.streaming:
        raise TypeError("A streaming response is never stored or replayed.")
    return bytes(response.content)  # type: ignore[attr-defined]


def _stored_view(response: HttpResponseBase) -> tuple[int, list[tuple[str, str]], bytes]:
    """What a replay must repeat: status, the stored headers (sorted), body bytes."""
    allowed = conf.REPLAYED_HEADERS
    headers = sorted((name.lower(), value) for name, value in response.items())
    stored = [(name, value) for name, value in headers if name in allowed]
    return response.status_code, stored, _content(response)


def _diff(
    first: tuple[int, list[tuple[str, str]], bytes],
    second: tuple[int, list[tuple[str, str]], bytes],
    first_body: bytes,
    second_body: bytes,
) -> list[str]:
    def lines(view: tuple[int, list[tuple[str, str]], bytes], body: bytes) -> list[str]:
        head = [f"status {view[0]}", *(f"{name}: {value}" for name, value in view[1])]
        return [*head, "", *_body_lines(body)]

    same_json = first_body != second_body and _json(first_body) == _json(second_body) is not None
    diff = list(
        difflib.unified_diff(lines(first, first_body), lines(second, second_body), lineterm="", n=2)
    )[2:]
    if same_json:
        diff.append("(the bodies are the same JSON in other bytes: a replay is byte for byte)")
    return diff


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def _body_lines(body: bytes) -> list[str]:
    """A body as lines to diff: JSON indented, so one changed member is one changed line."""
    document = _json(body)
    if document is not None and not isinstance(document, (str, int, float)):
        return json.dumps(document, indent=2, sort_keys=True).splitlines()
    return [repr(line) for line in body.splitlines(keepends=True)] or ["b''"]


def hold_key(key: str, target: Target, /, *args: Any, **kwargs: Any) -> Claim:
    """Claim ``key`` for a request as if its first attempt were still running: the next one
    gets ``409`` (or, where the view waits, waits for it up to ``wait_timeout``).

    ``target`` and what follows describe the request, as the test client sends it:
    ``hold_key(key, "POST", "/orders/", {"sku": "A1"}, content_type="application/json",
    user=alice)`` (the view is found by its path; ``user`` is ``request.user``); or an
    ``HttpRequest`` (``RequestFactory``, with whatever attributes your scope function reads);
    or an ``idempotent_function`` and the arguments of its call. The claim is made as the app
    makes it, with the view's own scope, fingerprint and lock timeout, and returned: its
    :meth:`~django_idempotency.Claim.set_recovery_point` records progress.
    """
    identity, policy = _identify(key, target, args, kwargs)
    return _claim(identity, policy, policy.lock_timeout)


def stale_key(
    key: str,
    target: Target,
    /,
    *args: Any,
    recovery_point: str = "",
    recovery_data: Any = None,
    **kwargs: Any,
) -> Claim:
    """Leave ``key`` as an attempt that died would: claimed for the request and its lock
    expired, at ``recovery_point`` (with ``recovery_data``) if given. The next request takes
    it over and runs with ``request.idempotency.recovery_point`` set (attempt 2).

    The request is described as for :func:`hold_key`.
    """
    identity, policy = _identify(key, target, args, kwargs)
    # A lock of no time expires as it is taken: stale at once, and no clock is moved.
    claim = _claim(identity, policy, timedelta(0))
    if recovery_point:
        claim.set_recovery_point(recovery_point, recovery_data)
    return claim


def expire_key(key: str, target: Target, /, *args: Any, **kwargs: Any) -> IdempotencyKey:
    """Expire the record ``key`` has for the request, as if its ``ttl`` had passed: the next
    request with the key runs as a first one. Returns the record; ``LookupError`` if none.

    The request is described as for :func:`hold_key`.
    """
    identity, policy = _identify(key, target, args, kwargs)
    # The database's record is expired in place; Redis deletes the key, as its TTL would.
    expired = using(policy.alias).expire(identity.scope, identity.key_hash)
    if expired is None:
        raise LookupError(
            f"Key {key!r} has no record in scope {identity.scope!r}: send the request first."
        )
    return expired


def key_records(key: str) -> QuerySet[IdempotencyKey] | _Records:
    """The records of ``key`` in every scope (one per principal that sent it), oldest first.

    A queryset of the table; when the settings or the URLconf name another store (a Redis
    store, another of the registry), the table's records and those of every other store (read
    through the store contract's ``records_of``: unsaved instances) in one list (with ``get``,
    ``exists``, ``count`` and ``first``)."""
    from django_idempotency._ops.store_checks import other_stores
    from django_idempotency._store import using

    records = (
        IdempotencyKey.objects.using(conf.DATABASE_ALIAS)
        .filter(key_hash=hash_key(key))
        .order_by("pk")
    )
    stores = other_stores()
    if not stores:
        return records
    found = list(records)
    for store in sorted(stores):
        found += using(store_alias(store, "")).records_of(hash_key(key))
    return _Records(sorted(found, key=lambda record: record.created_at))


class _Records(list[IdempotencyKey]):
    """:func:`key_records`'s answer when a store besides the database is in use: a list with
    the queryset methods tests call (``get``, ``exists``, ``count``, ``first``)."""

    def get(self) -> IdempotencyKey:
        if not self:
            raise IdempotencyKey.DoesNotExist("no record")
        if len(self) > 1:
            raise IdempotencyKey.MultipleObjectsReturned(f"{len(self)} records, not one")
        return self[0]

    def exists(self) -> bool:
        return bool(self)

    def count(self) -> int:  # type: ignore[override]
        return len(self)

    def first(self) -> IdempotencyKey | None:
        return self[0] if self else None


# An async def function is a plain callable too: its overloads come first, and win.
@overload
def concurrently(  # type: ignore[overload-overlap]
    call: Callable[[], Coroutine[Any, Any, T]],
    times: int = ...,
    *,
    return_exceptions: Literal[False] = ...,
) -> Coroutine[Any, Any, list[T]]: ...


@overload
def concurrently(  # type: ignore[overload-overlap]
    call: Callable[[], Coroutine[Any, Any, T]],
    times: int = ...,
    *,
    return_exceptions: Literal[True],
) -> Coroutine[Any, Any, list[T | BaseException]]: ...


@overload
def concurrently(
    call: Callable[[], T], times: int = ..., *, return_exceptions: Literal[False] = ...
) -> list[T]: ...


@overload
def concurrently(
    call: Callable[[], T], times: int = ..., *, return_exceptions: Literal[True]
) -> list[T | BaseException]: ...


def concurrently(
    call: Callable[[], Any], times: int = 2, *, return_exceptions: bool = False
) -> Any:
    """Make ``times`` identical calls at once and return their answers, in start order.

    A plain function (``lambda: client.post(...)``) runs in threads released together, each
    with its own database connection, closed when it ends: the test must commit what they read
    (``django_db(transaction=True)``, ``TransactionTestCase``). An ``async def`` function runs
    as tasks: ``await concurrently(send, 5)`` (from a sync test, through ``async_to_sync``, so
    that the ORM's work runs on the test's own connection). An exception is raised once every
    call has ended, or, with ``return_exceptions=True``, returned in its call's place (an
    ``idempotent_function`` raises ``IdempotencyInProgress`` for the calls that lost).
    """
    if times < 1:
        raise ValueError("times must be at least 1.")
    if asyncio.iscoroutinefunction(call):
        return _tasks(call, times, return_exceptions)
    if connections[DEFAULT_DB_ALIAS].in_atomic_block:
        raise RuntimeError(
            "concurrently() runs each call on a connection of its own, which cannot see this "
            "test's uncommitted transaction: use @pytest.mark.django_db(transaction=True) or "
            "TransactionTestCase."
        )
    answers: list[Any] = [None] * times
    failed: list[bool] = [False] * times
    start = threading.Barrier(times)

    def run(index: int) -> None:
        try:
            start.wait()
            answers[index] = call()
            if isinstance(answers[index], Awaitable):
                raise TypeError(
                    "The call returned an awaitable: pass an async def function, and await "
                    "concurrently(...)."
                )
        except BaseException as exc:
            answers[index], failed[index] = exc, True
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(index,)) for index in range(times)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if not return_exceptions and any(failed):
        raise answers[failed.index(True)]
    return answers


async def _tasks(
    call: Callable[[], Coroutine[Any, Any, Any]], times: int, return_exceptions: bool
) -> list[Any]:
    start = asyncio.Event()

    async def run() -> Any:
        await start.wait()
        return await call()

    tasks = [asyncio.ensure_future(run()) for _ in range(times)]
    await asyncio.sleep(0)  # every task waits on the event: set, they start together
    start.set()
    return list(await asyncio.gather(*tasks, return_exceptions=return_exceptions))


def _claim(identity: Identity, policy: Policy, lock_timeout: timedelta) -> Claim:
    """The key claimed through the store, as the engine claims it."""
    store = using(policy.alias)
    for _ in range(5):  # None: a concurrent claim or release came between two statements
        outcome = store.claim(identity, ttl=policy.ttl, lock_timeout=lock_timeout)
        if isinstance(outcome, Claim):
            return outcome
        if outcome is not None:
            raise ValueError(
                f"Key {identity.key!r} already has a live record ({outcome.status}) in scope "
                f"{identity.scope!r}: use a new key (new_key())."
            )
    raise RuntimeError(f"Key {identity.key!r} could not be claimed.")


def _identify(
    key: str, target: Target, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Identity, Policy]:
    """The identity and policy the app will give the described request or call."""
    spec = getattr(target, "idempotency_spec", None)
    if spec is not None:
        identity: Identity = spec.identify(args, kwargs)
        if identity.key != key:
            raise ValueError(
                f"The call's key is {identity.key!r}, not {key!r}: pass the key its arguments give."
            )
        return identity, spec.options.resolve()
    if isinstance(target, HttpRequest):
        if args or kwargs:
            raise TypeError("An HttpRequest describes the request: pass nothing after it.")
        request = target
        request.META[protocol._wsgi_name(conf.HEADER)] = _quoted(key)
    elif isinstance(target, str):
        request = _request(key, target, args, kwargs)
    else:
        raise TypeError(
            f"{target!r} is neither an HTTP method, an HttpRequest nor an idempotent_function."
        )
    return _identify_request(key, request)


def _identify_request(key: str, request: HttpRequest) -> tuple[Identity, Policy]:
    try:
        match = resolve(request.path_info)
    except Resolver404:
        raise ValueError(f"No view answers {request.path_info!r}.") from None
    request.resolver_match = match
    adapter = _adapter(request, match.func)
    policy = adapter.resolve(asynchronous=False)
    if policy is None:
        why = "IDEMPOTENCY['ENABLED'] is off" if not conf.ENABLED else "not a protected method"
        raise ValueError(f"{request.method} {request.path} is not protected ({why}).")
    protocol.keep_body(request)
    identity = adapter.identify(policy)
    if isinstance(identity, Answer):
        detail = json.loads(identity.value.content)["detail"]  # type: ignore[attr-defined]
        raise ValueError(f"The view refuses key {key!r}: {detail}")
    assert identity is not None  # the request carries the key
    return identity, policy


def _adapter(request: HttpRequest, view: object) -> protocol.HttpAdapter:
    """The adapter the app makes for the request: a django-ninja operation's, with ninja's
    ``request.auth``, or a view's."""
    ninja = protocol.ninja()
    adapter: protocol.HttpAdapter | None = None
    if ninja is not None:
        adapter = ninja.testing_adapter(request, view)
    return adapter or protocol.HttpAdapter(request, view_options(view))


def _request(key: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> HttpRequest:
    """The request the test client would send: ``path[, data]``, ``user=`` and the client's
    keyword arguments (``content_type``, ``headers``, ``query_params``, ``secure``, ``META``)."""
    if not 1 <= len(args) <= 2:
        raise TypeError("Describe the request as METHOD, path[, data].")
    path, data = args[0], args[1] if len(args) == 2 else kwargs.pop("data", None)
    user = kwargs.pop("user", None)
    kwargs["headers"] = {**(kwargs.get("headers") or {}), conf.HEADER: _quoted(key)}
    factory = RequestFactory()
    method = method.upper()
    if method in _BODY_METHODS:
        body = {} if data is None else {"data": data}
        request: HttpRequest = getattr(factory, method.lower())(path, **body, **kwargs)
    else:
        request = factory.generic(method, path, "" if data is None else data, **kwargs)
    # As the test client's requests: a CSRF check (ninja's session authentication) passes.
    request._dont_enforce_csrf_checks = True  # type: ignore[attr-defined]
    if user is not None:
        request.user = user
    elif apps.is_installed("django.contrib.auth"):
        from django.contrib.auth.models import AnonymousUser

        request.user = AnonymousUser()
    return request


def _policy_of(view: object) -> Policy:
    if isinstance(view, str):
        try:
            view = resolve(view.split("?", 1)[0]).func
        except Resolver404:
            raise ValueError(f"No view answers {view!r}.") from None
        ninja = protocol.ninja()
        if ninja is not None and (options := ninja.testing_options(view)) is not None:
            return options.resolve()  # type: ignore[no-any-return]
    if isinstance(view, Options):
        return view.resolve()
    return view_options(view).resolve()


def _quoted(key: str) -> str:
    """The key as a Structured Field string: accepted whatever ``BARE_KEYS`` says."""
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def outbox_sent(timeout: float = 10.0) -> None:
    """Wait until this process's outbox fast path has sent (or failed to send) every message
    released so far: it sends on a thread of its own, after the commit, so a test that
    checks a message right after its request waits here first. ``AssertionError`` if it has
    not within ``timeout`` seconds (a broker that does not answer)."""
    from django_idempotency._call.outbox import sender

    if not sender.settle(timeout):
        raise AssertionError(f"The outbox fast path has not sent its messages in {timeout} s.")
