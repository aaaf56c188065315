"""The benchmark project under uvicorn (benchmarks/scale.py's async view)."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.overhead_project.settings")

application = get_asgi_application()
