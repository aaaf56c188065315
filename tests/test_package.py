"""One import path: ``from django_idempotency import ...``, loaded lazily; ``__all__`` in every
public module; the documented homes of renamed modules still importable."""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import django_idempotency
from django_idempotency._base import keys as _keys
from django_idempotency._call import storing as _storing
from django_idempotency._publish import policy as _published

PACKAGE = Path(django_idempotency.__file__).parent


def test_importing_the_package_loads_nothing_heavy() -> None:
    """Django imports the package while it reads INSTALLED_APPS, before any model can load; a
    project without DRF imports it too."""
    code = """
import json, sys
sys.modules["rest_framework"] = None  # not installed: importing it raises ImportError
import django_idempotency
from django.apps import apps
heavy = ("django_idempotency.", "rest_framework.", "django.db", "django.http")
print(json.dumps({
    "ready": apps.ready,
    "loaded": sorted(m for m in sys.modules if m.startswith(heavy)),
    "dir": dir(django_idempotency),
}))
"""
    env = {"PATH": "", "PYTHONPATH": str(PACKAGE.parent)}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    found = json.loads(result.stdout)
    assert found["ready"] is False
    assert found["loaded"] == []
    assert set(django_idempotency.__all__) <= set(found["dir"])


def test_each_name_is_the_one_of_its_home() -> None:
    for name in django_idempotency.__all__:
        if name == "__version__":
            continue
        home = importlib.import_module(f"django_idempotency.{django_idempotency._HOMES[name]}")
        assert getattr(django_idempotency, name) is getattr(home, name), name
    assert django_idempotency.no_store is _storing.no_store


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        django_idempotency.idempotnt  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "idempotnt" in str(exc)
    else:
        raise AssertionError("no AttributeError")


def test_type_checkers_see_the_names_the_package_exports() -> None:
    """The ``TYPE_CHECKING`` block re-exports exactly the names ``__getattr__`` serves."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    seen = {
        alias.asname
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        for statement in node.body
        if isinstance(statement, ast.ImportFrom)
        for alias in statement.names
    }
    assert seen == set(django_idempotency._HOMES)
    assert django_idempotency.__all__ == ["__version__", *django_idempotency._HOMES]


def _public_modules() -> list[str]:
    names = []
    for module in pkgutil.walk_packages([str(PACKAGE)], "django_idempotency."):
        parts = module.name.split(".")[1:]
        if any(part.startswith("_") for part in parts) or parts[0] in ("migrations", "management"):
            continue
        names.append(module.name)
    return names


def test_every_public_module_says_what_it_exports() -> None:
    modules = _public_modules()
    assert "django_idempotency.rest_framework" in modules
    for name in modules:
        module = importlib.import_module(name)
        assert module.__all__, name
        for exported in module.__all__:
            assert hasattr(module, exported), f"{name}.{exported}"


def test_the_renamed_modules_documented_names_still_import() -> None:
    from django_idempotency.keys import InvalidKey
    from django_idempotency.published import describe

    assert InvalidKey is _keys.InvalidKey
    assert describe is _published.describe


def test_the_module_map_names_every_module() -> None:
    """``docs/how-it-works.rst`` gives each module its line."""
    text = (PACKAGE.parent / "docs" / "how-it-works.rst").read_text()
    mapped = set(re.findall(r"``([\w/]+)``", text))
    for module in pkgutil.walk_packages([str(PACKAGE)], ""):
        parts = module.name.split(".")
        # A package's modules are in its line (_store, migrations, management/commands).
        if not any("/".join(parts[:n]) in mapped for n in range(1, len(parts) + 1)):
            raise AssertionError(f"{module.name} is not in the module map")
    assert "__init__" in mapped
