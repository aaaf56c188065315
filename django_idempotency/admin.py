"""A read-only admin for support and operators: look a key up, read its stored response, and
release stale locks, mark them failed or delete expired records (the same statements as the
commands, from :mod:`django_idempotency._ops.maintenance`)."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import label_for_field
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.db import NotSupportedError
from django.db.models import Q, QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.templatetags.static import static
from django.urls import path, reverse
from django.utils import dateformat, timezone
from django.utils.html import format_html, format_html_join
from django.utils.text import capfirst
from django.utils.translation import gettext_lazy as _

from django_idempotency import _store as store
from django_idempotency._base import rules
from django_idempotency._base.errors import InvalidKey, StoreUnavailable
from django_idempotency._base.keys import hash_key, parse_key
from django_idempotency._call import operations as operation_ids
from django_idempotency._conf.settings import conf
from django_idempotency._function.calls import METHOD as CALL
from django_idempotency._ops import browsing, maintenance, relay, store_checks
from django_idempotency._store import operations as operation_store
from django_idempotency._store import sealing
from django_idempotency.models import IdempotencyKey, OutboxMessage, RedisIdempotencyKey

__all__ = ["IdempotencyKeyAdmin", "RedisIdempotencyKeyAdmin"]

if TYPE_CHECKING:
    from django.utils.functional import _StrOrPromise as StrOrPromise

    _ModelAdmin = admin.ModelAdmin[IdempotencyKey]
    _MessageAdmin = admin.ModelAdmin[OutboxMessage]
    _EntryAdmin = admin.ModelAdmin[RedisIdempotencyKey]
    _Inline = admin.TabularInline[OutboxMessage, IdempotencyKey]
else:  # ModelAdmin is generic in django-stubs only
    _ModelAdmin = _MessageAdmin = _EntryAdmin = admin.ModelAdmin
    _Inline = admin.TabularInline

#: Who sees a decrypted response when ``ENCRYPTION_KEYS`` is set.
VIEW_STORED_RESPONSE = "django_idempotency.view_stored_response"
#: Characters of a stored body shown on the change page; the rest is cut off.
BODY_DISPLAY_LIMIT = 10_000
#: Characters of the key hash shown in the list (the search takes 8 or more).
KEY_DISPLAY_LENGTH = 8
#: Characters of a path shown in the list (the whole path is its tooltip and on the record).
PATH_DISPLAY_LIMIT = 24
#: Records the "delete expired" action deletes per short transaction.
DELETE_BATCH_SIZE = 1000
#: A Redis store's list (:meth:`IdempotencyKeyAdmin.redis_changelist_view`).
REDIS_TEMPLATE = "admin/django_idempotency/idempotencykey/redis.html"
REDIS_RECORD_TEMPLATE = "admin/django_idempotency/idempotencykey/redis_record.html"
#: An action's confirmation, the table's and a Redis store's (:func:`_confirmation`).
CONFIRM_TEMPLATE = "admin/django_idempotency/idempotencykey/action_confirm.html"
#: Records an action's confirmation lists by name; it counts the others.
CONFIRM_ROWS = 100
REDIS_STORES_TEMPLATE = "admin/django_idempotency/redisidempotencykey/stores.html"
REDIS_OUTBOX_TEMPLATE = "admin/django_idempotency/outboxmessage/redis.html"
REDIS_OUTBOX_URL = "django_idempotency_outboxmessage_redis"
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
        return rules.STALE.filter(timezone.now())


class ExpiredFilter(_YesNoFilter):
    title = _("expired")
    parameter_name = "expired"

    def condition(self) -> Q:
        return rules.EXPIRED.filter(timezone.now())


_OPERATION_STATES = {
    operation_store.RUNNING: _("running"),
    operation_store.STALLED: _("stalled"),
    operation_store.SUCCEEDED: _("succeeded"),
    operation_store.FAILED: _("failed"),
}


class OperationStateFilter(admin.SimpleListFilter):
    """The operation's state (``docs/operations.rst``): ``running`` keeps operations whose
    ``202`` waits for its task, ``stalled`` those whose request's owner died."""

    title = _("operation state")
    parameter_name = "operation"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return list(_OPERATION_STATES.items())

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyKey]
    ) -> QuerySet[IdempotencyKey]:
        value = self.value()
        if value not in _OPERATION_STATES:
            return queryset
        return queryset.filter(operation_store.state_filter(value, timezone.now()))


