"""Development settings: the project's settings in development mode, asked for explicitly.

The test suite uses this module (pyproject's DJANGO_SETTINGS_MODULE), and so may a developer
(`DJANGO_SETTINGS_MODULE=controlplane.settings_dev manage.py runserver`). It sets SPOTPIPE_DEV=1 in
the environment, so every process started from here (servers, workers, the demo) inherits the mode.
Never use it on a server: DEBUG is on and SECRET_KEY is a published one.
"""

import os

os.environ.setdefault("SPOTPIPE_DEV", "1")

from controlplane.settings import *  # noqa: F403
