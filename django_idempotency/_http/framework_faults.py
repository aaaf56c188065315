"""The ``503`` of a database fault met in a framework's own code, outside the app's decorator:
DRF's authentication (a token, a session) and django-ninja's (an API key read from the
database) run before ``@idempotent`` does, so a lost connection there was the framework's
uncaught exception, Django's ``500``. The framework's exception handler asks here instead
(:func:`django_idempotency.rest_framework.exception_handler`,
:func:`django_idempotency.ninja.exception_handler`)."""

from __future__ import annotations

from django.db import DatabaseError, connections
from django.http import HttpResponse

from django_idempotency._call.reports import logger
from django_idempotency._http import problems
from django_idempotency._store import served


def unavailable(exc: BaseException) -> HttpResponse | None:
    """``503 idempotency-unavailable`` with ``Retry-After`` for a database error that says the
    database is unavailable for now (a lost or refused connection, a server shutting down or
    read-only, a lock wait that ran out), as the app's own statements' are answered; ``None``
    for anything else (a wrong statement stays the ``500`` it is)."""
    if not isinstance(exc, DatabaseError) or not _transient(exc):
        return None
    logger.error(
        "The database was unavailable outside the idempotency layer (%s); answered 503.",
        exc,
        exc_info=exc,
    )
    roll_back_request()
    return problems.unavailable(
        "The database could not be reached, so the request was not completed; retry later."
    )


def roll_back_request() -> None:
    """Mark each ``ATOMIC_REQUESTS`` transaction the request is in for rollback, as DRF's
    handler does for the exceptions it answers. Answered rather than raised, the fault would
    leave Django's ``atomic`` to commit: on the lost connection the commit raises, Django's
    ``500`` after all, and writes made before the fault would be kept for a request answered
    as not completed."""
    for connection in connections.all(initialized_only=True):
        if connection.settings_dict["ATOMIC_REQUESTS"] and connection.in_atomic_block:
            connection.set_rollback(True)


def _transient(exc: DatabaseError) -> bool:
    """Whether any database the app has a store for calls ``exc`` transient: the error does
    not name its database, and each vendor reads its own codes."""
    return any(
        (store := served(alias)) is not None and store.is_transient(exc) for alias in connections
    )