class MethodFilter(admin.SimpleListFilter):
    """The protected methods (the ``METHODS`` setting) and ``CALL`` (``idempotent_function``):
    no ``SELECT DISTINCT`` over the table.

    A method only a view's own ``methods`` option protects is filtered by URL (``?method=PUT``)
    and then listed too, so the page shows what it filters by.
    """

    title = _("method")
    parameter_name = "method"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        value = self.value()
        selected = {value.upper()} if value else set()
        return [(method, method) for method in sorted(conf.METHODS | {CALL} | selected)]

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyKey]
    ) -> QuerySet[IdempotencyKey]:
        value = self.value()
        return queryset.filter(method=value.upper()) if value else queryset


def _timestamp(field: str, description: StrOrPromise) -> Any:
    """To the second, in the current time zone (Django's default format stops at the minute);
    the date over the time, so three of them fit in the list."""

    @admin.display(description=description, ordering=field)
    def show(model_admin: Any, record: IdempotencyKey) -> str:
        value = getattr(record, field)
        if value is None:
            return "-"
        value = timezone.localtime(value)
        return format_html(
            '<span class="idempotency-time">{} {}</span>',
            dateformat.format(value, "Y-m-d"),
            dateformat.format(value, "H:i:s"),
        )

    return show


def _warning(text: StrOrPromise) -> str:
    """A flag that needs an operator: the admin's alert icon, never a (green) boolean tick."""
    return format_html(
        '<span class="idempotency-warning"><img src="{}" alt="" width="14" height="14"> {}</span>',
        static("admin/img/icon-alert.svg"),
        text,
    )


class OutboxMessageInline(_Inline):
    """A record's outbox messages, read-only; re-sent from their own admin."""

    model = OutboxMessage
    fk_name = "record"
    extra = 0
    can_delete = False
    show_change_link = True
    fields = ("message_id", "task", "state", "attempts", "last_error", "released_at", "sent_at")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet[OutboxMessage]:
        return super().get_queryset(request).using(conf.DATABASE_ALIAS)


