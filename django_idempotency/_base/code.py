"""What a view's own code names, read from its code objects (never run): how a view on a Redis
store that stages outbox messages or reads its operation is refused before it runs, at
``check`` and at its first request, instead of answering ``500`` from ``enqueue`` after its
own writes (a charge without its receipt), or ``202`` with an operation nothing can find.

A view's code is its function's, or, for a class-based view, every function its own classes
define (``post``, ``perform_create``, nested functions included); the framework's classes
(Django, DRF, django-ninja, this app) are not read. A call made from a helper in another
function is not seen: ``enqueue`` and the operation's id refuse it when it runs.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator
from types import CodeType
from typing import Any

#: Modules whose classes are not the user's: their methods are not read.
_FRAMEWORKS = ("django.", "rest_framework.", "ninja.", "django_idempotency.")


def mentions(target: Any, name: str) -> bool:
    """Whether the code of ``target`` (a function, a bound method, a ``partial``, a class)
    names the attribute or global ``name``."""
    return name in _names(_holder(target))


def _holder(target: Any) -> Any:
    """The function or class whose code is read: a ``partial``'s function, a bound method's
    class (``method_decorator`` hands the decorator a bound ``dispatch``), a wrapper's
    original."""
    seen = 0
    while seen < 32:  # a chain of wrappers, never a cycle
        seen += 1
        if isinstance(target, functools.partial):
            target = target.func
        elif inspect.ismethod(target):
            owner = target.__self__
            return owner if isinstance(owner, type) else type(owner)
        elif getattr(target, "__wrapped__", None) is not None:
            target = target.__wrapped__
        else:
            break
    return target


@functools.lru_cache(maxsize=4096)
def _names(holder: Any) -> frozenset[str]:
    return frozenset(name for code in _codes(holder) for name in _code_names(code))


def _codes(holder: Any) -> Iterator[CodeType]:
    if isinstance(holder, type):
        for klass in holder.__mro__:
            module = getattr(klass, "__module__", "") or ""
            if klass is object or module.startswith(_FRAMEWORKS) or module == "builtins":
                continue
            for value in vars(klass).values():
                if isinstance(value, (staticmethod, classmethod)):
                    value = value.__func__
                code = getattr(_holder(value), "__code__", None)
                if isinstance(code, CodeType):
                    yield code
        return
    code = getattr(holder, "__code__", None)
    if isinstance(code, CodeType):
        yield code
    view_class = getattr(holder, "view_class", None) or getattr(holder, "cls", None)
    if isinstance(view_class, type):  # View.as_view(), a DRF viewset's as_view()
        yield from _codes(view_class)


def _code_names(code: CodeType) -> Iterator[str]:
    yield from code.co_names
    for constant in code.co_consts:
        if isinstance(constant, CodeType):  # nested functions, lambdas, comprehensions
            yield from _code_names(constant)
