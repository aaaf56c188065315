"""Every problem type the app answers links to a section of docs/problems.rst that exists."""

from __future__ import annotations

import inspect
import re
from itertools import pairwise
from pathlib import Path

import pytest

from django_idempotency._http import problems

DOCS = Path(__file__).resolve().parent.parent / "docs" / "problems.rst"


def documented_slugs() -> set[str]:
    """Section titles of the page: a slug line underlined with dashes."""
    lines = DOCS.read_text().splitlines()
    return {
        title
        for title, underline in pairwise(lines)
        if underline and set(underline) == {"-"} and re.fullmatch(r"[a-z-]+", title)
    }


def answered_problems() -> list[tuple[str, object]]:
    factories = {
        name: fn
        for name, fn in inspect.getmembers(problems, inspect.isfunction)
        if fn.__module__ == problems.__name__ and name != "problem"
    }
    arguments = {"missing_key": ("Idempotency-Key",), "invalid_key": ("x",), "key_reuse": (422,)}
    arguments["invalid_body"] = arguments["body_too_large"] = ("x",)
    arguments["invalid_scope"] = ("x",)
    arguments["in_progress"] = (1,)
    return [(name, fn(*arguments.get(name, ()))) for name, fn in sorted(factories.items())]


@pytest.mark.parametrize(("name", "response"), answered_problems())
def test_problem_type_is_documented(name: str, response: object) -> None:
    slug = response.idempotency_problem  # type: ignore[attr-defined]
    assert slug in documented_slugs(), f"{name}: add a '{slug}' section to docs/problems.rst"
