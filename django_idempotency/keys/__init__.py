"""The documented home of :class:`InvalidKey` before 1.0; the code lives in
:mod:`django_idempotency._base.keys`.

A package rather than ``keys.py`` so that git, merging a branch that changed ``keys.py``, follows
the rename to ``_keys.py``.
"""

from __future__ import annotations

from django_idempotency._base.keys import InvalidKey

__all__ = ["InvalidKey"]
