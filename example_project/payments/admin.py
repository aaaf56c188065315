from __future__ import annotations

from django.contrib import admin

from example_project.payments.models import Charge, Payout, ProviderCall, Receipt, Refund


class RefundInline(admin.TabularInline):
    model = Refund
    extra = 0
    readonly_fields = ["amount", "status", "provider_id", "created"]


@admin.register(Charge)
class ChargeAdmin(admin.ModelAdmin):
    list_display = ["id", "amount", "currency", "provider_id", "created"]
    list_filter = ["currency"]
    inlines = [RefundInline]


@admin.register(Payout)
class PayoutAdmin(admin.ModelAdmin):
    list_display = ["id", "amount", "currency", "created"]


@admin.register(Receipt)
class ReceiptAdmin(admin.ModelAdmin):
    list_display = ["id", "charge", "email", "created"]


@admin.register(ProviderCall)
class ProviderCallAdmin(admin.ModelAdmin):
    list_display = ["reference", "operation", "amount", "currency", "idempotency_key", "created"]
