"""Sphinx configuration for django-idempotency's documentation."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import django

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()

project = "django-idempotency"
author = "django-idempotency developers"
copyright = "2026, django-idempotency developers"

# No intersphinx: CI has no network beyond the package index, and -W would fail on a fetch.
extensions = ["sphinx.ext.autodoc"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
html_theme = "furo"
html_title = "django-idempotency"
exclude_patterns = ["_build"]
