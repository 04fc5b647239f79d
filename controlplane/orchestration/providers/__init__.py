"""Sources of spot capacity. `get_provider(kind)` builds the configured provider of a kind."""

from __future__ import annotations

from pathlib import Path

from controlplane.orchestration.providers.base import (
    AgentBootstrap,
    InsufficientCapacity,
    LaunchRequest,
    NodeInfo,
    Pool,
    Provider,
    ProviderError,
)
from controlplane.tunables import tunable

__all__ = [
    "AgentBootstrap", "InsufficientCapacity", "LaunchRequest", "NodeInfo", "Pool", "Provider", "ProviderError",
    "get_provider", "set_provider",
]

_OVERRIDES: dict[str, Provider] = {}


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

        script = tunable("SPOTPIPE_LOCAL_CAPACITY")
        return LocalProvider(Path(tunable("SPOTPIPE_LOCAL_NODES_DIR")),
                             capacity_script=Path(script) if script else None)
    if kind == "aws":
        from controlplane.orchestration.providers.aws import AwsConfig, AwsProvider

        subnets = dict(pair.split("=", 1) for pair in tunable("SPOTPIPE_AWS_SUBNETS") if "=" in pair)
        # AMIs and security groups are regional: `region=id` entries serve the other regions, a
        # bare id the default one (neither an AMI id nor a group id holds "=").
        image, images = "", {}
        for entry in (e.strip() for e in tunable("SPOTPIPE_AWS_IMAGE_ID").split(",") if e.strip()):
            if "=" in entry:
                region, value = entry.split("=", 1)
                images[region.strip()] = value.strip()
            else:
                image = entry
        groups: list[str] = []
        groups_by_region: dict[str, tuple[str, ...]] = {}
        for entry in tunable("SPOTPIPE_AWS_SECURITY_GROUPS"):
            if "=" in entry:
                region, value = entry.split("=", 1)
                groups_by_region[region.strip()] = (*groups_by_region.get(region.strip(), ()), value.strip())
            else:
                groups.append(entry)
        config = AwsConfig(
            regions=tuple(tunable("SPOTPIPE_AWS_REGIONS")),
            region=tunable("SPOTPIPE_AWS_REGION"),
            endpoint_url=tunable("SPOTPIPE_AWS_ENDPOINT_URL") or None,
            image_id=image,
            image_by_region=images or None,
            key_name=tunable("SPOTPIPE_AWS_KEY_NAME"),
            security_group_ids=tuple(groups),
            security_groups_by_region=groups_by_region or None,
            subnet_by_zone=subnets or None,
            iam_instance_profile=tunable("SPOTPIPE_AWS_INSTANCE_PROFILE"),
            launch_mode=tunable("SPOTPIPE_AWS_LAUNCH_MODE"),
        )
        return AwsProvider(config)
    raise ProviderError(f"unknown provider {kind!r}; expected 'local' or 'aws'")
