"""The overhead benchmark's floors: the arithmetic its verdicts on the goals rest on."""

from __future__ import annotations

import pytest

from benchmarks.overhead import STATEMENTS, floors_of, statement_floors_of, summary

#: What the benchmark times on the server alone, and the bare view and "django only", in ms.
SERVER = {
    "bare": 1.0,
    "round trip": 0.1,
    "indexed read": 0.15,
    "durable commit": 0.3,
    "django only": 0.2,
}


def test_floors_count_commits_and_round_trips() -> None:
    floors = {name: floor for name, (floor, _why) in floors_of(SERVER).items()}

    assert floors["two-phase first"] == pytest.approx(1.6)  # bare + 2 durable commits
    # bare + the read of a finished record, BEGIN, claim, UPDATE, COMMIT (issue 42)
    assert floors["atomic first"] == pytest.approx(1.5)
    assert floors["two-phase replay"] == pytest.approx(0.35)  # Django and auth + a read
    assert floors["atomic replay"] == pytest.approx(0.35)  # the same: no transaction


def test_summary_gives_each_path_its_ratio_floor_and_goal() -> None:
    medians = {
        **SERVER,
        "two-phase first": 1.8,
        "atomic first": 1.45,
        "two-phase replay": 0.5,
        "atomic replay": 0.7,
    }

    line = summary("PostgreSQL 15", medians)

    assert line == (
        "summary PostgreSQL 15: two-phase first 1.80 (floor 1.60, goal 1.70 MISSED); "
        "atomic first 1.45 (floor 1.50, goal 1.50); "
        "two-phase replay 0.50 (floor 0.35, goal 0.85); "
        "atomic replay 0.70 (floor 0.35, goal 1.00)"
    )


def test_statement_floors_add_the_apps_own_statements_timed_alone() -> None:
    medians = {
        **SERVER,
        "claim + write": 0.9,
        "read, BEGIN, claim, write, COMMIT": 1.0,
        "claim, live key": 0.3,
        "read of a finished record": 0.25,
    }

    floors = {name: floor for name, (floor, _why) in statement_floors_of(medians).items()}

    assert floors["two-phase first"] == pytest.approx(1.9)  # bare + claim + write
    # The view's INSERT commits with the app's transaction: one durable flush (0.3 - 0.1) less.
    assert floors["atomic first"] == pytest.approx(1.8)
    assert floors["two-phase replay"] == pytest.approx(0.5)  # Django and auth + the claim
    assert floors["atomic replay"] == pytest.approx(0.45)  # Django and auth + the read alone


def test_no_statement_floors_where_the_statements_were_not_timed() -> None:
    """MySQL/MariaDB: the claim is not one statement to send alone."""
    assert set(STATEMENTS) - set(SERVER) == set(STATEMENTS)
    assert statement_floors_of(SERVER) == {}
