"""The outbox's tunables: Django settings first, then the environment, then the default."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from django.conf import settings


def setting(name: str, default: Any) -> Any:
    """A tunable read from Django settings, then the environment, then `default`."""
    value = getattr(settings, name, None)
    if value is None:
        value = os.environ.get(name, default)
    return type(default)(value) if not isinstance(default, bool) else str(value).lower() in {"1", "true", "yes"}


# How stored notices reach workers: "batched" (coalesced kicks, the default), "per_request" (one
# Celery publish per stored notice: the slow baseline the bench compares with), "none" (only the
# periodic sweep; for tests that drive the drain by hand).
HANDOFF_SETTING = "SPOTPIPE_NOTICE_HANDOFF"
KICK_WINDOW_SETTING = "SPOTPIPE_NOTICE_KICK_WINDOW_S"
# Least time between the starts of two drains (see `drain_pace`); 0 turns pacing off.
DRAIN_SPACING_SETTING = "SPOTPIPE_NOTICE_DRAIN_SPACING_S"
PREPARED_INSERT_SETTING = "SPOTPIPE_NOTICE_INSERT_PREPARED"
CLAIM_STALE_AFTER = timedelta(seconds=30)
MAX_ATTEMPTS = 5
