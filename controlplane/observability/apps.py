from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    name = "controlplane.observability"
    label = "observability"
    verbose_name = "Observability"

    def ready(self) -> None:
        # Celery tasks log with the ids they were given (job_id=..., instance_id=...).
        from controlplane.observability.logs import connect_celery_signals

        connect_celery_signals()
