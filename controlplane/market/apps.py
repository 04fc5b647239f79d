from django.apps import AppConfig


class MarketConfig(AppConfig):
    name = "controlplane.market"
    label = "market"
    default_auto_field = "django.db.models.BigAutoField"
