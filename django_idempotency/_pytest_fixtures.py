"""The fixtures of the pytest plugin (:mod:`._pytest_plugin` registers them where Django is
configured); each is a name of :mod:`django_idempotency.testing`, which they import only when
a test asks for them."""

from __future__ import annotations

from types import ModuleType

import pytest


@pytest.fixture
def idempotency() -> ModuleType:
    """The helpers of :mod:`django_idempotency.testing`: ``idempotency.hold_key(...)``."""
    from django_idempotency import testing

    return testing


@pytest.fixture
def idempotency_key() -> str:
    """A fresh key in the configured ``KEY_FORMAT``
    (:func:`~django_idempotency.testing.new_key`)."""
    from django_idempotency.testing import new_key

    return new_key()
