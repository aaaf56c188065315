"""The instruction benchmark's guard (benchmarks/instructions.py): it fails when one of our paths
grows more than 3% over the baseline kept in the repository, and only then."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import instructions

ROOT = Path(__file__).resolve().parents[1]


def figures(**changes: float) -> dict[str, Any]:
    baseline = json.loads(instructions.BASELINE.read_text())
    counts = dict(baseline["instructions"])
    for name, factor in changes.items():
        counts[name.replace("_", " ")] = round(counts[name.replace("_", " ")] * factor)
    return {"why": baseline["why"], "environment": baseline["environment"], "instructions": counts}


def test_the_baseline_says_why_and_has_every_path() -> None:
    baseline = json.loads(instructions.BASELINE.read_text())
    assert baseline["why"].strip()
    names = [name for name, _, _ in [*instructions.OURS, *instructions.PEER]]
    assert sorted(baseline["instructions"]) == sorted(names)


@pytest.mark.parametrize("path", instructions.GUARDED)
def test_a_path_that_grew_over_three_percent_fails(path: str) -> None:
    baseline = figures()
    assert instructions.check(figures(), baseline, instructions.BASELINE) == 0
    key = path.replace(" ", "_")
    assert instructions.check(figures(**{key: 1.029}), baseline, instructions.BASELINE) == 0
    assert instructions.check(figures(**{key: 1.031}), baseline, instructions.BASELINE) == 1


def test_the_peer_and_the_bare_view_are_not_guarded() -> None:
    baseline = figures()
    changed = figures(bare=1.5, **{"peer_two-phase_first": 2.0})
    assert instructions.check(changed, baseline, instructions.BASELINE) == 0


def test_other_versions_are_refused() -> None:
    baseline = figures()
    other = figures()
    other["environment"] = {**other["environment"], "versions": {"django": "9.9"}}
    assert instructions.check(other, baseline, instructions.BASELINE) == 1
