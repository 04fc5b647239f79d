"""Sources of spot capacity. `get_provider(kind)` builds the configured provider of a kind."""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings

from controlplane.orchestration.providers.base import (
    AgentBootstrap,
    InsufficientCapacity,
    LaunchRequest,
    NodeInfo,
    Pool,
    Provider,
    ProviderError,
)

__all__ = [
    "AgentBootstrap", "InsufficientCapacity", "LaunchRequest", "NodeInfo", "Pool", "Provider", "ProviderError",
    "get_provider", "set_provider",
]

_OVERRIDES: dict[str, Provider] = {}


def _setting(name: str, default: str = "") -> str:
    """A setting from Django settings, else the environment (the settings module is not ours)."""
    return str(getattr(settings, name, None) or os.environ.get(name, default))


def set_provider(kind: str, provider: Provider | None) -> None:
    """Replace the provider of `kind` in this process (tests and the demo), or restore the default."""
    if provider is None:
        _OVERRIDES.pop(kind, None)
    else:
        _OVERRIDES[kind] = provider


def get_provider(kind: str) -> Provider:
    """The provider for `kind` ("local" or "aws"), configured from settings/environment."""
    if kind in _OVERRIDES:
        return _OVERRIDES[kind]
    if kind == "local":
        from controlplane.orchestration.providers.local.provider import LocalProvider

        root = _setting("SPOTPIPE_LOCAL_NODES_DIR") or str(Path(settings.VAR_DIR) / "nodes")
        return LocalProvider(Path(root))
    if kind == "aws":
        from controlplane.orchestration.providers.aws import AwsConfig, AwsProvider

        subnets = dict(
            pair.split("=", 1) for pair in _setting("SPOTPIPE_AWS_SUBNETS").split(",") if "=" in pair
        )
        config = AwsConfig(
            region=getattr(settings, "SPOTPIPE_AWS_REGION", "us-east-1"),
            endpoint_url=getattr(settings, "SPOTPIPE_AWS_ENDPOINT_URL", None),
            image_id=_setting("SPOTPIPE_AWS_IMAGE_ID"),
            key_name=_setting("SPOTPIPE_AWS_KEY_NAME"),
            security_group_ids=tuple(s for s in _setting("SPOTPIPE_AWS_SECURITY_GROUPS").split(",") if s),
            subnet_by_zone=subnets or None,
            iam_instance_profile=_setting("SPOTPIPE_AWS_INSTANCE_PROFILE"),
            launch_mode=_setting("SPOTPIPE_AWS_LAUNCH_MODE", "fleet"),
        )
        return AwsProvider(config)
    raise ProviderError(f"unknown provider {kind!r}; expected 'local' or 'aws'")
