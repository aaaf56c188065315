"""Make state-changing Django endpoints safe to retry with the ``Idempotency-Key`` header.

Every name a project uses is importable from here: ``from django_idempotency import
idempotent, ...``. They are loaded on first use (PEP 562), so importing the package, as Django
does while it reads ``INSTALLED_APPS``, loads no models and no DRF. The DRF mixin is
:class:`django_idempotency.rest_framework.IdempotencyMixin`, where importing DRF is expected.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers see; ``X as X``: re-exported
    from django_idempotency._erasure import Erasure as Erasure
    from django_idempotency._erasure import erase_scope as erase_scope
    from django_idempotency._published import describe as describe
    from django_idempotency._storing import no_store as no_store
    from django_idempotency._storing import store_for as store_for
    from django_idempotency.claim import Claim as Claim
    from django_idempotency.decorators import idempotent as idempotent
    from django_idempotency.exceptions import IdempotencyError as IdempotencyError
    from django_idempotency.exceptions import IdempotencyFailed as IdempotencyFailed
    from django_idempotency.exceptions import IdempotencyInProgress as IdempotencyInProgress
    from django_idempotency.exceptions import IdempotencyKeyMismatch as IdempotencyKeyMismatch
    from django_idempotency.exceptions import LockLost as LockLost
    from django_idempotency.exceptions import StoreUnavailable as StoreUnavailable
    from django_idempotency.fingerprints import json_fingerprint as json_fingerprint
    from django_idempotency.functions import idempotent_function as idempotent_function
    from django_idempotency.models import IdempotencyKey as IdempotencyKey

#: Where each name lives; ``tests/test_package.py`` holds this to the imports above.
_HOMES = {
    "idempotent": "decorators",
    "idempotent_function": "functions",
    "no_store": "_storing",
    "store_for": "_storing",
    "json_fingerprint": "fingerprints",
    "describe": "_published",
    "erase_scope": "_erasure",
    "Erasure": "_erasure",
    "Claim": "claim",
    "IdempotencyKey": "models",
    "IdempotencyError": "exceptions",
    "IdempotencyInProgress": "exceptions",
    "IdempotencyKeyMismatch": "exceptions",
    "IdempotencyFailed": "exceptions",
    "LockLost": "exceptions",
    "StoreUnavailable": "exceptions",
}

__all__ = ["__version__", *_HOMES]

try:
    __version__ = version("django-idempotency")
except PackageNotFoundError:  # run from a checkout, not installed
    __version__ = "0+unknown"


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if not TYPE_CHECKING:  # so that type checkers refuse a name that is not exported

    def __getattr__(name: str) -> Any:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(import_module(f"{__name__}.{home}"), name)
        globals()[name] = value  # the next read is a plain attribute
        return value
