"""One import path: ``from django_idempotency import ...``, loaded lazily, documented name for
name in ``docs/api.rst``; ``__all__`` in every public module; the private modules in layer
folders, none importing from a layer above its own (issue 40)."""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import django_idempotency
from django_idempotency import IdempotencyError, InvalidKey
from django_idempotency._call import storing as _storing

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


#: The package's layers from the ground up: a module imports from its own layer or one below.
LAYERS = [
    {"_base"},
    {"models"},
    {"_conf"},
    {"_store"},
    {"_call"},
    {"_http", "_function"},
    {"_publish", "_ops"},
    # What a project or Django imports: the public modules and Django's own places.
    {"__init__", "admin", "apps", "management", "migrations", "ninja", "rest_framework", "urls"},
    # (``templates``: the admin's, where Django looks for them; no module.)
    {"testing", "_pytest_fixtures", "_pytest_plugin"},
]


def _layer(module: str) -> int:
    room = [*module.split("."), "__init__"][1]
    return next(n for n, layer in enumerate(LAYERS) if room in layer)


def test_every_module_stands_in_a_layer() -> None:
    """Nothing but the layers at the top level: a private module goes in its layer's folder."""
    rooms = {p.name.removesuffix(".py") for p in PACKAGE.iterdir() if p.name != "__pycache__"}
    assert rooms - {"py.typed", "templates"} == set().union(*LAYERS)


def test_each_folder_says_what_it_owns_and_what_it_may_import() -> None:
    for folder in ("_base", "_conf", "_store", "_call", "_http", "_function", "_publish", "_ops"):
        doc = importlib.import_module(f"django_idempotency.{folder}").__doc__ or ""
        assert re.search(r"\bOwns\b", doc) and re.search(r"\bimport", doc, re.I), folder


#: The functions that import a module, or a name of one, given as a string.
_IMPORTERS = {"import_module", "import_string", "__import__"}


def _imported_by_name(node: ast.AST) -> str | None:
    """The package module a call such as ``import_module("django_idempotency.ninja")`` or
    ``import_string("django_idempotency.x.y")`` imports: an arrow the import statements do not
    show (issue 40)."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    function = node.func
    name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
    argument = node.args[0]
    if name not in _IMPORTERS or not isinstance(argument, ast.Constant):
        return None
    value = argument.value
    return value if isinstance(value, str) and value.startswith(PACKAGE.name) else None


def test_the_layer_test_sees_imports_by_name() -> None:
    called = ast.parse('importlib.import_module("django_idempotency.ninja")').body[0]
    assert isinstance(called, ast.Expr)
    assert _imported_by_name(called.value) == "django_idempotency.ninja"
    assert _layer("django_idempotency.ninja") > _layer("django_idempotency._http.adapter")
    assert _imported_by_name(ast.parse('import_string("json.dumps")').body[0].value) is None  # type: ignore[attr-defined]


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    """Type-only imports and imports inside functions count too: a cycle of any kind starts
    with an arrow that runs up."""
    upward = set()
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE.name):
                assert node.module is not None
                names = [f"{node.module}.{a.name}" for a in node.names]
                targets = names if node.module == PACKAGE.name else [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith(PACKAGE.name)]
            elif named := _imported_by_name(node):
                targets = [named]
            else:
                continue
            upward |= {(module, t) for t in targets if _layer(t) > _layer(module)}
    assert not upward


def _vendor_branches(source: str) -> list[int]:
    """The lines of ``source`` that ask which database a connection is on: a comparison with
    a ``.vendor``, or any ``connection.vendor``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(isinstance(o, ast.Attribute) and o.attr == "vendor" for o in operands):
                lines.append(node.lineno)
        elif isinstance(node, ast.Attribute) and node.attr == "vendor":
            owner = node.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if name.endswith("connection"):
                lines.append(node.lineno)
    return sorted(set(lines))


def test_the_vendor_test_sees_a_branch() -> None:
    assert _vendor_branches('if connection.vendor == "mysql":\n    pass') == [1]
    assert _vendor_branches('x = self.connection.vendor\ny = store.vendor in ("a", "b")') == [1, 2]
    assert _vendor_branches("if store.keeps_every_scope:\n    pass") == []


