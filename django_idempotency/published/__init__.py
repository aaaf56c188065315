"""The documented home of :func:`describe` before 1.0; the code lives in
:mod:`django_idempotency._publish.policy`.

A package rather than ``published.py`` so that git, merging a branch that changed
``published.py``, follows the rename to ``_published.py``.
"""

from __future__ import annotations

from django_idempotency._publish.policy import describe

__all__ = ["describe"]
