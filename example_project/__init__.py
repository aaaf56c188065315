"""The example project: a small payments API protected by django-idempotency."""
