from django.apps import AppConfig


class OrchestrationConfig(AppConfig):
    name = "controlplane.orchestration"
    label = "orchestration"
    default_auto_field = "django.db.models.BigAutoField"
