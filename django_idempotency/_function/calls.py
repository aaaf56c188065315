"""``idempotent_function``'s side of the lifecycle: :class:`CallAdapter`.

A call becomes an :class:`~django_idempotency._call.identity.Identity` with method ``CALL`` and the
function's name as its path; the engine claims it exactly as it claims an HTTP request. The
result is stored as a ``200`` "response" whose body is the serialised result.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from functools import cache, partial
from typing import Any, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError, connections

from django_idempotency._base.errors import (
    IdempotencyError,
    IdempotencyFailed,
    IdempotencyInProgress,
    IdempotencyKeyMismatch,
    LockWaitTimeout,
    StoreUnavailable,
)
from django_idempotency._base.keys import KeyFormat, hash_key
from django_idempotency._call import claiming, lifecycle, reports, storing, telemetry, writing
from django_idempotency._call.attempt import Attempt
from django_idempotency._call.claim import Claim
from django_idempotency._call.identity import Identity
from django_idempotency._conf.options import Options, Policy
from django_idempotency._conf.settings import conf
from django_idempotency._conf.values import DATABASE
from django_idempotency._function.serializers import ResultSerializer
from django_idempotency._store import StoredResponse, sealing, using
from django_idempotency._store.limits import bounded_scope, unkeepable
from django_idempotency._store.rows import Record
from django_idempotency.models import IdempotencyKey

logger = logging.getLogger("django_idempotency")

#: The record's ``method`` for a function call; its ``path`` is the function's name.
METHOD = "CALL"
#: A function with a parameter of this name receives its :class:`Claim` there.
CLAIM_PARAMETER = "idempotency"

T = TypeVar("T")


@dataclass(frozen=True)
class Spec:
    """One decorated function: where its key, scope and payload come from, and how it stores."""

    name: str
    signature: inspect.Signature  # as callers see it: without the claim parameter
    key: str | Callable[..., Any]
    scope: str | Callable[..., Any] | None
    payload: Callable[..., Any] | None
    fingerprint: Callable[..., Any] | None
    serializer: ResultSerializer
    options: Options
    takes_claim: bool

    @classmethod
    def build(
        cls,
        func: Callable[..., Any],
        *,
        key: str | Callable[..., Any],
        scope: str | Callable[..., Any] | None,
        payload: Callable[..., Any] | None,
        serializer: ResultSerializer,
        name: str | None,
        fingerprint: Callable[..., Any] | None = None,
        options: Options,
    ) -> Spec:
        """Validate the decorator's arguments against the function; ``ImproperlyConfigured``."""
        label = name or f"{func.__module__}.{func.__qualname__}"
        signature = inspect.signature(func)
        parameters = list(signature.parameters.values())
        takes_claim = _check_claim_parameter(label, parameters)
        public = [p for p in parameters if not (takes_claim and p.name == CLAIM_PARAMETER)]
        _check_key(label, key, public)
        if not (scope is None or isinstance(scope, str) or callable(scope)):
            raise ImproperlyConfigured(f"{label}: scope must be a string or a callable.")
        if payload is not None and not callable(payload):
            raise ImproperlyConfigured(f"{label}: payload must be a callable.")
        if fingerprint is not None and not callable(fingerprint):
            raise ImproperlyConfigured(f"{label}: fingerprint must be a callable.")
        if fingerprint is not None and payload is not None:
            raise ImproperlyConfigured(
                f"{label}: give payload (what must match, as data) or fingerprint (it, already "
                "reduced to a str), not both."
            )
        if not isinstance(serializer, ResultSerializer):
            raise ImproperlyConfigured(
                f"{label}: serializer needs dumps(value) -> bytes, loads(bytes) and content_type."
            )
        if not label or len(label) > 1000:
            raise ImproperlyConfigured(f"{label!r}: name must be 1 to 1000 characters.")
        return cls(
            name=label,
            signature=signature.replace(parameters=public),
            key=key,
            scope=scope,
            payload=payload,
            fingerprint=fingerprint,
            serializer=serializer,
            options=options,
            takes_claim=takes_claim,
        )

    def identify(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Identity:
        """The call as the engine sees it. Raises ``TypeError``/``ValueError`` on bad input."""
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        raw_key = self.key(*args, **kwargs) if callable(self.key) else bound.arguments[self.key]
        key = self._key(raw_key)
        scope = self._scope(args, kwargs)
        if self.fingerprint is not None:
            fingerprint = self._own_fingerprint(scope, self.fingerprint(*args, **kwargs))
        else:
            payload = self.payload(*args, **kwargs) if self.payload else _arguments(bound)
            fingerprint = self._fingerprint(scope, payload)
        return Identity(
            key=key,
            scope=scope,
            key_hash=hash_key(key),
            fingerprint=fingerprint,
            method=METHOD,
            path=self.name,
            operation=self.name,
        )

    def call_kwargs(self, kwargs: dict[str, Any], claim: Claim | None) -> dict[str, Any]:
        return {**kwargs, CLAIM_PARAMETER: claim} if self.takes_claim else kwargs

    def _key(self, value: Any) -> str:
        if isinstance(value, (int, uuid.UUID)) and not isinstance(value, bool):
            value = str(value)
        if value is None or value == "":
            raise ValueError(f"{self.name} was called without an idempotency key (got {value!r}).")
        if not isinstance(value, str):
            raise TypeError(
                f"{self.name}: the idempotency key must be a str, int or UUID, not "
                f"{type(value).__name__}."
            )
        key: str = value
        key_format: KeyFormat | None = self.options.get("key_format")
        if key_format is not None:  # KEY_FORMAT is the header's, not a message's
            key = key_format.check(key, f"{self.name}: the idempotency key")
        return key

    def _scope(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
        """The record's scope: the function's name, then the caller's scope if any."""
        extra = self.scope(*args, **kwargs) if callable(self.scope) else self.scope
        if extra is not None and not isinstance(extra, str):
            raise TypeError(f"{self.name}: scope() must return a str, not {type(extra).__name__}.")
        scope = f"{self.name}:{extra}" if extra else self.name
        if reason := unkeepable(scope):
            # Refused before the claim on every store, as a view's is.
            raise ValueError(f"{self.name}: its scope was given {reason}.")
        return bounded_scope(scope)

    def _fingerprint(self, scope: str, payload: Any) -> str:
        """SHA-256 over the function's name, the scope and the payload's canonical JSON."""
        try:
            document = json.dumps(
                payload,
                cls=DjangoJSONEncoder,
                sort_keys=True,
                separators=(",", ":"),
                ensure_ascii=False,
                allow_nan=False,
            )
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"{self.name}: the call's payload is not JSON-serialisable ({exc}); pass "
                "payload= a callable returning what identifies the call (e.g. the message body)."
            ) from exc
        return _digest(METHOD, self.name, scope, document)

    def _own_fingerprint(self, scope: str, value: object) -> str:
        """The ``fingerprint`` callable's str, bound to the function's name and the scope as
        the default is (five parts: never the digest of a payload's four)."""
        if not isinstance(value, str):
            raise TypeError(
                f"{self.name}: fingerprint() must return a str, not {type(value).__name__}."
            )
        return _digest(METHOD, self.name, scope, "fingerprint", value)


def _digest(*parts: str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
    return digest.hexdigest()


def _check_key(label: str, key: object, public: list[inspect.Parameter]) -> None:
    """A key named by its parameter must name one that holds a single value (not ``*args`` or
    ``**kwargs``): found missing at decoration, not at the first call."""
    if isinstance(key, str):
        named = {p.name: p for p in public}
        if key not in named or named[key].kind in (
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        ):
            raise ImproperlyConfigured(
                f"{label}: key={key!r} names no parameter of the function; give a parameter "
                "name or a callable taking the function's arguments."
            )
    elif not callable(key):
        raise ImproperlyConfigured(f"{label}: key must be a parameter name or a callable.")


def _check_claim_parameter(label: str, parameters: list[inspect.Parameter]) -> bool:
    """Whether the function takes its claim; it must be where no positional argument lands."""
    names = [p.name for p in parameters]
    if CLAIM_PARAMETER not in names:
        return False
    index = names.index(CLAIM_PARAMETER)
    parameter = parameters[index]
    positional_after = any(
        p.kind
        in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            inspect.Parameter.VAR_POSITIONAL,
        )
        for p in parameters[index + 1 :]
    )
    if parameter.kind == inspect.Parameter.KEYWORD_ONLY or (
        parameter.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD and not positional_after
    ):
        return True
    raise ImproperlyConfigured(
        f"{label}: the {CLAIM_PARAMETER!r} parameter receives the claim; make it keyword-only "
        f"(def f(message_id, *, {CLAIM_PARAMETER}=None)) or the last positional parameter."
    )


def _arguments(bound: inspect.BoundArguments) -> dict[str, Any]:
    """The default payload: every argument by name, less a bound method's ``self``/``cls`` and
    a task's context.

    ``@task(takes_context=True)`` passes a ``TaskContext`` first: it is not JSON, and it differs
    between runs of one task (its result id, its attempt), so it does not identify the call.
    """
    arguments = dict(bound.arguments)
    first = next(iter(bound.signature.parameters), None)
    if first is not None and (
        first in ("self", "cls") or isinstance(arguments.get(first), _task_context_types())
    ):
        arguments.pop(first)
    return arguments


@cache
def _task_context_types() -> tuple[type, ...]:
    """The task context classes of ``django.tasks`` (Django 6.0+) and of its backport
    ``django_tasks``, where installed; imported when first needed, not with this module."""
    found: list[type] = []
    for module in ("django.tasks", "django_tasks"):
        try:
            found.append(importlib.import_module(module).TaskContext)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


class CallAdapter(lifecycle.Adapter[Any]):
    """One call of a decorated function: its key from the arguments, its answers the stored
    result or an exception."""

    def __init__(self, spec: Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.spec = spec
        self.args = args
        self.kwargs = kwargs
        #: The function's result, then what later calls get for it (:meth:`finish`).
        self.result: Any = None

    def resolve(self, *, asynchronous: bool) -> Policy | None:
        """The policy of one call: atomic when asked, or when the claim cannot commit on its
        own (``None``: the app is off).

        Inside a transaction on the store's database the claim commits with the caller's
        transaction whatever the mode, so a sync call runs as in atomic mode, in a savepoint.
        An async call is always two-phase: no transaction spans an ``await``.
        """
        if not conf.ENABLED:
            return None
        policy = self.spec.options.resolve()
        if (
            not (asynchronous or policy.atomic)
            and policy.store == DATABASE
            and connections[policy.alias].in_atomic_block
        ):
            policy = replace(policy, atomic=True)
        self.identified(policy)  # bad arguments fail before any claim, or any connection
        return policy

    def identify(self, policy: Policy) -> Identity:
        """The call's identity; a database fault in the key, scope, payload or fingerprint
        callable raises :class:`StoreUnavailable`, as the claim's would."""
        try:
            return self.spec.identify(self.args, self.kwargs)
        except DatabaseError as exc:
            if not using(policy.alias).is_transient(exc):
                raise
            refusal = StoreUnavailable(f"{self.spec.name}: {exc}")
            attributes = telemetry.labels(METHOD, self.spec.name, policy.atomic)
            reports.identity_unavailable(attributes, policy, refusal, "function")
            raise refusal from exc

    def arguments(self, kwargs: dict[str, Any], claim: Claim | None) -> dict[str, Any]:
        return self.spec.call_kwargs(kwargs, claim)

    def unprotected(self, result: Any) -> Any:
        return storing.plain(result)

    def found(self, found: claiming.Found) -> lifecycle.Answer[Any]:
        """The stored result; raises :class:`IdempotencyInProgress`,
        :class:`IdempotencyKeyMismatch` and :class:`IdempotencyFailed`."""
        spec, attempt = self.spec, self.attempt
        assert attempt is not None
        identity = attempt.identity
        if found.kind is claiming.Kind.MISMATCH:
            raise IdempotencyKeyMismatch(
                f"{spec.name}: key {identity.key_hash[:12]}… was used before by a call with "
                "another payload, or by another function of the same name; nothing ran."
            )
        if found.kind is claiming.Kind.IN_PROGRESS:
            raise IdempotencyInProgress(
                _in_progress_message(spec, identity), unlock_at=found.record.unlock_at
            )
        return lifecycle.Answer(_stored_result(spec, found.record))

    def refused(
        self, exc: StoreUnavailable | LockWaitTimeout, policy: Policy
    ) -> lifecycle.Answer[Any]:
        if isinstance(exc, StoreUnavailable):
            raise exc
        if policy.atomic:  # the transaction waited for another call's uncommitted claim
            raise IdempotencyInProgress(
                f"Waited {policy.wait_timeout.total_seconds():g}s for another call's uncommitted "
                "claim of the same key; retry later."
            ) from exc
        identity = self.identified(policy)
        assert isinstance(identity, Identity)
        raise IdempotencyInProgress(_in_progress_message(self.spec, identity)) from exc

    def finish(self, attempt: Attempt, result: Any) -> Any:
        """Store the result, fenced by the claim's lock token, and return it as later calls
        will; a result marked by ``no_store()`` releases the key and is returned as it is."""
        result, mark = storing.unwrap(result)
        self.result = result
        writing.conclude(attempt, mark, partial(self._serialized, attempt))
        return self.result

    def _serialized(self, attempt: Attempt, ttl: timedelta | None) -> StoredResponse:
        """The result as the record keeps it; :attr:`result` becomes what later calls get."""
        spec = self.spec
        try:
            body = spec.serializer.dumps(self.result)
            self.result = spec.serializer.loads(body)
        except Exception:
            # Its effects may have happened, but nothing can be replayed: release so a fixed
            # deployment's retry runs it (atomic mode rolls the effects back with the claim).
            writing.release(attempt, reason="unserialisable result", raised=True)
            raise
        identity = attempt.identity
        # A result, not a response.
        return StoredResponse(None, [], body, ttl, (identity.scope, identity.key_hash))


def _in_progress_message(spec: Spec, identity: Identity) -> str:
    return (
        f"{spec.name}: key {identity.key_hash[:12]}… is held by a call still in flight; retry "
        "later (redeliver the message)."
    )


def _stored_result(spec: Spec, record: IdempotencyKey | Record) -> Any:
    """The stored result, from the body alone: a record has no status and no headers, and one
    stored in the former shape, an HTTP ``200`` with a ``Content-Type``
    (:class:`.StoredResponse`), reads the same."""
    if record.status == IdempotencyKey.Status.FAILED:
        raise IdempotencyFailed(
            f"{spec.name}: the record of key {record.key_hash[:12]}… was marked failed "
            f"(status {record.response_status}); the function will not run for this key."
        )
    try:
        _, body = sealing.unseal(
            record.response_headers, record.response_body, (record.scope, record.key_hash)
        )
    except sealing.Unreadable as exc:
        raise IdempotencyError(
            f"{spec.name}: the stored result of record {record.pk} cannot be read ({exc}); "
            "the function will not run again for this key."
        ) from exc
    if body is None:
        raise IdempotencyError(f"{spec.name}: record {record.pk} has no stored result.")
    return spec.serializer.loads(body)
