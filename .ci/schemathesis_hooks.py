"""Schemathesis hooks for .ci/leg-schemathesis: every keyed request is sent twice.

The second answer must be the first one's bytes: the same status and body, with
``Idempotent-Replayed: true`` when the first was stored (any status but the released ones, 408,
429 and 5xx), or the same problem again when the first was one of the app's own (nothing was
stored), or the same page when the request never reached the view (Django's 404, ninja's 422).
The request is sent again byte for byte: a new multipart boundary would be another body, so
another fingerprint.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urljoin

import requests
import schemathesis

HEADER = "Idempotency-Key"
REPLAYED = "idempotent-replayed"
REPLAYED_NAME = "Idempotent-Replayed"
RELEASED = {408, 429, *range(500, 600)}

_session = requests.Session()


@schemathesis.check
def replay_is_byte_identical(ctx: Any, response: Any, case: Any) -> None:
    """A keyed request to a protected operation, sent again, gets the first response back."""
    policy = case.operation.definition.raw.get("x-idempotency")
    sent = response.request
    if (
        policy is None
        or sent.method != case.operation.method.upper()  # an undeclared method's 405
        or policy["header"] not in sent.headers
        or response.status_code in RELEASED
    ):
        return None
    replay = _session.send(sent.copy(), timeout=30)
    first = (response.status_code, response.content)
    again = (replay.status_code, replay.content)
    if first[0] == 202 and again[0] != 202 and _finished_as(response, replay):
        return None
    assert again == first, f"The replay differs: first {first!r}, replay {again!r}"
    content_type = response.headers.get("content-type", [""])[0]
    documented = case.operation.definition.raw.get("responses", {}).get(
        str(response.status_code), {}
    )
    # The app's own problems are not stored, and the example APIs answer JSON: anything else
    # (Django's HTML 404 for a path no URL pattern matches) never reached the protected view;
    # nor did what the schema publishes without the replay header (ninja's own 422 for an
    # invalid request, answered before the key is claimed).
    if content_type.startswith("application/json") and REPLAYED_NAME in documented.get(
        "headers", {}
    ):
        assert replay.headers.get(REPLAYED) == "true", (
            f"The replay of a stored {response.status_code} has no Idempotent-Replayed: true"
        )
    return None


def _finished_as(accepted: Any, replay: Any) -> bool:
    """Whether a 202's operation finished before its replay, with the replay's status: its
    retries then get the final response (issue 43), which the status endpoint (the 202's
    ``Location``) reports. The example's export takes 2 s; a replay sent later (the stateful
    phase's, or one that waited for SQLite's write lock) met it finished."""
    location = (accepted.headers.get("location") or [""])[0]  # schemathesis's: lists
    if not location or replay.headers.get(REPLAYED) != "true":
        return False
    status = _session.get(urljoin(accepted.request.url, location), timeout=30)
    if status.status_code != 200:
        return False
    body = status.json()
    return body.get("state") in {"succeeded", "failed"} and (
        body.get("response", {}).get("status") == replay.status_code
    )
