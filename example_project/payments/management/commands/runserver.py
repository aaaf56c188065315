"""``runserver`` that applies migrations first, so a fresh clone serves at once."""

from __future__ import annotations

import os
from typing import Any

from django.contrib.staticfiles.management.commands.runserver import (
    Command as StaticfilesRunserver,
)
from django.core.management import call_command
from django.utils.autoreload import DJANGO_AUTORELOAD_ENV


class Command(StaticfilesRunserver):
    help = "Apply the example project's migrations, then start the development server."

    def handle(self, *args: Any, **options: Any) -> None:
        # Under the autoreloader, only the parent process migrates; its child serves.
        if os.environ.get(DJANGO_AUTORELOAD_ENV) != "true":
            call_command("migrate", interactive=False, verbosity=options["verbosity"])
        super().handle(*args, **options)
