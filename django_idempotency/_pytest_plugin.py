"""The pytest plugin, registered by the distribution (the ``pytest11`` entry point).

pytest loads it in every project where the package is installed, Django or not, so it imports
nothing but pytest: its fixtures (:mod:`._pytest_fixtures`) are added only once a session starts
with Django's settings configured (by pytest-django, or a ``conftest.py``), and never twice.
"""

from __future__ import annotations

import sys

import pytest

#: The name the fixtures are registered under (``-p no:django_idempotency`` drops them too).
FIXTURES = "django_idempotency.fixtures"


def django_configured() -> bool:
    """Whether this process configured Django's settings (without importing Django)."""
    if "django" not in sys.modules:
        return False
    from django.conf import settings

    return bool(settings.configured)


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    manager = session.config.pluginmanager
    if django_configured() and not manager.has_plugin(FIXTURES):
        from django_idempotency import _pytest_fixtures

        manager.register(_pytest_fixtures, FIXTURES)
