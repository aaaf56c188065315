"""Counts the SQL statements each request runs, for the wait-mode figures."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from django.db import connections
from django.http import HttpRequest, HttpResponseBase


def count_statements(
    get_response: Callable[[HttpRequest], HttpResponseBase],
) -> Callable[[HttpRequest], HttpResponseBase]:
    """Answer with ``X-Db-Statements`` (every ``execute`` on any alias), ``X-Elapsed`` and
    ``X-Worker-Pid``."""

    def middleware(request: HttpRequest) -> HttpResponseBase:
        count = 0

        def counter(execute: Callable[..., Any], *args: Any) -> Any:
            nonlocal count
            count += 1
            return execute(*args)

        started = time.monotonic()
        with ExitStack() as stack:
            for connection in connections.all():
                stack.enter_context(connection.execute_wrapper(counter))
            response = get_response(request)
        response["X-Db-Statements"] = str(count)
        response["X-Elapsed"] = f"{time.monotonic() - started:.4f}"
        response["X-Worker-Pid"] = str(os.getpid())
        return response

    return middleware
