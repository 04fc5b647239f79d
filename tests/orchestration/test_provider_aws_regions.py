"""The aws provider over two regions of one moto server (us-east-1 and us-west-2; moto's server takes
the region from each request's signature): launches go to the request's region, and describe and
terminate find each id in its own region, also through a provider that never saw them."""

from __future__ import annotations

import dataclasses

import pytest

from controlplane.market.zones import region_of_zone
from controlplane.orchestration.providers import aws
from controlplane.orchestration.providers.aws import AwsConfig, AwsProvider
from controlplane.orchestration.providers.base import TAG_JOB, AgentBootstrap, LaunchRequest, Pool, ProviderError

EAST, WEST = "us-east-1", "us-west-2"
IMAGE_EAST, IMAGE_WEST = "ami-0a1b2c3d4e5f60718", "ami-0f1e2d3c4b5a69788"


def _request(token: str, zones: tuple[str, ...], *, region: str = "", count: int = 2) -> LaunchRequest:
    return LaunchRequest(
        client_token=token, count=count, region=region,
        pools=tuple(Pool(instance_type="g5.xlarge", zone=z) for z in zones),
        bootstrap=AgentBootstrap(control_plane_url="https://cp.example.com", enroll_key="12.secret-key"),
        tags={TAG_JOB: "21"},
    )


def _group(client) -> str:
    groups = client.describe_security_groups(Filters=[{"Name": "group-name", "Values": ["spotpipe-nodes"]}])
    if groups["SecurityGroups"]:
        return groups["SecurityGroups"][0]["GroupId"]
    return client.create_security_group(GroupName="spotpipe-nodes", Description="nodes")["GroupId"]


def _subnets(*clients) -> dict[str, str]:
    # By subnet: moto places a fleet's instance by its SubnetId override (it ignores AvailabilityZone).
    return {s["AvailabilityZone"]: s["SubnetId"] for c in clients for s in c.describe_subnets()["Subnets"]
            if s.get("DefaultForAz")}


def _provider(ec2_regions, **overrides) -> AwsProvider:
    east, west = ec2_regions(EAST), ec2_regions(WEST)
    config = AwsConfig(regions=(EAST, WEST), image_id=IMAGE_EAST, image_by_region={WEST: IMAGE_WEST},
                       security_group_ids=(_group(east),), security_groups_by_region={WEST: (_group(west),)},
                       subnet_by_zone=_subnets(east, west))
    return AwsProvider(dataclasses.replace(config, **overrides), client_factory=ec2_regions)


@pytest.fixture
def fresh_memory(monkeypatch):
    """A process that has seen no instance yet (another worker, a restart)."""
    monkeypatch.setattr(aws, "REGION_MEMORY", aws._RegionMemory())


def test_launches_go_to_their_region(ec2_regions):
    provider = _provider(ec2_regions)
    east, west = ec2_regions(EAST), ec2_regions(WEST)

    west_nodes = provider.launch(_request("job21-west", ("us-west-2a", "us-west-2b"), region=WEST))
    east_nodes = provider.launch(_request("job21-east", ("us-east-1b",)))  # no region: the default

    assert {(n.region, n.zone[:-1]) for n in west_nodes} == {(WEST, WEST)}
    assert {(n.region, n.zone) for n in east_nodes} == {(EAST, "us-east-1b")}
    (west_fleet,) = west.request_log.by_action("CreateFleet")
    (east_fleet,) = east.request_log.by_action("CreateFleet")
    assert west_fleet["ClientToken"] == "job21-west" and east_fleet["ClientToken"] == "job21-east"
    # Each region's launch template carries that region's image and security group.
    (west_template,) = west.request_log.by_action("CreateLaunchTemplate")
    (east_template,) = east.request_log.by_action("CreateLaunchTemplate")
    assert west_template["LaunchTemplateData.ImageId"] == IMAGE_WEST
    assert east_template["LaunchTemplateData.ImageId"] == IMAGE_EAST
    assert west_template["LaunchTemplateData.SecurityGroupId.1"] == _group(west)
    assert east_template["LaunchTemplateData.SecurityGroupId.1"] == _group(east)
    assert provider.regions == (EAST, WEST)


def test_the_pools_zones_name_the_region_when_the_request_does_not(ec2_regions):
    provider = _provider(ec2_regions, launch_mode="run_instances")

    (node,) = provider.launch(_request("job22-acq1", ("us-west-2c",), count=1))

    assert (node.region, node.zone) == (WEST, "us-west-2c")
    assert ec2_regions(EAST).request_log.by_action("RunInstances") == []
    (run,) = ec2_regions(WEST).request_log.by_action("RunInstances")
    assert run["ImageId"] == IMAGE_WEST


