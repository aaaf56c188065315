"""The admin index's entry for the Redis stores' records: a proxy model with no permissions of
its own. No SQL (a proxy has no table); ``migrate`` adds its content type, as for any model."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("django_idempotency", "0009_takeover_keeps_expiry_past_lock"),
    ]

    operations = [
        migrations.CreateModel(
            name="RedisIdempotencyKey",
            fields=[],
            options={
                "verbose_name": "idempotency key in Redis",
                "verbose_name_plural": "idempotency keys in Redis",
                "proxy": True,
                "default_permissions": (),
                "indexes": [],
                "constraints": [],
            },
            bases=("django_idempotency.idempotencykey",),
        ),
    ]
