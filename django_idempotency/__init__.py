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
    from django_idempotency._base.errors import IdempotencyError as IdempotencyError
    from django_idempotency._base.errors import IdempotencyFailed as IdempotencyFailed
    from django_idempotency._base.errors import IdempotencyInProgress as IdempotencyInProgress
    from django_idempotency._base.errors import IdempotencyKeyMismatch as IdempotencyKeyMismatch
    from django_idempotency._base.errors import LockLost as LockLost
    from django_idempotency._base.errors import StoreUnavailable as StoreUnavailable
    from django_idempotency._call.claim import Claim as Claim
    from django_idempotency._call.storing import no_store as no_store
    from django_idempotency._call.storing import store_for as store_for
    from django_idempotency._function import idempotent_function as idempotent_function
    from django_idempotency._http.decorators import idempotent as idempotent
    from django_idempotency._http.fingerprints import json_fingerprint as json_fingerprint
    from django_idempotency._ops.erasure import Erasure as Erasure
    from django_idempotency._ops.erasure import erase_scope as erase_scope
    from django_idempotency._publish.policy import describe as describe
    from django_idempotency.models import IdempotencyKey as IdempotencyKey

#: Where each name lives; ``tests/test_package.py`` holds this to the imports above.
_HOMES = {
    "idempotent": "_http.decorators",
    "idempotent_function": "_function",
    "no_store": "_call.storing",
    "store_for": "_call.storing",
    "json_fingerprint": "_http.fingerprints",
    "describe": "_publish.policy",
    "erase_scope": "_ops.erasure",
    "Erasure": "_ops.erasure",
    "Claim": "_call.claim",
    "IdempotencyKey": "models",
    "IdempotencyError": "_base.errors",
    "IdempotencyInProgress": "_base.errors",
    "IdempotencyKeyMismatch": "_base.errors",
    "IdempotencyFailed": "_base.errors",
    "LockLost": "_base.errors",
    "StoreUnavailable": "_base.errors",
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
