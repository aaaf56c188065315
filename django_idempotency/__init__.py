"""Make state-changing Django endpoints safe to retry with the ``Idempotency-Key`` header.

Every public name is importable from here, and from nowhere else: ``from django_idempotency
import idempotent, ...`` (the framework modules ``rest_framework``, ``ninja`` and ``testing``
aside). They are loaded on first use (PEP 562), so importing the package, as Django does while
it reads ``INSTALLED_APPS``, loads no models and no DRF.

The private modules are grouped by layer, each folder importing only the ones below it:
``_base`` (exceptions, signals, rules), ``_conf`` (settings and options), ``_store`` (all SQL),
``_call`` (the HTTP-free core of an attempt), ``_http`` and ``_function`` (the two kinds of
caller), ``_publish`` (the published policy, OpenAPI), ``_ops`` (operations and checks); each
folder's docstring says what it owns (``docs/how-it-works.rst`` shows them).
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
    from django_idempotency._base.errors import InvalidKey as InvalidKey
    from django_idempotency._base.errors import LockLost as LockLost
    from django_idempotency._base.errors import LockWaitTimeout as LockWaitTimeout
    from django_idempotency._base.errors import OperationError as OperationError
    from django_idempotency._base.errors import StoreUnavailable as StoreUnavailable
    from django_idempotency._base.errors import UnreplayableResponse as UnreplayableResponse
    from django_idempotency._base.signals import fingerprint_mismatch as fingerprint_mismatch
    from django_idempotency._base.signals import key_claimed as key_claimed
    from django_idempotency._base.signals import key_released as key_released
    from django_idempotency._base.signals import key_taken_over as key_taken_over
    from django_idempotency._base.signals import late_result_refused as late_result_refused
    from django_idempotency._base.signals import lock_lost as lock_lost
    from django_idempotency._base.signals import request_in_progress as request_in_progress
    from django_idempotency._base.signals import response_replayed as response_replayed
    from django_idempotency._call.claim import Claim as Claim
    from django_idempotency._call.storing import no_store as no_store
    from django_idempotency._call.storing import store_for as store_for
    from django_idempotency._function import JSONSerializer as JSONSerializer
    from django_idempotency._function import ResultSerializer as ResultSerializer
    from django_idempotency._function import idempotent_function as idempotent_function
    from django_idempotency._http.decorators import idempotent as idempotent
    from django_idempotency._http.fingerprints import json_fingerprint as json_fingerprint
    from django_idempotency._http.fingerprints import request_fingerprint as request_fingerprint
    from django_idempotency._http.operations import complete_operation as complete_operation
    from django_idempotency._http.operations import fail_operation as fail_operation
    from django_idempotency._http.operations import (
        set_operation_progress as set_operation_progress,
    )
    from django_idempotency._http.scopes import user_scope as user_scope
    from django_idempotency._ops.erasure import Erasure as Erasure
    from django_idempotency._ops.erasure import erase_scope as erase_scope
    from django_idempotency._publish.policy import describe as describe
    from django_idempotency.admin import IdempotencyKeyAdmin as IdempotencyKeyAdmin
    from django_idempotency.models import IdempotencyKey as IdempotencyKey

#: Where each name lives; ``tests/test_package.py`` holds this to the imports above and
#: ``docs/api.rst`` to the names documented there.
_HOMES = {
    "idempotent": "_http.decorators",
    "idempotent_function": "_function",
    "JSONSerializer": "_function",
    "ResultSerializer": "_function",
    "no_store": "_call.storing",
    "store_for": "_call.storing",
    "json_fingerprint": "_http.fingerprints",
    "request_fingerprint": "_http.fingerprints",
    "user_scope": "_http.scopes",
    "describe": "_publish.policy",
    "erase_scope": "_ops.erasure",
    "complete_operation": "_http.operations",
    "fail_operation": "_http.operations",
    "set_operation_progress": "_http.operations",
    "Erasure": "_ops.erasure",
    "Claim": "_call.claim",
    "IdempotencyKey": "models",
    "IdempotencyKeyAdmin": "admin",
    "IdempotencyError": "_base.errors",
    "IdempotencyInProgress": "_base.errors",
    "IdempotencyKeyMismatch": "_base.errors",
    "IdempotencyFailed": "_base.errors",
    "InvalidKey": "_base.errors",
    "LockLost": "_base.errors",
    "LockWaitTimeout": "_base.errors",
    "OperationError": "_base.errors",
    "StoreUnavailable": "_base.errors",
    "UnreplayableResponse": "_base.errors",
    "key_claimed": "_base.signals",
    "key_taken_over": "_base.signals",
    "response_replayed": "_base.signals",
    "request_in_progress": "_base.signals",
    "fingerprint_mismatch": "_base.signals",
    "key_released": "_base.signals",
    "late_result_refused": "_base.signals",
    "lock_lost": "_base.signals",
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