def test_describe_and_terminate_find_each_id_in_its_region(ec2_regions, fresh_memory):
    launcher = _provider(ec2_regions)
    west_ids = [n.provider_instance_id for n in launcher.launch(_request("job23-west", ("us-west-2a",), region=WEST))]
    east_ids = [n.provider_instance_id for n in launcher.launch(_request("job23-east", ("us-east-1a",)))]
    unknown = "i-0123456789abcdef0"

    # A provider of a process that never saw these ids (the memory forgotten, as after a restart).
    aws.REGION_MEMORY = aws._RegionMemory()
    provider = _provider(ec2_regions)
    described = provider.describe([west_ids[0], east_ids[0], unknown, west_ids[1], east_ids[1]])

    assert [(d.provider_instance_id, d.region, d.state) for d in described] == [
        (west_ids[0], WEST, "running"), (east_ids[0], EAST, "running"), (unknown, "", "missing"),
        (west_ids[1], WEST, "running"), (east_ids[1], EAST, "running")]

    east, west = ec2_regions(EAST), ec2_regions(WEST)
    east.request_log.requests.clear()
    west.request_log.requests.clear()
    aws.REGION_MEMORY = aws._RegionMemory()
    provider = _provider(ec2_regions)
    provider.terminate([west_ids[0], east_ids[0], unknown])

    # Each region is asked to terminate only its own ids; the id no region knows is skipped.
    assert [c["InstanceId.1"] for c in west.request_log.by_action("TerminateInstances")] == [west_ids[0]]
    assert [c["InstanceId.1"] for c in east.request_log.by_action("TerminateInstances")] == [east_ids[0]]
    assert all("InstanceId.2" not in c for c in [*west.request_log.by_action("TerminateInstances"),
                                                 *east.request_log.by_action("TerminateInstances")])
    states = {d.provider_instance_id: d.state for d in provider.describe([*west_ids, *east_ids])}
    assert states[west_ids[0]] in ("stopping", "terminated") and states[east_ids[0]] in ("stopping", "terminated")
    assert states[west_ids[1]] == states[east_ids[1]] == "running"


def test_a_known_id_is_asked_only_in_its_region(ec2_regions):
    provider = _provider(ec2_regions)
    (node,) = provider.launch(_request("job24-acq1", ("us-west-2b",), region=WEST, count=1))
    describer, terminator = _provider(ec2_regions), _provider(ec2_regions)  # later calls, new providers
    east = ec2_regions(EAST)
    east.request_log.requests.clear()

    (described,) = describer.describe([node.provider_instance_id])
    terminator.terminate([node.provider_instance_id])

    assert (described.region, described.state) == (WEST, "running")
    assert east.request_log.requests == []


def test_a_region_not_configured_and_pools_of_two_regions_are_refused(ec2_regions):
    provider = _provider(ec2_regions)

    with pytest.raises(ProviderError, match="not one of the configured regions"):
        provider.launch(_request("job25-acq1", ("eu-west-1a",)))
    with pytest.raises(ProviderError, match="not in the launch's region"):
        provider.launch(_request("job25-acq2", ("us-east-1a", "us-west-2a")))
    with pytest.raises(ProviderError, match="not in the launch's region"):
        provider.launch(_request("job25-acq3", ("us-east-1a",), region=WEST))
    assert ec2_regions(EAST).request_log.by_action("CreateFleet") == []
    assert ec2_regions(WEST).request_log.by_action("CreateFleet") == []


def test_another_region_needs_its_own_image_and_groups(ec2_regions):
    no_image = _provider(ec2_regions, image_by_region=None)
    with pytest.raises(ProviderError, match="no image for region 'us-west-2'"):
        no_image.launch(_request("job26-acq1", ("us-west-2a",)))
    no_groups = _provider(ec2_regions, security_groups_by_region=None)
    with pytest.raises(ProviderError, match="no security group for region 'us-west-2'"):
        no_groups.launch(_request("job26-acq2", ("us-west-2a",)))
    # An SSM parameter resolves in every region, so one serves them all.
    ssm = "resolve:ssm:/spotpipe/node-image"
    assert _provider(ec2_regions, image_id=ssm, image_by_region=None).image_for(WEST) == ssm


def test_old_callers_that_set_only_region_get_one_region():
    config = AwsConfig(region="eu-central-1")
    assert (config.regions, config.region) == (("eu-central-1",), "eu-central-1")
    config = AwsConfig(regions=(WEST, EAST, WEST))
    assert (config.regions, config.region) == ((WEST, EAST), WEST)


def test_get_provider_reads_the_regions_and_per_region_ids(monkeypatch):
    from controlplane.orchestration.providers import get_provider

    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.delenv("SPOTPIPE_AWS_REGIONS", raising=False)
    assert get_provider("aws").regions == ("eu-west-1",)

    monkeypatch.setenv("SPOTPIPE_AWS_REGIONS", f"{WEST}, {EAST}")
    monkeypatch.setenv("SPOTPIPE_AWS_IMAGE_ID", f"{IMAGE_WEST},{EAST}={IMAGE_EAST}")
    monkeypatch.setenv("SPOTPIPE_AWS_SECURITY_GROUPS", f"sg-west,{EAST}=sg-east1,{EAST}=sg-east2")
    provider = get_provider("aws")

    assert provider.regions == (WEST, EAST)
    assert (provider.image_for(WEST), provider.image_for(EAST)) == (IMAGE_WEST, IMAGE_EAST)
    assert provider.security_groups_for(WEST) == ("sg-west",)
    assert provider.security_groups_for(EAST) == ("sg-east1", "sg-east2")


@pytest.mark.parametrize(("zone", "region"), [
    ("us-east-1a", "us-east-1"), ("us-gov-west-1b", "us-gov-west-1"), ("use1-az4", "us-east-1"),
    ("zzz9-az1", ""), ("us-west-2-lax-1a", ""), ("", ""),
])
def test_region_of_zone(zone, region):
    assert region_of_zone(zone) == region