@admin.register(IdempotencyKey)
class IdempotencyKeyAdmin(_ModelAdmin):
    # Seven narrow columns fit at 1400 px beside both sidebars; the stale and expired flags go
    # with the status (they stand for unlock_at and expires_at, shown on the record's page).
    list_display = ("short_key", "state", "scope", "request", "response", "created", "expires")
    list_filter = ("status", OperationStateFilter, MethodFilter, StaleFilter, ExpiredFilter)
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
    inlines = (OutboxMessageInline,)
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
        (_("Dates"), {"fields": ("created", "updated", "unlock", "expires")}),
        (_("Operation"), {"fields": ("operation", "operation_state")}),
    )
    readonly_fields = (
        *("scope", "key_hash", "method", "path", "request_hash", "status"),
        *("response_status", "stored_headers", "stored_body", "response_hidden"),
        *("attempt", "lock_token", "recovery_point", "recovery_data", "recovery_data_hidden"),
        *("stale", "expired", "created", "updated", "unlock", "expires"),
        *("operation", "operation_state"),
    )
    #: The table's health above the list: one scan of the table per page view (about 0.3 s per
    #: million rows, docs/admin.rst). A subclass sets it to ``False`` for a very large table.
    show_table_health = True
    created = _timestamp("created_at", _("created"))
    updated = _timestamp("updated_at", _("updated"))
    unlock = _timestamp("unlock_at", _("unlock at"))
    expires = _timestamp("expires_at", _("expires at"))

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """A read-only admin selects nothing to change; the table's health above the list, and
        where the records of views on a Redis store live, not an empty table."""
        if request.method == "GET":
            for note in store_checks.admin_notes():
                messages.warning(request, note)
        context = {
            "title": capfirst(self.opts.verbose_name_plural),
            "idempotency_redis": [
                (
                    each.described,
                    reverse(f"{self.admin_site.name}:{self._redis_url}", args=[each.tag]),
                )
                for each in browsing.browsed()
            ],
            # A callable the template calls once: a 403 or an action's redirect scans nothing.
            "idempotency_stats": (
                partial(maintenance.stats, conf.DATABASE_ALIAS) if self.show_table_health else None
            ),
            **(extra_context or {}),
        }
        return super().changelist_view(request, context)

    # -- a Redis store's records: a page of their own, through the store contract ---------------

    #: Records a page of a Redis store's list shows, about (a page ends with a ``SCAN`` call).
    redis_page_size = 100
    _redis_url = "django_idempotency_idempotencykey_redis"
    _redis_columns = ("short_key", "state", "scope", "request", "response", "created", "expires")

    _redis_fields = (
        *("scope", "key_hash", "method", "path", "request_hash", "status"),
        *("response_status", "stored_headers", "stored_body"),
        *("attempt", "lock_token", "recovery_point", "recovery_data"),
        *("stale", "expired", "created", "updated", "unlock", "expires", "operation_state"),
    )

    def get_urls(self) -> list[Any]:
        """The Redis stores' lists and records beside the table's, before its catch-all."""
        listed = self.admin_site.admin_view(self.redis_changelist_view)
        record = self.admin_site.admin_view(self.redis_record_view)
        action = self.admin_site.admin_view(self.redis_action_view)
        return [
            path("redis/<str:tag>/", listed, name=self._redis_url),
            path("redis/<str:tag>/record/", record, name=f"{self._redis_url}_record"),
            path("redis/<str:tag>/action/", action, name=f"{self._redis_url}_action"),
            *super().get_urls(),
        ]

    def redis_action_view(self, request: HttpRequest, tag: str) -> HttpResponse:
        """An action of :data:`REDIS_ACTIONS` on a Redis store's selected records: a ``POST``
        (the admin's views check its CSRF token) by staff who may change the table's records,
        as the table's actions; a confirmation page first, as Django's delete confirmation,
        then the action (``post=yes``) on each record read again, fenced by the store."""
        found = self._redis_store(request, tag)
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_change_permission(request):
            raise PermissionDenied
        list_url = reverse(f"{self.admin_site.name}:{self._redis_url}", args=[tag])
        name = request.POST.get("action", "")
        selected = _selected(request.POST.getlist("_selected"))
        if name not in _offered(found) or not selected:
            self.message_user(
                request,
                _("Select an action and the records to run it on: nothing was changed."),
                messages.WARNING,
            )
            return HttpResponseRedirect(list_url)
        try:
            records = [browsing.read(found.alias, scope, key_hash) for scope, key_hash in selected]
            if request.POST.get("post") != "yes":
                return self._redis_confirmation(request, found, name, records, selected)
            act, done = REDIS_ACTIONS[name]
            count = sum(act(found.alias, record) for record in records if record is not None)
        except StoreUnavailable as exc:
            messages.error(request, _unanswered(found, exc))
            return HttpResponseRedirect(list_url)
        level = messages.SUCCESS if count else messages.WARNING
        self.message_user(
            request,
            f"{done} {count} of {len(selected)} selected records; "
            f"{len(selected) - count} were not stale (or are gone) and were left alone.",
            level,
        )
        return HttpResponseRedirect(list_url)

    def _redis_confirmation(
        self,
        request: HttpRequest,
        found: browsing.Browsed,
        name: str,
        records: list[IdempotencyKey | None],
        selected: list[tuple[str, str]],
    ) -> HttpResponse:
        """The action's confirmation (:func:`_confirmation`): the selected records as they
        are now, read again from the store, and how many are gone meanwhile."""
        present = [record for record in records if record is not None]
        return _confirmation(
            self,
            request,
            name,
            Confirming(
                where=store_checks.described_alias(found.alias),
                shown=present,
                affected=sum(record.is_stale for record in present),
                gone=len(records) - len(present),
                hidden=[("_selected", f"{key_hash}:{scope}") for scope, key_hash in selected],
                list_url=reverse(f"{self.admin_site.name}:{self._redis_url}", args=[found.tag]),
            ),
        )

    def redis_record_view(self, request: HttpRequest, tag: str) -> HttpResponse:
        """A Redis store's record (``?scope=&key=<hash>``), every field read-only, its stored
        response and recovery data shown as the table's record page shows them."""
        found = self._redis_store(request, tag)
        scope, key_hash = request.GET.get("scope", ""), request.GET.get("key", "")
        try:
            record = browsing.read(found.alias, scope, key_hash)
        except StoreUnavailable as exc:
            text = _unanswered(found, exc)
            return HttpResponse(text, status=503, content_type="text/plain")
        if record is None:
            raise Http404("No such record (it may have expired).")
        fields = self._redis_fields if sees_stored_data(request) else _hidden(self._redis_fields)
        rows = [
            (label_for_field(name, self.model, self), self._field(record, name)) for name in fields
        ]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("Idempotency key %(hash)s") % {"hash": key_hash[:KEY_DISPLAY_LENGTH]},
            "store": found,
            "list_url": reverse(f"{self.admin_site.name}:{self._redis_url}", args=[tag]),
            "fields": rows,
        }
        return TemplateResponse(request, REDIS_RECORD_TEMPLATE, context)

    def _field(self, record: IdempotencyKey, name: str) -> Any:
        shown = getattr(self, name)(record) if hasattr(self, name) else getattr(record, name)
        return "-" if shown is None or shown == "" else shown

    def _redis_store(self, request: HttpRequest, tag: str) -> browsing.Browsed:
        """The store ``tag`` marks, for staff who may view the table's records."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        found = browsing.find(tag)
        if found is None:
            raise Http404(NO_SUCH_STORE)
        return found

    def redis_changelist_view(self, request: HttpRequest, tag: str) -> HttpResponse:
        """A Redis store's records, read-only, for staff who may view the table's: a page per
        ``SCAN`` cursor (never the whole keyspace at once), by status, or an exact key's."""
        found = self._redis_store(request, tag)
        status = request.GET.get("status")
        status = status if status in IdempotencyKey.Status.values else None
        term = request.GET.get("q", "").strip()
        records: list[IdempotencyKey] = []
        after = None
        try:
            if term:
                records = browsing.search(found.alias, term, status)
            else:
                cursor = request.GET.get("cursor", "0")
                records, after = browsing.page(found.alias, cursor, self.redis_page_size, status)
        except StoreUnavailable as exc:
            messages.error(request, _unanswered(found, exc))
        except NotSupportedError:  # a registered store the contract's browse refuses
            named = store.using(found.alias).describe(found.alias)
            messages.error(request, f"The {named} does not list its records (no browse()).")
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("Idempotency keys in the %(store)s") % {"store": found.described},
            "columns": [label_for_field(name, self.model, self) for name in self._redis_columns],
            "rows": [
                (f"{record.key_hash}:{record.scope}", self._redis_row(record, tag))
                for record in records
            ],
            "actions": [
                (name, getattr(type(self), name).short_description) for name in _offered(found)
            ]
            if self.has_change_permission(request)
            else [],
            "action_url": reverse(f"{self.admin_site.name}:{self._redis_url}_action", args=[tag]),
            "statuses": IdempotencyKey.Status.choices,
            "status": status or "",
            "term": term,
            "next_cursor": after,
            "first_page": not term and request.GET.get("cursor", "0") != "0",
            "outbox_url": reverse(f"{self.admin_site.name}:{REDIS_OUTBOX_URL}", args=[tag])
            if browsing.provides(found.alias, "outbox")
            else None,
        }
        return TemplateResponse(request, REDIS_TEMPLATE, context)

    def _redis_row(self, record: IdempotencyKey, tag: str) -> list[str]:
        """A record's cells, as the table's list shows them (no stored body: its page's), its
        short key hash a link to its page."""
        page = reverse(f"{self.admin_site.name}:{self._redis_url}_record", args=[tag])
        query = urlencode({"scope": record.scope, "key": record.key_hash})
        link = format_html(
            '<a href="{}?{}"><span title="{}">{}</span></a>',
            *(page, query, record.key_hash, self.short_key(record)),
        )
        cells = {"short_key": link, "scope": record.scope}
        return [cells.get(name) or self._field(record, name) for name in self._redis_columns]

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        """Without the date hierarchy where the database cannot convert to the current time
        zone (MySQL/MariaDB without time-zone tables): a list, not a 500 (system check W002)."""
        changelist = super().get_changelist_instance(request)
        database = store.served(changelist.queryset.db)
        if (
            changelist.date_hierarchy
            and database is not None
            and not database.converts_dates_to(timezone.get_current_timezone_name())
        ):
            changelist.date_hierarchy = None
        return changelist

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
        return record.key_hash[:KEY_DISPLAY_LENGTH]

    @admin.display(description=_("status"), ordering="status")
    def state(self, record: IdempotencyKey) -> str:
        flags = [(flag,) for flag in (self.stale(record), self.expired(record)) if flag != "no"]
        if not flags:
            return record.get_status_display()
        return format_html(
            "{}<br>{}", record.get_status_display(), format_html_join(" ", "{}", flags)
        )

    @admin.display(description=_("response"), ordering="response_status")
    def response(self, record: IdempotencyKey) -> str:
        """The stored response's status; a function's stored result has none."""
        if record.response_status is None and record.status == record.Status.COMPLETED:
            return str(_("result"))
        return str(record.response_status or "-")

    @admin.display(description=_("request"), ordering="path")
    def request(self, record: IdempotencyKey) -> str:
        path = record.path
        if len(path) > PATH_DISPLAY_LIMIT:
            path = path[: PATH_DISPLAY_LIMIT - 1] + "…"
        return format_html(
            '{} <span class="idempotency-path" title="{}">{}</span>',
            record.method,
            record.path,
            path,
        )

    @admin.display(description=_("stale"))
    def stale(self, record: IdempotencyKey) -> str:
        return _warning(_("stale")) if record.is_stale else str(_("no"))

    @admin.display(description=_("expired"))
    def expired(self, record: IdempotencyKey) -> str:
        return format_html("<em>{}</em>", _("expired")) if record.is_expired else str(_("no"))

    @admin.display(description=_("operation id"))
    def operation(self, record: IdempotencyKey) -> str:
        """The record's operation, as its status endpoint names it."""
        return operation_ids.make_id(record.pk, record.scope, record.key_hash, record.created_at)

    @admin.display(description=_("operation state"))
    def operation_state(self, record: IdempotencyKey) -> str:
        """Running while the request runs or its stored response is a ``202``, stalled when
        its owner is gone (the final response, once stored, is the stored response above)."""
        return str(_OPERATION_STATES[operation_store.state_of(record, timezone.now())])

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """With ``ENCRYPTION_KEYS``, the decrypted response and the recovery point's data only
        for staff with the ``view_stored_response`` permission (superusers have it): either
        may hold cardholder data."""
        fieldsets = super().get_fieldsets(request, obj)
        if sees_stored_data(request):
            return fieldsets
        return [
            (name, {**options, "fields": _hidden(options["fields"])}) for name, options in fieldsets
        ]

    @admin.display(description=_("stored response"))
    def response_hidden(self, record: IdempotencyKey) -> str:
        # Say what is at rest: a record stored before the keys were set is in the clear, and
        # calling it encrypted misled its readers.
        if record.response_body is None and not record.response_headers:
            return "-"
        if sealing.encrypted(record.response_headers):
            return str(
                _("Encrypted; shown to staff with the “Can view stored responses” permission.")
            )
        return str(
            _(
                "Stored in the clear (before ENCRYPTION_KEYS were set), not encrypted; shown to "
                "staff with the “Can view stored responses” permission."
            )
        )

    @admin.display(description=_("recovery data"))
    def recovery_data_hidden(self, record: IdempotencyKey) -> str:
        return "-" if record.recovery_data is None else str(HIDDEN)

    @admin.display(description=_("response headers"))
    def stored_headers(self, record: IdempotencyKey) -> str:
        try:
            headers = _unsealed(record)[0]
        except sealing.Unreadable as exc:
            return _warning(str(exc))
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
        if kind == "unreadable":
            return _warning(text)
        return text or "-"

    @admin.action(
        description=_("Release selected stale locks (retries run again)"), permissions=["change"]
    )
    def release_stale(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyKey]
    ) -> HttpResponse | None:
        act = partial(self._resolve, request, queryset, maintenance.release, _("Released"))
        return self._confirmed(request, queryset, "release_stale", rules.STALE, act)

    @admin.action(description=_("Mark selected stale records as failed"), permissions=["change"])
    def mark_failed(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyKey]
    ) -> HttpResponse | None:
        act = partial(
            self._resolve, request, queryset, maintenance.mark_failed, _("Marked as failed")
        )
        return self._confirmed(request, queryset, "mark_failed", rules.STALE, act)

    def _confirmed(
        self,
        request: HttpRequest,
        queryset: QuerySet[IdempotencyKey],
        name: str,
        rule: Any,
        act: Callable[[], None],
    ) -> HttpResponse | None:
        """The action's confirmation page (:func:`_confirmation`) until it is posted again
        with ``post=yes``, as Django's delete confirmation; then ``act`` (``None``). The form
        carries the list's selection as it came (its records, or ``select_across`` the
        list's filter, kept in the page's URL), so the action runs on what was confirmed."""
        if request.POST.get("post") == "yes":
            act()
            return None
        hidden = [(ACTION_CHECKBOX_NAME, pk) for pk in request.POST.getlist(ACTION_CHECKBOX_NAME)]
        if request.POST.get("select_across") == "1":
            hidden.append(("select_across", "1"))
        total = queryset.count()
        return _confirmation(
            self,
            request,
            name,
            Confirming(
                where=store_checks.described_alias(queryset.db),
                shown=list(queryset[:CONFIRM_ROWS]),
                affected=queryset.filter(rule.filter(timezone.now())).count(),
                more=max(total - CONFIRM_ROWS, 0),
                hidden=hidden,
                list_url=request.get_full_path(),
            ),
        )

    def _resolve(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyKey], act: Any, done: Any
    ) -> None:
        alias = queryset.db
        now = timezone.now()
        selected = queryset.count()
        stale = queryset.filter(rules.STALE.filter(now))
        count = sum(act(alias, record) for record in list(stale))
        level = messages.SUCCESS if count else messages.WARNING
        self.message_user(
            request,
            f"{done} {count} of {selected} selected records; "
            f"{selected - count} were not stale and were left alone.",
            level,
        )

    @admin.action(description=_("Delete selected expired records"), permissions=["delete"])
    def delete_expired(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyKey]
    ) -> HttpResponse | None:
        act = partial(self._delete_expired, request, queryset)
        return self._confirmed(request, queryset, "delete_expired", rules.DELETABLE, act)

    def _delete_expired(self, request: HttpRequest, queryset: QuerySet[IdempotencyKey]) -> None:
        expired = store.using(queryset.db)
        now = timezone.now()
        pks = list(queryset.filter(rules.DELETABLE.filter(now)).values_list("pk", flat=True))
        selected = queryset.count()
        deleted = 0
        for start in range(0, len(pks), DELETE_BATCH_SIZE):
            chunk = pks[start : start + DELETE_BATCH_SIZE]
            batch = expired.delete_expired_batch(now=now, batch_size=len(chunk), pks=chunk)
            deleted += batch.deleted
        level = messages.SUCCESS if deleted else messages.WARNING
        self.message_user(
            request,
            f"Deleted {deleted} of {selected} selected records; the others were not expired "
            "(or their lock is still live) and were kept.",
            level,
        )


