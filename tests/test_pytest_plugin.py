"""The pytest plugin the distribution registers (``pytest11``): inert without Django, its
fixtures where Django is configured, loaded once in this suite too."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from django_idempotency import _pytest_fixtures, _pytest_plugin

ENTRY_POINT = "django_idempotency._pytest_plugin"
#: This environment's heavy plugins a project would not have: each run starts in a second, not ten.
UNRELATED = [
    arg
    for name in ("schemathesis", "hypothesispytest", "faker", "anyio")
    for arg in ("-p", f"no:{name}")
]


def run_pytest(folder: Path, *args: str, settings: str = "") -> subprocess.CompletedProcess[str]:
    """pytest in ``folder``, as a project there runs it: this suite's settings left out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))}
    env["PYTHONPATH"] = str(folder)
    if settings:
        env["DJANGO_SETTINGS_MODULE"] = settings
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *UNRELATED, "-q", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_distribution_registers_the_plugin() -> None:
    points = [point.value for point in entry_points(group="pytest11")]
    # A development install made before the entry point existed needs `pip install -e .` again.
    assert ENTRY_POINT in points


def test_this_suite_loads_it_once(request: pytest.FixtureRequest) -> None:
    manager = request.config.pluginmanager
    assert manager.get_plugin("django_idempotency") is _pytest_plugin
    assert manager.get_plugin(_pytest_plugin.FIXTURES) is _pytest_fixtures
    assert [p for p in manager.get_plugins() if p is _pytest_fixtures] == [_pytest_fixtures]


def test_a_project_without_django_settings_gets_nothing(tmp_path: Path) -> None:
    (tmp_path / "test_plain.py").write_text(
        textwrap.dedent(
            """
            import pytest

            def test_plain(request):
                manager = request.config.pluginmanager
                assert manager.has_plugin("django_idempotency")  # loaded: the entry point
                assert not manager.has_plugin("django_idempotency.fixtures")
                with pytest.raises(pytest.FixtureLookupError):
                    request.getfixturevalue("idempotency_key")
            """
        )
    )
    result = run_pytest(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout


def test_a_django_project_gets_the_fixtures(tmp_path: Path) -> None:
    """A user's project: settings, a protected view, and tests that use the fixtures."""
    files = {
        "shop_settings.py": f"""
            SECRET_KEY = "x"
            USE_TZ = True
            ROOT_URLCONF = "shop_urls"
            INSTALLED_APPS = [
                "django.contrib.auth", "django.contrib.contenttypes", "django_idempotency"
            ]
            DATABASES = {{"default": {{
                "ENGINE": "django.db.backends.sqlite3", "NAME": {str(tmp_path / "db")!r}
            }}}}
            """,
        "shop_urls.py": """
            from django.http import JsonResponse
            from django.urls import path
            from django_idempotency import idempotent

            runs = []

            @idempotent
            def order(request):
                runs.append(1)
                return JsonResponse({"run": len(runs)}, status=201)

            urlpatterns = [path("orders/", order)]
            """,
        "test_shop.py": """
            import pytest

            @pytest.mark.django_db
            def test_replayed(client, idempotency, idempotency_key):
                headers = {"Idempotency-Key": idempotency_key}
                first = client.post("/orders/", headers=headers)
                idempotency.assert_replayed(client.post("/orders/", headers=headers), first)

            @pytest.mark.django_db
            def test_held(client, idempotency, idempotency_key):
                idempotency.hold_key(idempotency_key, "POST", "/orders/")
                headers = {"Idempotency-Key": idempotency_key}
                assert client.post("/orders/", headers=headers).status_code == 409
            """,
    }
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    result = run_pytest(tmp_path, settings="shop_settings")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout
