"""spotpipe control plane: a Django project with one app per domain."""

from controlplane.celery import app as celery_app

__all__ = ["celery_app"]