class Confirming(NamedTuple):
    """What an action's confirmation page says (:func:`_confirmation`)."""

    #: The store, as its class describes it (``database 'default'``, ``Redis store 'redis'``).
    where: str
    #: The selected records listed (as they are now).
    shown: list[IdempotencyKey]
    #: How many of the selection the action would change now.
    affected: int
    #: The hidden fields that carry the selection when the form posts the action again.
    hidden: list[tuple[str, Any]]
    #: Where "No, take me back" goes: the list, as it was.
    list_url: str
    #: Selected records gone meanwhile (a Redis store's, expired or released).
    gone: int = 0
    #: Selected records beyond those listed.
    more: int = 0


def _confirmation(
    model_admin: IdempotencyKeyAdmin, request: HttpRequest, name: str, confirming: Confirming
) -> HttpResponse:
    """An action's confirmation page, the table's and a Redis store's alike (as Django's delete
    confirmation): the selected records as they are now, how many the action would change, and
    a form (with the admin's CSRF token) that posts the action again with ``post=yes``. The
    views that post it check the change permission the action needs."""
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": _("Are you sure?"),
        "action_label": getattr(type(model_admin), name).short_description,
        "action": name,
        "rows": [
            (record.key_hash, record.scope, model_admin.state(record), model_admin.created(record))
            for record in confirming.shown
        ],
        **confirming._asdict(),
    }
    return TemplateResponse(request, CONFIRM_TEMPLATE, context)


