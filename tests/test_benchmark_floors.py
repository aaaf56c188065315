"""The overhead benchmark's floors: the arithmetic its verdicts on the goals rest on."""

from __future__ import annotations

import pytest

from benchmarks.overhead import floors_of


def test_floors_count_commits_and_round_trips() -> None:
    medians = {"bare": 1.0, "round trip": 0.1, "durable commit": 0.3, "django only": 0.2}

    floors = {name: floor for name, (floor, _why) in floors_of(medians).items()}

    assert floors["two-phase first"] == pytest.approx(1.6)  # bare + 2 durable commits
    assert floors["atomic first"] == pytest.approx(1.4)  # bare + BEGIN, claim, UPDATE, COMMIT
    assert floors["two-phase replay"] == pytest.approx(0.3)  # Django + the claim's round trip
    assert floors["atomic replay"] == pytest.approx(0.3)
