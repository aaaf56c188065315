"""Print the fault suite's figures (``IDEMPOTENCY_FAULT_FIGURES``, one JSON object per
scenario): ``python -m tests.faults.figures FILE`` as one table, ``--rst`` as the tables of
``docs/failure-modes.rst`` (one per fault).
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


def _answers_rst(counts: object) -> str:
    assert isinstance(counts, dict)
    return ", ".join(f"``{key}``: {value}" for key, value in sorted(counts.items()))


def _executions_rst(counts: object) -> str:
    assert isinstance(counts, dict)
    return ", ".join(
        f"{keys} key{'s' if keys != 1 else ''} ran {'once' if runs == '1' else f'{runs} times'}"
        for runs, keys in sorted(counts.items())
    )


_SERVERS = ("postgresql", "mariadb", "sqlite")


def _order(figures: dict[str, object]) -> tuple[int, bool, str, bool]:
    database = str(figures["database"])
    server = database.split(",")[0]
    rank = _SERVERS.index(server) if server in _SERVERS else len(_SERVERS)
    return (rank, "," in database, database, figures["mode"] == "atomic")


def rst(figures: list[dict[str, object]]) -> str:
    """A ``list-table`` per fault, a row per database and mode."""
    out: list[str] = []
    for fault in dict.fromkeys(str(f["fault"]) for f in figures):
        out += [
            f".. list-table:: {fault}",
            "   :header-rows: 1",
            "",
            "   * - database, mode (lock)",
            "     - executions",
            "     - answers",
            "     - slowest answer",
            "     - new key served after",
            "     - last key settled after",
        ]
        for f in sorted((f for f in figures if f["fault"] == fault), key=_order):
            out += [
                f"   * - {f['database']}, {f['mode']} ({f['lock']} s)",
                f"     - {_executions_rst(f['executions'])}",
                f"     - {_answers_rst(f['answers'])}",
                f"     - {f['slowest_answer']} s",
                f"     - {_seconds(f['recovered_after'])}",
                f"     - {_seconds(f['settled_after'])}",
            ]
        out.append("")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    as_rst = "--rst" in argv
    argv = [arg for arg in argv if arg != "--rst"]
    if len(argv) != 1:
        print("usage: python -m tests.faults.figures [--rst] FILE", file=sys.stderr)
        return 2
    path = Path(argv[0])
    if not path.exists():
        print(f"no figures recorded ({path} missing)")
        return 0
    print(rst(rows(path)) if as_rst else table(rows(path)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
