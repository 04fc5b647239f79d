"""WSGI entry point (`granian --interface wsgi controlplane.wsgi:application`). The inbound
webhooks take a shorter middleware stack (controlplane/hotpaths/webhook_dispatch.py); every other path takes
Django's usual handler. No request sees the server process's environment variables
(controlplane/hotpaths/wsgi_environ.py)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
application = get_wsgi_application()

from controlplane.hotpaths.webhook_dispatch import WebhookDispatch  # noqa: E402  (needs Django set up)
from controlplane.hotpaths.wsgi_environ import DropProcessEnviron  # noqa: E402

application = DropProcessEnviron(WebhookDispatch(application))

# Load every URL pattern (and so every view module) now, while the server starts, rather than on
# the first request, which would otherwise wait for it: a notice must be answered in milliseconds.
from django.urls import get_resolver  # noqa: E402

get_resolver().url_patterns  # noqa: B018 - the lookup is the point: it imports the URLconf

# Start-up objects out of the collector's full passes (controlplane/common/heap.py).
from controlplane.common.heap import freeze_startup_heap  # noqa: E402

freeze_startup_heap()
