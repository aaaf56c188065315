from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from rest_framework.routers import SimpleRouter

from tests.testapp import ninja_api, policy_views, shop, shop_ninja, views

router = SimpleRouter()
router.register("executions", views.ExecutionViewSet)
router.register("shop/orders", shop.OrderViewSet)
router.register("volatile-notes", policy_views.VolatileViewSet, basename="volatile-note")

urlpatterns = [
    path("admin/", admin.site.urls),
    path("create/", views.create),
    path("required/", views.required),
    path("status/<int:code>/", views.status),
    path("explode/", views.explode),
    path("binary/", views.binary),
    path("streaming/", views.streaming),
    path("large/", views.large),
    path("short-lock/", views.short_lock),
    path("wait/", views.wait),
    path("atomic/", views.atomic),
    path("atomic-lock-timeout/", views.atomic_lock_timeout),
    path("wait-short/", views.wait_short),
    path("atomic-short-wait/", views.atomic_short_wait),
    path("atomic-status/<int:code>/", views.atomic_status),
    path("recovery/", views.recovery),
    path("async/", views.async_create),
    path("async-explode/", views.async_explode),
    path("class/", views.ClassView.as_view()),
    path("drf/", views.DrfView.as_view()),
    path("drf-atomic/", views.DrfAtomicView.as_view()),
    path("decorated-apiview/", views.DecoratedApiView.as_view()),
    path("misdecorated-apiview/", views.MisdecoratedApiView.as_view()),
    path("api-view-inner/", views.api_view_inner),
    path("api/", include(router.urls)),
    path("ninja/", ninja_api.api.urls),
    path("shop/checkout/", shop.checkout),
    path("shop/ninja/", shop_ninja.api.urls),
    path("policy/uuid/", policy_views.uuid_keys),
    path("policy/order/", policy_views.order_keys),
    path("policy/volatile/", policy_views.volatile),
    path("policy/async-volatile/", policy_views.async_volatile),
    path("policy/scope-raises/", policy_views.scope_raises),
    path("policy/async-scope-raises/", policy_views.async_scope_raises),
    path("policy/class-scope-raises/", policy_views.ClassScopeRaises.as_view()),
    path("policy/fingerprint-not-a-str/", policy_views.fingerprint_not_a_str),
    path("policy/class-volatile/", policy_views.ClassVolatile.as_view()),
    path("policy/drf-volatile/", policy_views.DrfVolatile.as_view()),
]
