from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    name = "controlplane.observability"
    label = "observability"
    verbose_name = "Observability"
