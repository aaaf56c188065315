from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from example_project.payments import exports, ninja_api, views

router = DefaultRouter()
router.register("charges", views.ChargeViewSet, basename="charge")

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="swagger-ui", permanent=False)),
    path("api/", include(router.urls)),
    path("api/charges/<int:charge_id>/refunds/", views.RefundView.as_view(), name="refund"),
    path("api/exports/", exports.ExportView.as_view(), name="export"),
    path("api/idempotency/", include("django_idempotency.urls")),
    path("payouts/", views.create_payout, name="payout"),
    path("charges/<int:charge_id>/receipt/", views.send_receipt, name="receipt"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    path("ninja/", ninja_api.api.urls),
    path("admin/", admin.site.urls),
]
