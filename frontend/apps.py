from django.apps import AppConfig


class FrontendConfig(AppConfig):
    """The team dashboard: server-rendered shell pages, one JSON data endpoint per page, plotly.js
    (served from our own static files) draws the series."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "frontend"
    verbose_name = "Dashboard"
