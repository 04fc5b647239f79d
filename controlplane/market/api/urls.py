"""API routes of this app, mounted under /api/v1/."""

from django.urls import path

from controlplane.market.api import views

urlpatterns = [
    path("instance-types/", views.InstanceTypeList.as_view(), name="instance-type-list"),
    path("zones/", views.ZoneList.as_view(), name="zone-list"),
    path("spot-prices/", views.SpotPriceHistory.as_view(), name="spot-price-history"),
    path("spot-prices/cheapest/", views.CheapestPools.as_view(), name="spot-price-cheapest"),
    path("spot-prices/upload/", views.SpotPriceUpload.as_view(), name="spot-price-upload"),
]
