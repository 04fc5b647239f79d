"""WSGI entry point (gunicorn controlplane.wsgi). The inbound webhooks take a shorter middleware
stack (controlplane/webhooks/wsgi.py); every other path takes Django's usual handler."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
application = get_wsgi_application()

from controlplane.webhooks.wsgi import WebhookDispatch  # noqa: E402  (needs Django set up)

application = WebhookDispatch(application)
