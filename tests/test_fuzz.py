"""Fuzz targets for the key parser and the fingerprint (issue 20), with hypothesis.

In the normal suite each target runs one bounded round. ``.ci/fuzz`` runs them again and again:
``IDEMPOTENCY_FUZZ_ROUNDS`` rounds, and more until ``IDEMPOTENCY_FUZZ_SECONDS`` have passed. Round
``n`` draws from the seed ``IDEMPOTENCY_FUZZ_SEED + n``: CI sets the seed and a number of rounds,
so every run tries the same examples and a failure is reproducible (issue 32); a developer's
wider run leaves the seed out for a random one, printed with any failure.
"""

from __future__ import annotations

import json
import os
import random
import string
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.http.multipartparser import MultiPartParserError
from django.test import RequestFactory
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from django_idempotency import InvalidKey, request_fingerprint
from django_idempotency._base.keys import MAX_KEY_LENGTH, parse_key
from django_idempotency._http.canonical_json import canonical_json, written
from tests.strategies import CONTENT_TYPES, header_values, json_texts, same_document

SECONDS = float(os.environ.get("IDEMPOTENCY_FUZZ_SECONDS", "0"))
ROUNDS = int(os.environ.get("IDEMPOTENCY_FUZZ_ROUNDS", "1"))
#: Unset: hypothesis draws as the profile says (derandomized in CI, see tests/conftest.py).
_SEED = os.environ.get("IDEMPOTENCY_FUZZ_SEED", "")
ROUND = settings(
    max_examples=int(os.environ.get("IDEMPOTENCY_FUZZ_EXAMPLES", "100")),
    deadline=None,
    database=None,  # every round explores afresh
    suppress_health_check=[HealthCheck.too_slow],
)


def fuzz(target: Callable[[], None]) -> None:
    """``ROUNDS`` rounds, then more until the time budget is spent, each from its own seed."""
    base = random.getrandbits(64) if _SEED in ("", "random") else int(_SEED)
    deadline = time.monotonic() + SECONDS
    done = 0
    while done < ROUNDS or time.monotonic() < deadline:
        try:
            (seed(base + done)(target) if _SEED else target)()
        except BaseException:
            print(
                f"\nFuzz round {done} of {target.__name__} failed (seed {base + done}). The same "
                f"examples again: IDEMPOTENCY_FUZZ_SEED={base + done} pytest tests/test_fuzz.py"
            )
            raise
        done += 1


@ROUND
@given(value=header_values())
def _key_parser(value: str) -> None:
    try:
        key = parse_key(value)
    except InvalidKey as exc:
        assert "Idempotency-Key" in str(exc)  # a message for the client
        return
    assert 1 <= len(key) <= MAX_KEY_LENGTH
    assert key.isascii() and key.isprintable()
    quoted = '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'
    assert parse_key(quoted) == key  # both spellings of a key are one key
    if not value.strip(" \t").startswith('"'):
        assert "," not in key  # a list of keys is never one key


@ROUND
@given(printable=st.text(alphabet=string.printable.strip(), min_size=1, max_size=MAX_KEY_LENGTH))
def _every_quoted_key_round_trips(printable: str) -> None:
    quoted = '"' + printable.replace("\\", "\\\\").replace('"', '\\"') + '"'
    assert parse_key(quoted) == printable


json_or_not = st.one_of(
    json_texts(),
    st.binary(max_size=200),
    st.integers(min_value=1, max_value=3000).map(lambda depth: b"[" * depth + b"]" * depth),
)


@ROUND
@given(body=json_or_not)
def _canonical_json(body: bytes) -> None:
    canonical = canonical_json(body)
    # The C encoder's fast path writes what the module's own writer writes, byte for byte.
    assert canonical == written(body)
    if canonical is None:
        return
    assert canonical.isascii()
    assert canonical_json(canonical) == canonical  # a fixed point
    assert same_document(body, "", canonical, "")  # nothing lost but spelling
    json.loads(canonical)


factory = RequestFactory()


@ROUND
@given(
    method=st.sampled_from(["POST", "PATCH", "PUT", "DELETE"]),
    content_type=st.one_of(st.sampled_from(CONTENT_TYPES), st.text(max_size=30)),
    body=json_or_not,
    scope=st.text(max_size=30),
    path=st.text(alphabet=string.ascii_letters + "/?=&%", max_size=30),
)
def _fingerprint(method: str, content_type: str, body: bytes, scope: str, path: str) -> None:
    content_type = content_type.encode("latin-1", "replace").decode("latin-1")

    def make() -> Any:
        return factory.generic(method, "/" + path, body, content_type=content_type)

    try:
        fingerprint = request_fingerprint(make(), scope)
    except MultiPartParserError:
        return  # a malformed form upload: Django answers 400
    assert len(fingerprint) == 64 and int(fingerprint, 16) >= 0
    assert request_fingerprint(make(), scope) == fingerprint  # deterministic
    request = make()
    assert request_fingerprint(request, scope) == fingerprint
    assert request.read() == body  # the view still reads the whole body


@pytest.mark.parametrize(
    "target", [_key_parser, _every_quoted_key_round_trips, _canonical_json, _fingerprint]
)
def test_fuzz(target: Callable[[], None]) -> None:
    fuzz(target)