def test_only_the_vendor_modules_ask_which_database_they_are_on() -> None:
    """A new database is its vendor module and one line in ``VENDORS``: what the code every
    vendor shares needs of a database is a flag or a method of the store (as Django's
    ``BaseDatabaseFeatures``), never a branch on ``connection.vendor``. The registry picks a
    store by vendor, and a store refuses a connection of another (``_store/vendors.py``,
    ``_store/bound.py``); a migration keeps the test it was written with."""
    assert _outside_the_vendor_modules(_vendor_branches, "vendors.py", "bound.py") == []


def _outside_the_vendor_modules(find: Callable[[str], list[int]], *also: str) -> list[str]:
    """Where ``find`` finds something in the package (``path:line``), but in the vendor
    modules of ``VENDORS``, the store modules named in ``also`` and the migrations (each keeps
    the test it was written with)."""
    from django_idempotency._store import VENDORS

    homes = {
        Path(importlib.import_module(store.__module__).__file__ or "") for store in VENDORS.values()
    }
    homes |= {PACKAGE / "_store" / name for name in also}
    return [
        f"{path.relative_to(PACKAGE)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path not in homes and path.parent.name != "migrations"
        for line in find(path.read_text())
    ]


#: The calls that give a store (:func:`django_idempotency._store.using` and its siblings),
#: called by name or through the ``_store`` module.
_STORE_GETTERS = {"using", "served", "database_store"}
#: The annotations of a parameter that holds a store.
_STORE_TYPES = {"Store", "StoreContract", "store.Store", "store.StoreContract"}


def _gives_a_store(node: ast.AST) -> bool:
    """Whether ``node`` is a call of a store getter: ``using(...)``, ``store.using(...)``;
    never a queryset's or a manager's ``.using(...)`` (called on anything but a plain name)."""
    if not isinstance(node, ast.Call):
        return False
    called = node.func
    if isinstance(called, ast.Name):
        return called.id in _STORE_GETTERS
    return (
        isinstance(called, ast.Attribute)
        and called.attr in _STORE_GETTERS
        and isinstance(called.value, ast.Name)
        and called.value.id in {"store", "_store"}
    )


def _own_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of a module or a function, but those of the functions defined in it (each a
    scope of its own: a name may be a store in one and the ``_store`` module in another)."""
    nodes, left = [], list(ast.iter_child_nodes(scope))
    while left:
        node = left.pop()
        nodes.append(node)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            left += ast.iter_child_nodes(node)
    return nodes


def _store_names(function: ast.AST) -> set[str]:
    """The names that hold a store in ``function``: its parameters annotated as one, and the
    names given a getter's store (``x = using(...)``, ``x: T = ...``, ``(x := ...)``,
    ``x, y = using(...), ...``)."""
    names: set[str] = set()
    if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        arguments = function.args
        for argument in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
            shown = ast.unparse(argument.annotation) if argument.annotation else ""
            if shown.replace(" ", "").removesuffix("|None") in _STORE_TYPES:
                names.add(argument.arg)
    for node in _own_nodes(function):
        pairs: list[tuple[ast.AST, ast.AST]] = []
        if isinstance(node, ast.Assign):
            target, value = node.targets[0], node.value
            if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
                pairs += zip(target.elts, value.elts, strict=False)
            pairs += [(target, value)]
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            pairs.append((node.target, node.value))
        names |= {t.id for t, v in pairs if isinstance(t, ast.Name) and _gives_a_store(v)}
    return names


def _is_a_store(node: ast.AST, names: set[str]) -> bool:
    """Whether ``node`` is a store: a getter's call, a name holding one, ``(x := using(...))``."""
    if isinstance(node, ast.NamedExpr):
        node = node.value
    return _gives_a_store(node) or (isinstance(node, ast.Name) and node.id in names)


