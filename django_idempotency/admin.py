"""A read-only admin for support and operators: look a key up, read its stored response, and
release stale locks, mark them failed or delete expired records (the same statements as the
commands, from :mod:`django_idempotency.maintenance`)."""

from __future__ import annotations

import contextlib
import json
import re
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _

from django_idempotency import maintenance
from django_idempotency.conf import conf
from django_idempotency.keys import InvalidKey, hash_key, parse_key
from django_idempotency.models import IdempotencyKey

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[IdempotencyKey]
else:  # ModelAdmin is generic in django-stubs only
    _ModelAdmin = admin.ModelAdmin

#: Characters of a stored body shown on the change page; the rest is cut off.
BODY_DISPLAY_LIMIT = 10_000
#: Records the "delete expired" action deletes per short transaction.
DELETE_BATCH_SIZE = 1000
_HEX = re.compile(r"^[0-9a-f]{8,64}$")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


class _YesNoFilter(admin.SimpleListFilter):
    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("yes", _("Yes")), ("no", _("No"))]

    def condition(self) -> Q:
        raise NotImplementedError

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyKey]
    ) -> QuerySet[IdempotencyKey]:
        if self.value() == "yes":
            return queryset.filter(self.condition())
        if self.value() == "no":
            return queryset.exclude(self.condition())
        return queryset


class StaleFilter(_YesNoFilter):
    title = _("stale")
    parameter_name = "stale"

    def condition(self) -> Q:
        return maintenance.stale(timezone.now())


class ExpiredFilter(_YesNoFilter):
    title = _("expired")
    parameter_name = "expired"

    def condition(self) -> Q:
        return Q(expires_at__lte=timezone.now())


class MethodFilter(admin.SimpleListFilter):
    """The protected methods (the ``METHODS`` setting): no ``SELECT DISTINCT`` over the table."""

    title = _("method")
    parameter_name = "method"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [
            (method, method) for method in sorted(conf.METHODS | {"POST", "PUT", "PATCH", "DELETE"})
        ]

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyKey]
    ) -> QuerySet[IdempotencyKey]:
        value = self.value()
        return queryset.filter(method=value) if value else queryset


