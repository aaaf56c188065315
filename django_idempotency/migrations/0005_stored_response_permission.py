"""The ``view_stored_response`` permission: with ``ENCRYPTION_KEYS`` set, the admin shows a
decrypted response only to staff holding it. Options only: no SQL."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("django_idempotency", "0004_claim_reads_first"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="idempotencykey",
            options={
                "permissions": [("view_stored_response", "Can view stored responses")],
                "verbose_name": "idempotency key",
                "verbose_name_plural": "idempotency keys",
            },
        ),
    ]
