from __future__ import annotations

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from django_idempotency._base import rules

__all__ = ["IdempotencyKey"]


class IdempotencyKey(models.Model):
    """One idempotency key of one scope: its claim, its lock and its stored response.

    The state machine (``docs/how-it-works.rst``): a claim inserts the row as ``processing``;
    the view's final response moves it to ``completed`` (2xx/3xx) or ``failed`` (deterministic
    4xx); an exception or a retryable status deletes it. ``lock_token`` fences every write of
    an attempt, so an owner whose lock was taken over cannot store its late result.
    """

    class Status(models.TextChoices):
        PROCESSING = rules.PROCESSING, _("processing")
        COMPLETED = "completed", _("completed")
        FAILED = "failed", _("failed")

    scope = models.CharField(_("scope"), max_length=255)
    key_hash = models.CharField(_("key hash"), max_length=64, help_text=_("SHA-256 of the key."))
    method = models.CharField(_("method"), max_length=16)
    # A TextField: a long query string must never overflow the column.
    path = models.TextField(_("path"))
    request_hash = models.CharField(_("request fingerprint"), max_length=64)
    status = models.CharField(
        _("status"), max_length=16, choices=Status.choices, default=Status.PROCESSING
    )
    response_status = models.PositiveSmallIntegerField(_("response status"), null=True, blank=True)
    response_headers = models.JSONField(_("response headers"), default=list, blank=True)
    response_body = models.BinaryField(_("response body"), null=True, blank=True)
    recovery_point = models.CharField(_("recovery point"), max_length=255, blank=True, default="")
    recovery_data = models.JSONField(_("recovery data"), null=True, blank=True)
    lock_token = models.UUIDField(_("lock token"), null=True, blank=True)
    attempt = models.PositiveIntegerField(_("attempt"), default=1)
    created_at = models.DateTimeField(_("created"), default=timezone.now)
    updated_at = models.DateTimeField(_("updated"), default=timezone.now)
    unlock_at = models.DateTimeField(_("unlock at"), null=True, blank=True)
    expires_at = models.DateTimeField(_("expires at"))

    class Meta:
        verbose_name = _("idempotency key")
        verbose_name_plural = _("idempotency keys")
        # The admin shows a decrypted response only to staff holding it (ENCRYPTION_KEYS).
        permissions = [("view_stored_response", _("Can view stored responses"))]
        constraints = [
            models.UniqueConstraint(
                fields=["scope", "key_hash"], name="django_idempotency_scope_key_uniq"
            ),
        ]
        indexes = [
            models.Index(fields=["expires_at"], name="django_idempotency_expires"),
            # The stale scan's (status processing, unlock_at passed). Not a partial index,
            # which MySQL and MariaDB lack (models.W037): a record leaves processing with its
            # unlock_at set to NULL, so the range unlock_at <= cutoff holds processing records only.
            models.Index(fields=["unlock_at"], name="django_idempotency_stale"),
        ]

    def __str__(self) -> str:
        return f"{self.scope} {self.key_hash[:12]} ({self.status})"

    @property
    def is_expired(self) -> bool:
        """:data:`~django_idempotency._base.rules.EXPIRED` now."""
        return rules.EXPIRED.holds(self, timezone.now())

    @property
    def is_stale(self) -> bool:
        """:data:`~django_idempotency._base.rules.STALE` now."""
        return rules.STALE.holds(self, timezone.now())
