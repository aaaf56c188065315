"""Sphinx configuration for django-idempotency's documentation."""

from __future__ import annotations

import sys
from pathlib import Path

import django
from django.conf import settings

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))
# Just enough for autodoc to import the app: the docs extra installs Sphinx, furo and DRF (for
# IdempotencyMixin), not the test suite's dependencies.
settings.configure(
    INSTALLED_APPS=[
        "django.contrib.admin",  # for IdempotencyKeyAdmin
        "django.contrib.contenttypes",
        "django.contrib.auth",
        "django.contrib.messages",
        "django.contrib.sessions",
        "django_idempotency",
    ],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
)
django.setup()

project = "django-idempotency"
author = "django-idempotency developers"
copyright = "2026, django-idempotency developers"

# No intersphinx: CI has no network beyond the package index, and -W would fail on a fetch.
# declarations: the settings' and options' tables and entries, from _conf.settings.
extensions = ["sphinx.ext.autodoc", "declarations"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
html_theme = "furo"
html_title = "django-idempotency"
exclude_patterns = ["_build"]
