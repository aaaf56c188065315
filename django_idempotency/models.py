from __future__ import annotations

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from django_idempotency._base import rules

__all__ = ["IdempotencyKey", "OutboxMessage", "RedisIdempotencyKey"]


class IdempotencyKey(models.Model):
    """One idempotency key of one scope: its claim, its lock and its stored response.

    The state machine (``docs/how-it-works.rst``): a claim inserts the row as ``processing``;
    the view's final response moves it to ``completed`` (2xx/3xx) or ``failed`` (deterministic
    4xx); an exception or a retryable status deletes it. ``lock_token`` fences every write of
    an attempt, so an owner whose lock was taken over cannot store its late result.
    """

    class Status(models.TextChoices):
        PROCESSING = rules.PROCESSING, _("processing")
        COMPLETED = rules.COMPLETED, _("completed")
        FAILED = rules.FAILED, _("failed")

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


class RedisIdempotencyKey(IdempotencyKey):
    """The admin index's entry for the records of every store besides the database (a Redis
    store, another of the registry): a proxy, so no table and no SQL; no permissions of its
    own (``IdempotencyKey``'s apply), so none to grant again. Its admin lists the stores, whose
    records never live in this table. Named for Redis, the first such store: the name is in
    the admin's URLs and a migration, so it stays; the index names the entry per request
    after the stores it lists (``RedisIdempotencyKeyAdmin.get_model_perms``)."""

    class Meta:
        proxy = True
        default_permissions = ()
        verbose_name = _("idempotency key in Redis")
        verbose_name_plural = _("idempotency keys in Redis")


class OutboxMessage(models.Model):
    """A message an attempt staged with :meth:`~django_idempotency.Claim.enqueue`, released
    with the attempt's result (or a recovery point) and delivered by the fast path or
    ``manage.py idempotency_relay`` (``docs/outbox.rst``).

    ``record`` has no foreign key constraint: the app deletes records with plain SQL (a
    release, the cleanup), and a message released by a recovery point outlives a record an
    operator released. ``idempotency_cleanup`` deletes delivered messages once their record is
    gone. ``available_at`` is when a sender may take the message: a lease while the fast path
    or a relay sends it, a backoff after a failed send.
    """

    class State(models.TextChoices):
        PENDING = "pending", _("pending")
        SENT = "sent", _("sent")
        FAILED = "failed", _("failed")

    record = models.ForeignKey(
        IdempotencyKey,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="outbox_messages",
        verbose_name=_("record"),
    )
    message_id = models.CharField(_("message id"), max_length=36, unique=True)
    engine = models.CharField(_("engine"), max_length=16)
    task = models.CharField(_("task"), max_length=255)
    arguments = models.TextField(_("arguments"), help_text=_("JSON: args and kwargs."))
    state = models.CharField(
        _("state"), max_length=16, choices=State.choices, default=State.PENDING
    )
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    last_error = models.TextField(_("last error"), blank=True, default="")
    released_at = models.DateTimeField(_("released"), default=timezone.now)
    available_at = models.DateTimeField(_("available at"), default=timezone.now)
    sent_at = models.DateTimeField(_("sent"), null=True, blank=True)

    class Meta:
        verbose_name = _("outbox message")
        verbose_name_plural = _("outbox messages")
        indexes = [
            # The relay's scan: pending messages by when they may be sent.
            models.Index(fields=["state", "available_at"], name="django_idempotency_outbox"),
        ]

    def __str__(self) -> str:
        return f"{self.task} {self.message_id} ({self.state})"