#: The table's actions a Redis store's records are offered (:meth:`~IdempotencyKeyAdmin.
#: redis_action_view`), through the store contract (``release_stale``, ``fail_stale``): what
#: each does, and the message's verb. Not "Delete selected expired records": Redis deletes a
#: record at its expiry by itself (its TTL, held past a live lock), so none is left to delete.
REDIS_ACTIONS = {
    "release_stale": (maintenance.release, _("Released")),
    "mark_failed": (maintenance.mark_failed, _("Marked as failed")),
}


#: What a mark no store answers to says (a store no longer named, a mark made up).
NO_SUCH_STORE = "No store of the settings or views besides the database has this mark."


def _offered(found: browsing.Browsed) -> list[str]:
    """The actions of :data:`REDIS_ACTIONS` the store's class provides (the contract's
    ``release_stale``, ``fail_stale``): a store without one is not offered it."""
    return [name for name in REDIS_ACTIONS if browsing.provides(found.alias, _NEEDS[name])]


#: The contract's capability each action needs (:data:`~.._store.contract.CAPABILITIES`).
_NEEDS = {"release_stale": "release_stale", "mark_failed": "fail_stale"}


def _selected(values: list[str]) -> list[tuple[str, str]]:
    """The ``(scope, key hash)`` of each checked record (``<key hash>:<scope>``: the hash has
    a fixed length, the scope any character), in order, once each; others are dropped."""
    found = []
    for value in values:
        key_hash, colon, scope = value[:64], value[64:65], value[65:]
        if colon == ":" and _HEX.match(key_hash) and (scope, key_hash) not in found:
            found.append((scope, key_hash))
    return found


