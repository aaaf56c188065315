"""Joins issue 28's and issue 31's migrations, both numbered 0004 on their branches (the lead
may renumber them instead)."""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("django_idempotency", "0004_claim_reads_first"),
        ("django_idempotency", "0004_stored_response_permission"),
    ]

    operations = []
