"""Fixtures shared by the control-plane tests."""

from __future__ import annotations

import json

import pytest

from controlplane.webhooks import oidc, sns
from controlplane.webhooks.credentials import credentials_cache_clear


@pytest.fixture
def webhook_isolation(settings):
    """Webhook tests drain notices by hand (no hand-off) and start and end with empty credential and
    SNS certificate caches, so no test sees another's credentials."""
    settings.SPOTPIPE_NOTICE_HANDOFF = "none"
    credentials_cache_clear()
    sns.cert_cache_clear()
    oidc.jwks_cache_clear()
    yield
    credentials_cache_clear()
    sns.cert_cache_clear()
    oidc.jwks_cache_clear()


@pytest.fixture
def warning(shared_data):
    """AWS EventBridge's spot interruption warning, as recorded in ../shared/data."""
    return json.loads((shared_data / "cloud-events" / "aws-eventbridge-spot-interruption-warning.json").read_text())
