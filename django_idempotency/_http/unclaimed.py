"""``request.idempotency`` of a request the app runs unprotected: no key where the key is
optional, a method that is not protected, or the app switched off (``docs/outbox.rst``).

Such a request runs as if its view were undecorated (SPEC 2), so it has no attempt to tie a
message to; yet a view that stages its receipt with ``request.idempotency.enqueue()`` must not
answer ``500`` because the client sent no key. :class:`Unclaimed` is falsy, so
``if request.idempotency:`` still tells a protected request from one that is not, and its
``enqueue()`` sends what the view staged after the view returned a response a claim would have
kept (not a ``5xx``, ``429`` or ``408``, and no exception), once the default database's
transaction commits (``ATOMIC_REQUESTS``): the way ``transaction.on_commit(task.delay)`` would,
at most once, with no outbox row behind it, on the outbox's sender thread (the keyed fast
path's), so that the response never waits for the broker. A view written for its claim runs
unchanged: the recovery point starts empty and is kept in memory only (nothing can resume a
request without a key), ``is_takeover`` is false, a derived key is new for each request. What
only a record has (its key, its operation) is an ``AttributeError`` that says so.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from functools import partial
from typing import Any, NoReturn

from django.db import DEFAULT_DB_ALIAS, transaction
from django.http import HttpRequest, HttpResponseBase

from django_idempotency._call import outbox
from django_idempotency._call.claim import check_recovery_data
from django_idempotency._conf.settings import conf
from django_idempotency._store.outbox import Message

logger = logging.getLogger("django_idempotency")


class Unclaimed:
    """What a view reads as ``request.idempotency`` when its request is not protected."""

    __slots__ = ("_request_id", "messages", "recovery_data", "recovery_point")

    attempt = 1
    is_takeover = False
    lock_lost = False

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.recovery_point = ""
        self.recovery_data: Any = None
        self._request_id: uuid.UUID | None = None  # made when first needed

    def check_held(self) -> None:
        """Nothing to lose: there is no lock."""

    def set_recovery_point(self, name: str, data: Any = None) -> None:
        """Kept for the rest of the view only: no retry can resume a request without a key.
        Data a keyed request's store would refuse is refused alike (a ``ValueError``)."""
        check_recovery_data(name, data)
        self.recovery_point = name
        self.recovery_data = data

    def derived_key(self, purpose: str = "") -> str:
        """A key for a downstream service, the same for one ``purpose`` within the request and
        new for every request (no retry of it can be recognised)."""
        if self._request_id is None:
            self._request_id = uuid.uuid4()
        return str(uuid.uuid5(self._request_id, purpose))

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "<Unclaimed: this request has no Idempotency-Key record>"

    #: :meth:`enqueue` always sends (no store is asked), as :attr:`.Claim.serves_outbox` says.
    serves_outbox = True

    def enqueue(self, task: Any, /, *args: Any, name: str | None = None, **kwargs: Any) -> str:
        """Send a message for ``task`` once the view has answered and its transaction has
        committed; at most once (no record, no outbox row). Returns its id, a random UUID."""
        engine, path = outbox.describe(task)
        if name is not None and (not isinstance(name, str) or not name):
            raise TypeError(f"enqueue({path}): name must be a non-empty string, not {name!r}.")
        message_id = str(uuid.uuid4())
        self.messages.append(
            Message(message_id, engine, path, outbox.serialised(path, args, kwargs))
        )
        return message_id

    def __getattr__(self, name: str) -> NoReturn:
        raise AttributeError(
            f"request.idempotency.{name}: this request is not protected (no {conf.HEADER} "
            "header where the key is optional, a method the view does not protect, or the app "
            "switched off), so it has no record: its key, its operation and the like exist only "
            "with a key. Require the key (required=True) on a view that needs them."
        )


def conclude(request: HttpRequest, response: object) -> None:
    """Send what the unprotected view staged, if its response is one a claim would keep."""
    unclaimed = getattr(request, "idempotency", None)
    if not isinstance(unclaimed, Unclaimed) or not unclaimed.messages:
        return
    messages, unclaimed.messages = unclaimed.messages, []
    status = response.status_code if isinstance(response, HttpResponseBase) else 200
    if status in conf.RETRYABLE_STATUSES:
        logger.info(
            "%s %s without a key answered %s: its %s staged message(s) are not sent.",
            request.method,
            request.path,
            status,
            len(messages),
        )
        return
    transaction.on_commit(partial(_hand, messages), using=DEFAULT_DB_ALIAS)


def pending(request: HttpRequest) -> bool:
    """Whether the unprotected view staged messages (an async view sends them in a thread)."""
    unclaimed = getattr(request, "idempotency", None)
    return isinstance(unclaimed, Unclaimed) and bool(unclaimed.messages)


def _hand(messages: Sequence[Message]) -> None:
    """To the process's outbox sender thread (:class:`.outbox.Sender`): a broker that accepts
    connections and never answers held each such request's response 4 s on AMQP, and for good
    on Redis; it costs that thread instead."""
    if not outbox.sender.hand(DEFAULT_DB_ALIAS, partial(_send, messages)):
        logger.error(
            "Outbox fast path busy: the %d message(s) of a request without a key are lost "
            "(only a keyed request's messages are kept and relayed).",
            len(messages),
        )


def _send(messages: Sequence[Message]) -> None:
    for message in messages:
        try:
            outbox.send(message.engine, message.task, message.arguments, message.message_id)
        except Exception as exc:  # the response is made: say what was lost, and go on
            logger.error(
                "Outbox: the message %s to %s of a request without a key could not be sent "
                "(%s: %s); it is lost (only a keyed request's messages are kept and relayed).",
                message.message_id,
                message.task,
                type(exc).__name__,
                exc,
            )