def _store_members(source: str) -> dict[str, list[int]]:
    """What ``source`` reaches on a store: each member (and each of its ``features``, as
    ``features.<flag>``) with its lines. A function defined in another sees its names."""
    found: dict[str, set[int]] = {}

    def visit(scope: ast.AST, outer: set[str]) -> None:
        names = outer | _store_names(scope)
        for node in _own_nodes(scope):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(node, names)
            elif isinstance(node, ast.Attribute) and _is_a_store(node.value, names):
                found.setdefault(node.attr, set()).add(node.lineno)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "features"
                and _is_a_store(node.value.value, names)
            ):
                found.setdefault(f"features.{node.attr}", set()).add(node.lineno)

    visit(ast.parse(source), set())
    return {name: sorted(lines) for name, lines in found.items()}


def _outside_the_contract(members: dict[str, list[int]]) -> list[str]:
    """The members of ``members`` that :class:`StoreContract` (or its features) does not declare."""
    from dataclasses import fields

    from django_idempotency._store.contract import StoreContract, StoreFeatures

    declared = set(dir(StoreContract)) | set(StoreContract.__annotations__)
    flags = {f"features.{field.name}" for field in fields(StoreFeatures)}
    return sorted(name for name in members if name not in declared | flags)


def test_the_contract_test_sees_a_member_outside_the_contract() -> None:
    source = """
def f(policy, other: Store):
    store = using(policy.alias)
    store.connection.in_atomic_block
    using(policy.alias).client
    other.features.supports_atomic
    other.features.is_redis
    (found := _store.served("x")).renew
    IdempotencyKey.objects.using("x").filter
"""
    members = _store_members(source)
    assert members == {
        "connection": [4],
        "client": [5],
        "features": [6, 7],
        "features.supports_atomic": [6],
        "features.is_redis": [7],
        "renew": [8],
    }
    assert _outside_the_contract(members) == ["connection", "features.is_redis"]


def test_upper_layers_reach_a_store_only_through_its_contract() -> None:
    """The engine, the views' and functions' layers, the operators' actions, the admin, the
    commands and the testing helpers ask a store (``using()``) nothing but what
    :class:`~django_idempotency._store.contract.StoreContract` declares: a store that
    implements the contract (the database's, Redis's, another) serves them all, and none needs
    to fake what it lacks (a Django connection)."""
    outside = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        if path.parent.name == "migrations" or ("_store" in parts and parts not in _CALLERS):
            continue
        members = _store_members(path.read_text())
        outside += [
            f"{path.relative_to(PACKAGE)}:{line} {name}"
            for name in _outside_the_contract(members)
            for line in members[name]
        ]
    assert outside == []


#: The store package's modules that reach a store as its callers do: through the contract.
_CALLERS = {("_store", "operations.py")}
#: What names a kind of store: a caller that asks it has a way of its own for that kind.
_STORE_KINDS = {"is_redis", "database_store", "Store", "RedisStore", "BoundStore"}


def _kinds_named(source: str) -> list[str]:
    """The names of a kind of store in ``source``, with their lines."""
    return [
        f"{node.lineno} {name}"
        for node in ast.walk(ast.parse(source))
        for name in [getattr(node, "id", None) or getattr(node, "attr", None)]
        if isinstance(node, (ast.Name, ast.Attribute)) and name in _STORE_KINDS
    ]


def test_the_relay_and_the_operations_have_one_way_for_every_store() -> None:
    """The outbox's relay pass, the request's layers (its fast path, its claim) and an
    operation's reads and writes ask the store's contract, never which kind of store it is:
    the database's and Redis's are served alike (and so would another's be)."""
    assert _kinds_named("if is_redis(a): store = database_store(a)") == [
        "1 is_redis",
        "1 database_store",
    ]
    modules = ["_ops/relay.py", "_store/operations.py"]
    modules += [f"{layer}/{path.name}" for layer in ("_call", "_http")
                for path in sorted((PACKAGE / layer).glob("*.py"))]  # fmt: skip
    for module in modules:
        assert _kinds_named((PACKAGE / module).read_text()) == [], module


