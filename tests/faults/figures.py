"""Print the fault suite's figures (``IDEMPOTENCY_FAULT_FIGURES``, one JSON object per
scenario) as the table ``docs/failure-modes.rst`` shows: ``python -m tests.faults.figures FILE``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _counts(counts: object, suffix: str = "") -> str:
    assert isinstance(counts, dict)
    return ", ".join(f"{key}{suffix}: {value}" for key, value in sorted(counts.items()))


def _seconds(value: object) -> str:
    return "never" if value is None else f"{value} s"


def table(figures: list[dict[str, object]]) -> str:
    header = ("database", "fault", "mode", "lock", "keys by executions", "answers",
              "slowest", "recovered", "settled", "violations")  # fmt: skip
    lines = [header]
    for f in figures:
        lines.append(
            (
                str(f["database"]), str(f["fault"]), str(f["mode"]), f"{f['lock']} s",
                _counts(f["executions"], "x"), _counts(f["answers"]),
                f"{f['slowest_answer']} s", _seconds(f["recovered_after"]),
                _seconds(f["settled_after"]), str(len(f["violations"])),  # type: ignore[arg-type]
            )
        )  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.faults.figures FILE", file=sys.stderr)
        return 2
    path = Path(argv[0])
    if not path.exists():
        print(f"no figures recorded ({path} missing)")
        return 0
    print(table(rows(path)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