def sees_stored_data(request: HttpRequest) -> bool:
    """Whether the page may show what a view stored (its response, its recovery point's data,
    its outbox messages' arguments): always without ``ENCRYPTION_KEYS``; with them, to staff
    with the ``view_stored_response`` permission."""
    return conf.ENCRYPTION_KEYS is None or request.user.has_perm(VIEW_STORED_RESPONSE)


#: What staff without the permission read in place of a view's stored data.
HIDDEN = _("Hidden; shown to staff with the “Can view stored responses” permission.")


def _hidden(fields: Any) -> list[Any]:
    shown = ("stored_headers", "stored_body")
    hidden = {shown[0]: "response_hidden", "recovery_data": "recovery_data_hidden"}
    return [hidden.get(field, field) for field in fields if field != shown[1]]


def _unsealed(record: IdempotencyKey) -> tuple[list[list[str]], bytes | None]:
    """The record's headers and body as the view returned them (decompressed, decrypted),
    read once per record for the page's two fields."""
    cached: tuple[list[list[str]], bytes | None] | None = getattr(record, "_unsealed", None)
    if cached is None:
        cached = sealing.unseal(
            record.response_headers, record.response_body, (record.scope, record.key_hash)
        )
        record._unsealed = cached  # type: ignore[attr-defined]
    return cached


