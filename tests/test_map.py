"""``tests/README.rst`` maps behaviours to test files: every test file is listed there once, and
every file it lists exists (issue 27 item 6)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).parent
MAP = TESTS / "README.rst"


def listed() -> list[str]:
    """The names the map gives in double backquotes that look like a test file or a folder."""
    return re.findall(r"``([\w/]+(?:\.py|/))``", MAP.read_text())


def test_every_test_file_is_on_the_map_once() -> None:
    names = Counter(listed())
    files = {p.name for p in TESTS.glob("test_*.py")}
    folders = {
        f"{p.name}/" for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))
    }
    missing = sorted((files | folders) - set(names))
    assert not missing, f"add these to tests/README.rst: {missing}"
    twice = sorted(name for name, count in names.items() if count > 1)
    assert not twice, f"listed more than once in tests/README.rst: {twice}"


def test_every_file_on_the_map_exists() -> None:
    gone = sorted(name for name in listed() if not (TESTS / name).exists())
    assert not gone, f"tests/README.rst lists files that do not exist: {gone}"