@admin.register(IdempotencyKey)
class IdempotencyKeyAdmin(_ModelAdmin):
    list_display = (
        "short_key",
        "status",
        "scope",
        "method",
        "path",
        "response_status",
        "created_at",
        "unlock_at",
        "expires_at",
        "stale",
        "expired",
    )
    list_filter = ("status", MethodFilter, StaleFilter, ExpiredFilter)
    date_hierarchy = "created_at"
    # Shows the search box; get_search_results does the actual matching.
    search_fields = ("scope", "path")
    search_help_text = _(
        "An exact idempotency key (quoted or bare; it is hashed before the lookup), a key hash "
        "or its first 8+ characters, an exact scope, or part of a path."
    )
    ordering = ("-created_at",)
    show_full_result_count = False
    actions = ("release_stale", "mark_failed", "delete_expired")
    fieldsets = (
        (None, {"fields": ("scope", "key_hash", "method", "path", "request_hash", "status")}),
        (
            _("Stored response"),
            {"fields": ("response_status", "stored_headers", "stored_body")},
        ),
        (
            _("Lock and recovery"),
            {
                "fields": (
                    "attempt",
                    "lock_token",
                    "recovery_point",
                    "recovery_data",
                    "stale",
                    "expired",
                )
            },
        ),
        (_("Dates"), {"fields": ("created_at", "updated_at", "unlock_at", "expires_at")}),
    )
    readonly_fields = (
        *("scope", "key_hash", "method", "path", "request_hash", "status"),
        *("response_status", "stored_headers", "stored_body"),
        *("attempt", "lock_token", "recovery_point", "recovery_data", "stale", "expired"),
        *("created_at", "updated_at", "unlock_at", "expires_at"),
    )

    # Read-only: nobody adds or edits a record here, whatever their permissions. Changelist-level
    # change and delete permissions still gate the actions.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return obj is None and super().has_change_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return obj is None and super().has_delete_permission(request)

    def get_queryset(self, request: HttpRequest) -> QuerySet[IdempotencyKey]:
        return super().get_queryset(request).using(conf.DATABASE_ALIAS)

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        # Django 6.1 asks for one page's actions (changelist or change form) and deprecates
        # overrides without ``action_location``; 5.2 and 6.0 have no such parameter.
        page = {} if action_location is None else {"action_location": action_location}
        actions = super().get_actions(request, **page)
        # Deleting a live record would let a duplicate run: only expired ones go.
        actions.pop("delete_selected", None)
        return actions

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyKey], search_term: str
    ) -> tuple[QuerySet[IdempotencyKey], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        condition = Q(scope=term) | Q(path__contains=term)
        with contextlib.suppress(InvalidKey):
            condition |= Q(key_hash=hash_key(parse_key(term)))
        if _HEX.match(term.lower()):
            condition |= Q(key_hash__startswith=term.lower())
        return queryset.filter(condition), False

    @admin.display(description=_("key hash"), ordering="key_hash")
    def short_key(self, record: IdempotencyKey) -> str:
        return record.key_hash[:12]

    @admin.display(description=_("stale"), boolean=True)
    def stale(self, record: IdempotencyKey) -> bool:
        return record.is_stale

    @admin.display(description=_("expired"), boolean=True)
    def expired(self, record: IdempotencyKey) -> bool:
        return record.is_expired

    @admin.display(description=_("response headers"))
    def stored_headers(self, record: IdempotencyKey) -> str:
        headers = record.response_headers or []
        if not headers:
            return "-"
        return format_html(
            "<pre>{}</pre>",
            format_html_join("\n", "{}: {}", ((name, value) for name, value in headers)),
        )

    @admin.display(description=_("response body"))
    def stored_body(self, record: IdempotencyKey) -> str:
        kind, text = body_for_display(record, BODY_DISPLAY_LIMIT)
        if kind in ("json", "text"):
            return format_html("<pre>{}</pre>", text)
        return text or "-"

    @admin.action(
        description=_("Release selected stale locks (retries run again)"), permissions=["change"]
    )
    def release_stale(self, request: HttpRequest, queryset: QuerySet[IdempotencyKey]) -> None:
        self._resolve(request, queryset, maintenance.release, _("Released"))

    @admin.action(description=_("Mark selected stale records as failed"), permissions=["change"])
    def mark_failed(self, request: HttpRequest, queryset: QuerySet[IdempotencyKey]) -> None:
        self._resolve(request, queryset, maintenance.mark_failed, _("Marked as failed"))

    def _resolve(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyKey], act: Any, done: Any
    ) -> None:
        alias = queryset.db
        now = timezone.now()
        selected = queryset.count()
        stale = queryset.filter(maintenance.stale(now))
        count = sum(act(alias, record) for record in list(stale))
        level = messages.SUCCESS if count else messages.WARNING
        self.message_user(
            request,
            f"{done} {count} of {selected} selected records; "
            f"{selected - count} were not stale and were left alone.",
            level,
        )

    @admin.action(description=_("Delete selected expired records"), permissions=["delete"])
    def delete_expired(self, request: HttpRequest, queryset: QuerySet[IdempotencyKey]) -> None:
        alias = queryset.db
        now = timezone.now()
        pks = list(queryset.filter(maintenance.deletable(now)).values_list("pk", flat=True))
        selected = queryset.count()
        deleted = 0
        for start in range(0, len(pks), DELETE_BATCH_SIZE):
            chunk = pks[start : start + DELETE_BATCH_SIZE]
            batch = maintenance.delete_expired_batch(
                alias, now=now, batch_size=len(chunk), pks=chunk
            )
            deleted += batch.deleted
        level = messages.SUCCESS if deleted else messages.WARNING
        self.message_user(
            request,
            f"Deleted {deleted} of {selected} selected records; the others were not expired "
            "(or their lock is still live) and were kept.",
            level,
        )


def body_for_display(record: IdempotencyKey, limit: int) -> tuple[str, str]:
    """The stored body for humans as ``(kind, text)``: JSON pretty-printed, binary described."""
    body = record.response_body
    if body is None:
        if record.response_status is None:
            return "none", ""
        return "not stored", "Not stored: the body was larger than MAX_BODY_SIZE."
    data = bytes(body)
    if not data:
        return "empty", "(empty)"
    try:
        text = data.decode("utf-8")
        if _CONTROL.search(text):
            raise UnicodeDecodeError("utf-8", data, 0, 1, "control characters")
    except UnicodeDecodeError:
        return "binary", f"{len(data):,} bytes of binary data ({_content_type(record)})."
    kind = "text"
    try:
        text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
        kind = "json"
    except ValueError:
        pass
    if len(text) > limit:
        text = text[:limit] + f"\n… truncated ({len(data):,} bytes in all)"
    return kind, text


def _content_type(record: IdempotencyKey) -> str:
    for name, value in record.response_headers or []:
        if str(name).lower() == "content-type":
            return str(value)
    return "no content type"