#: What names Redis's kind of store: the question (``is_redis``), its class, its URLs' and
#: cache backends' lists.
_REDIS_KINDS = {"is_redis", "RedisStore", "REDIS_URLS", "REDIS_CACHES"}
#: A string that names a Redis form: a scheme (``rediss+sentinel``, ``redis://``, ``unix://``)
#: or a Redis cache backend.
_REDIS_FORM = re.compile(r"^(rediss?(\+\w+)?(://)?|unix(://)?|[\w.]*RedisCache)$", re.IGNORECASE)


def _redis_branches(source: str) -> list[str]:
    """Where ``source`` asks whether a store is Redis's: a name of its kind, or a Redis form
    compared with (``==``, ``in``, ``startswith``), each with its line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        name = getattr(node, "id", None) or getattr(node, "attr", None)
        if isinstance(node, (ast.Name, ast.Attribute)) and name in _REDIS_KINDS:
            found.append(f"{node.lineno} {name}")
        asks = isinstance(node, ast.Compare) or (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("startswith", "endswith", "removeprefix", "partition")
        )
        if asks:
            found += [
                f"{node.lineno} {each.value!r}"
                for each in ast.walk(node)
                if isinstance(each, ast.Constant)
                and isinstance(each.value, str)
                and _REDIS_FORM.match(each.value)
            ]
    return found


def test_the_redis_test_sees_a_branch_on_redis() -> None:
    source = """
if is_redis(alias): pass
if value.startswith(("redis://", "rediss://")): pass
if scheme == "redis+sentinel" or backend in REDIS_CACHES: pass
store = _store.redis.RedisStore
message = "a redis:// URL"
if name.startswith("cache:"): pass
"""
    assert sorted(_redis_branches(source)) == [
        "2 is_redis",
        "3 'redis://'",
        "3 'rediss://'",
        "4 'redis+sentinel'",
        "4 REDIS_CACHES",
        "5 RedisStore",
    ]  # the message (line 6) and the cache alias's prefix (line 7) ask nothing of Redis


def test_only_the_redis_store_and_the_registry_ask_whether_a_store_is_redis() -> None:
    """Which store serves a name is the registry's one mapping (:mod:`._conf.stores`): the
    settings' test, ``using()``, the commands and the operation ids' names ask it, or the
    store's class (``validate``, ``describe``, ``outbox_refusal``), never whether it is Redis.
    A new store is its module and one line there."""
    asked = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[:2] == ("_store", "redis") or relative == Path("_conf/stores.py"):
            continue
        asked += [f"{relative}:{each}" for each in _redis_branches(path.read_text())]
    assert asked == []


def test_the_registry_names_redis_on_one_line() -> None:
    """The registry's Redis entry is one statement: each Redis form to one dotted path."""
    from django_idempotency._conf import stores

    source = (PACKAGE / "_conf" / "stores.py").read_text()
    paths = {path for path in stores.STORES.values() if "redis" in path}
    from django_idempotency._store.redis import RedisStore, names

    assert paths == {names._STORE_CLASS}  # the Redis store's own modules know it by its path
    assert stores.kind(stores.form("redis://host/0")) is RedisStore
    assert source.count(names._STORE_CLASS) == 1


#: The database drivers a vendor module may speak to below Django's cursor.
_DRIVERS = {"psycopg", "psycopg2", "psycopg_pool", "MySQLdb", "pymysql", "sqlite3", "oracledb"}


