"""``BARE_KEYS``: the bare spelling of a key, accepted by default, refused when it is off (issue 18,
item 6), on every kind of view; ``idempotent_function`` keys are not header values."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.test import override_settings

from django_idempotency import IdempotencyKey, idempotent_function
from django_idempotency._base.keys import BARE_KEY_REFUSED
from tests.conftest import executions, problem_slug
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db

Post = Callable[..., Any]

QUOTED_ONLY = override_settings(IDEMPOTENCY={"BARE_KEYS": False})

# Every kind of view, with a body it takes.
VIEWS = pytest.mark.parametrize(
    ("path", "data"),
    [
        ("/create/", {"a": 1}),
        ("/async/", {"a": 1}),
        ("/class/", {"a": 1}),
        ("/drf/", {"a": [1, 2]}),
        ("/api/executions/", {"label": "x", "payload": "p"}),
    ],
    ids=["function", "async", "class", "drf-apiview", "drf-viewset"],
)


@VIEWS
def test_by_default_a_bare_key_and_its_quoted_spelling_are_one_key(
    post: Post, key: str, path: str, data: dict[str, Any]
) -> None:
    first = post(path, data, key=key)
    assert first.status_code == 201
    for spelling in (key, f'"{key}"'):
        retry = post(path, data, key=spelling)
        assert retry["Idempotent-Replayed"] == "true"
        assert retry.content == first.content
    assert executions() == 1


@QUOTED_ONLY
@VIEWS
def test_a_bare_key_is_refused_when_bare_keys_is_off(
    post: Post, key: str, path: str, data: dict[str, Any]
) -> None:
    response = post(path, data, key=key)
    assert response.status_code == 400
    assert problem_slug(response) == "invalid-idempotency-key"
    assert response.json()["detail"] == BARE_KEY_REFUSED
    assert "quoted" in response.json()["detail"]
    assert executions() == 0
    assert not IdempotencyKey.objects.exists()


@QUOTED_ONLY
@VIEWS
def test_a_quoted_key_is_accepted_and_replayed_when_bare_keys_is_off(
    post: Post, key: str, path: str, data: dict[str, Any]
) -> None:
    first = post(path, data, key=f'"{key}"')
    assert first.status_code == 201
    for spelling in (f'"{key}"', f'"{key}";v=1'):
        retry = post(path, data, key=spelling)
        assert retry.status_code == 201
        assert retry["Idempotent-Replayed"] == "true"
        assert retry.content == first.content
    # The bare spelling of the same key is refused, never replayed.
    assert post(path, data, key=key).status_code == 400
    assert executions() == 1


@QUOTED_ONLY
@pytest.mark.parametrize(
    "header", ["a,b", 'k, "k"', "order 42", "*token", "x" * 255], ids=lambda h: h[:10]
)
def test_every_bare_value_is_refused_with_the_same_detail(post: Post, header: str) -> None:
    response = post("/create/", key=header)
    assert response.status_code == 400
    assert response.json()["detail"] == BARE_KEY_REFUSED


@override_settings(IDEMPOTENCY={"BARE_KEYS": False, "KEY_FORMAT": "uuid", "MIN_KEY_LENGTH": 36})
def test_quoting_is_checked_with_the_key_format_and_length(post: Post, key: str) -> None:
    assert post("/create/", key=key).json()["detail"] == BARE_KEY_REFUSED
    assert "shorter than 36" in post("/create/", key='"order-1"').json()["detail"]
    assert "UUID" in post("/create/", key='"' + "x" * 36 + '"').json()["detail"]
    assert post("/create/", key=f'"{key}"').status_code == 201


@QUOTED_ONLY
def test_an_idempotent_function_takes_its_key_as_it_is() -> None:
    @idempotent_function(key="event_id")
    def handle(event_id: str) -> int:
        return Execution.objects.create(label="handle").pk

    event_id = f"evt_{uuid.uuid4().hex}"
    assert handle(event_id) == handle(event_id)
    assert executions() == 1