def body_for_display(record: IdempotencyKey, limit: int) -> tuple[str, str]:
    """The stored body for humans as ``(kind, text)``: JSON pretty-printed, binary described,
    and said so when no key of ``ENCRYPTION_KEYS`` decrypts it."""
    try:
        body = _unsealed(record)[1]
    except sealing.Unreadable as exc:
        return "unreadable", f"Cannot decrypt: {exc}"
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
    except (ValueError, RecursionError):  # nested past the parser's depth: shown as text
        pass
    if len(text) > limit:
        text = text[:limit] + f"\n… truncated ({len(data):,} bytes in all)"
    return kind, text


def _content_type(record: IdempotencyKey) -> str:
    for name, value in _unsealed(record)[0]:
        if str(name).lower() == "content-type":
            return str(value)
    return "no content type"


@admin.register(OutboxMessage)
class OutboxMessageAdmin(_MessageAdmin):
    """The outbox's messages: read-only, filtered by state, with a re-send action
    (pending and due now: the relay, or the next pass, sends it again)."""

    list_display = ("message_id", "task", "state", "attempts", "error", "released_at", "sent_at")
    list_filter = ("state", "engine")
    search_fields = ("message_id", "task")
    ordering = ("-released_at",)
    actions = ("resend",)
    readonly_fields = (
        *("record", "message_id", "engine", "task", "arguments", "arguments_hidden"),
        *("state", "attempts"),
        *("last_error", "released_at", "available_at", "sent_at"),
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return obj is None and super().has_change_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet[OutboxMessage]:
        return super().get_queryset(request).using(conf.DATABASE_ALIAS)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Read-only: the list is not "Select outbox message to change" (the change permission
        is only the re-send action's); the Redis stores' outboxes linked above it."""
        context = {
            "title": capfirst(self.opts.verbose_name_plural),
            "idempotency_redis": [
                (
                    each.described,
                    reverse(f"{self.admin_site.name}:{REDIS_OUTBOX_URL}", args=[each.tag]),
                )
                for each in browsing.browsed()
                if browsing.provides(each.alias, "outbox")
            ],
            **(extra_context or {}),
        }
        return super().changelist_view(request, context)

    def get_urls(self) -> list[Any]:
        """A Redis store's outbox beside the table's, before the admin's catch-all."""
        view = self.admin_site.admin_view(self.redis_outbox_view)
        return [path("redis/<str:tag>/", view, name=REDIS_OUTBOX_URL), *super().get_urls()]

    def redis_outbox_view(self, request: HttpRequest, tag: str) -> HttpResponse:
        """A Redis store's outbox, for staff who may view the table's messages: its backlog and
        its messages failed for good; a ``POST`` sends the selected ones again (the contract's
        ``resend``), for staff who may change them (the table's re-send action)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        found = browsing.find(tag)
        if found is None:
            raise Http404(NO_SUCH_STORE)
        if request.method == "POST":
            if not self.has_change_permission(request):
                raise PermissionDenied
            count = browsing.resend(found.alias, request.POST.getlist("_selected"))
            self.message_user(
                request, _("%(count)d message(s) will be sent again.") % {"count": count}
            )
            return HttpResponseRedirect(request.path)
        try:
            outbox = browsing.outbox(found.alias)
        except StoreUnavailable as exc:
            messages.error(request, _unanswered(found, exc))
            outbox = browsing.Outbox(None, None, [])
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("Outbox of the %(store)s") % {"store": found.described},
            "outbox": outbox,
            "can_resend": self.has_change_permission(request),
            "shown": browsing.FAILED_SHOWN,
        }
        return TemplateResponse(request, REDIS_OUTBOX_TEMPLATE, context)

    @admin.display(description=_("last error"))
    def error(self, message: OutboxMessage) -> str:
        """The last error's last line (an exception's own), cut at 80 characters; the whole
        text on hover and on the message's page."""
        lines = message.last_error.strip().splitlines()
        if not lines:
            return "-"
        last = lines[-1]
        shown = last if len(last) <= 80 else last[:79] + "…"
        return format_html('<span title="{}">{}</span>', message.last_error, shown)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """With ``ENCRYPTION_KEYS``, a message's arguments only for staff with the
        ``view_stored_response`` permission, as the record's response."""
        fields = super().get_fields(request, obj)
        if sees_stored_data(request):
            return [field for field in fields if field != "arguments_hidden"]
        return [field for field in fields if field != "arguments"]

    @admin.display(description=_("arguments"))
    def arguments_hidden(self, message: OutboxMessage) -> str:
        return str(HIDDEN)

    @admin.action(description=_("Re-send the selected messages"), permissions=["change"])
    def resend(self, request: HttpRequest, queryset: QuerySet[OutboxMessage]) -> None:
        count = relay.resend(conf.DATABASE_ALIAS, list(queryset.values_list("pk", flat=True)))
        self.message_user(request, _("%(count)d message(s) will be sent again.") % {"count": count})


@admin.register(RedisIdempotencyKey)
class RedisIdempotencyKeyAdmin(_EntryAdmin):
    """The admin index's entry for the records of the stores besides the database (a proxy
    model: Django's index lists models only). Shown where the settings or the views name one
    (a Redis store, another of the registry), to staff who may view the table's records (the
    proxy has no permissions of its own); its one page lists the stores, or goes straight to
    the only one's records. No record page of its own: the table's are the table's admin's."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None or not browsing.browsed():
            return False
        opts = IdempotencyKey._meta
        return any(
            request.user.has_perm(f"{opts.app_label}.{get_permission_codename(action, opts)}")
            for action in ("view", "change")
        )

    def get_model_perms(self, request: HttpRequest) -> dict[str, bool]:
        """Also names the entry for the stores it lists (:func:`.browsing.entry_label`): the
        index reads the proxy's names right after asking this, and a store that is not Redis
        must not be listed as Redis. Set here, per request, not in the model's ``Meta``: the
        names depend on the settings and the URLconf, which a migration must not."""
        meta = self.model._meta
        meta.verbose_name, meta.verbose_name_plural = browsing.entry_label()
        return super().get_model_perms(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[Any]:
        """The list alone: no add, change, delete or history page reads the table here."""
        name = f"{self.opts.app_label}_{self.opts.model_name}_changelist"
        return [path("", self.admin_site.admin_view(self.changelist_view), name=name)]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The Redis stores, each a link to its records; the only one's records at once."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        name = f"{self.admin_site.name}:{IdempotencyKeyAdmin._redis_url}"
        stores = [(each.described, reverse(name, args=[each.tag])) for each in browsing.browsed()]
        if len(stores) == 1:
            return HttpResponseRedirect(stores[0][1])
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": capfirst(browsing.entry_label()[1]),
            "stores": stores,
            **(extra_context or {}),
        }
        return TemplateResponse(request, REDIS_STORES_TEMPLATE, context)


def _unanswered(found: Any, exc: BaseException) -> str:
    """What the admin says of a Redis store that did not answer: its error's short form
    (:func:`.._conf.values.short_error`), never the password."""
    from django_idempotency._conf.values import short_error

    return f"The {found.described} did not answer: {short_error(exc, found.alias)}"