def _driver_imports(source: str) -> list[int]:
    """The lines of ``source`` that import a database driver, at the top or in a function."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        if any(name.partition(".")[0] in _DRIVERS for name in names):
            lines.append(node.lineno)
    return sorted(lines)


def test_the_driver_test_sees_an_import() -> None:
    assert _driver_imports("def f():\n    from psycopg.pq import Format") == [2]
    assert _driver_imports("import MySQLdb.constants\nimport json") == [1]
    assert _driver_imports("from django.db import connection\nfrom . import sqlite") == []


def test_only_the_vendor_modules_import_a_database_driver() -> None:
    """What a database's driver offers below Django's cursor (psycopg's loaders, libpq's
    results, mysqlclient's rows) is its vendor's knowledge as much as ``connection.vendor``
    is: it lives in the vendor modules and their own driver modules (:mod:`.libpq`,
    :mod:`.mysqlclient`), never in the code every vendor shares."""
    assert _outside_the_vendor_modules(_driver_imports, "libpq.py", "mysqlclient.py") == []


def test_the_api_page_documents_exactly_the_exports() -> None:
    text = (PACKAGE.parent / "docs" / "api.rst").read_text()
    documented = re.findall(r"^\.\. auto\w+:: (django_idempotency[\w.]*)$", text, re.M)
    exported = [f"django_idempotency.{name}" for name in django_idempotency.__all__]
    for framework in ("rest_framework", "ninja", "testing"):
        module = importlib.import_module(f"django_idempotency.{framework}")
        exported += [f"{module.__name__}.{name}" for name in module.__all__]
    assert sorted(documented) == sorted(exported)


def test_invalid_key_is_one_of_the_app_s_errors() -> None:
    assert issubclass(InvalidKey, IdempotencyError)
    assert issubclass(InvalidKey, ValueError)  # as before 1.0


def test_no_module_patches_a_name_it_imports_from_the_package() -> None:
    """A class's methods are written in its own body: a module that sets an attribute on a
    class it imports (``Claim.save_point = ...``) hides an import cycle, and a reader of the
    class cannot find the method."""
    patched = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {
            alias.asname or alias.name
            for node in tree.body
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE.name)
            for alias in node.names
        }
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets = [node.target]
            patched += [
                f"{path.relative_to(PACKAGE)}:{node.lineno}"
                for target in targets
                if isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id in imported
            ]
    assert patched == []


def test_the_package_s_comments_cite_no_issue_numbers() -> None:
    """History lives in the changelog and the commits; a comment says why in present terms."""
    cited = re.compile(r"\bissues?[\s#]*\d", re.I)
    found = [
        f"{path.relative_to(PACKAGE)}:{path.read_text()[: match.start()].count(chr(10)) + 1}"
        for path in sorted(PACKAGE.rglob("*"))
        if path.suffix in {".py", ".html", ".txt"}
        for match in cited.finditer(path.read_text())
    ]
    assert found == []


#: The longest a package function may be, from its ``def`` to its last line (decorators not
#: counted): longer, it does more than one step, and a reader cannot see it whole.
MAX_FUNCTION_LINES = 50


def _long_functions(source: str) -> list[tuple[str, int, int]]:
    """Each function of ``source`` (methods and nested ones too) longer than
    :data:`MAX_FUNCTION_LINES`: its name, first line and length."""
    return [
        (node.name, node.lineno, length)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and (length := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_FUNCTION_LINES
    ]


def test_the_length_test_sees_a_long_function() -> None:
    body = "".join(f"    x{n} = {n}\n" for n in range(MAX_FUNCTION_LINES - 1))
    assert _long_functions(f"def f():\n{body}") == []
    assert _long_functions(f"class C:\n def g(self):\n{body}    pass\n") == [
        ("g", 2, MAX_FUNCTION_LINES + 1)
    ]


def test_no_package_function_is_longer_than_fifty_lines() -> None:
    """A function does one step, cut along the steps it calls; the migrations, written once
    and never read again, are left as Django writes them."""
    found = [
        f"{path.relative_to(PACKAGE)}:{line} {name} ({length} lines)"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.parent.name != "migrations"
        for name, line, length in _long_functions(path.read_text())
    ]
    assert found == []


def test_every_ci_leg_fails_on_a_failed_command() -> None:
    """Each leg's script runs under ``set -euo pipefail``: the celery leg ran without it, and
    its suites' failures but the last passed the leg (and its last was swallowed too)."""
    ci = PACKAGE.parent / ".ci"
    if not ci.is_dir():
        pytest.skip("no .ci here: the sdist ships the package and its tests, not the CI")
    scripts = [path for path in ci.iterdir() if path.name.startswith("leg-") or path.name == "fuzz"]
    assert scripts
    lax = [p.name for p in scripts if "\nset -euo pipefail\n" not in p.read_text()]
    assert lax == []
