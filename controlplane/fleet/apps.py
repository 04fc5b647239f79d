from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "controlplane.fleet"
    label = "fleet"
    default_auto_field = "django.db.models.BigAutoField"
