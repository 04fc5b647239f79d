"""The aws provider against moto's server: launch, describe and terminate, with the request shapes
a real account receives (checked on the wire, as EC2 Query parameters)."""

from __future__ import annotations

import base64
import dataclasses
from decimal import Decimal

import pytest
from botocore.exceptions import ClientError

from controlplane.orchestration.providers.aws import AwsConfig, AwsProvider, render_user_data
from controlplane.orchestration.providers.base import (
    TAG_JOB,
    TAG_REQUEST,
    AgentBootstrap,
    InsufficientCapacity,
    LaunchRequest,
    Pool,
    ProviderError,
)

POOLS = (
    Pool(instance_type="p3.2xlarge", zone="us-east-1a"),
    Pool(instance_type="p3.2xlarge", zone="us-east-1b"),
    Pool(instance_type="g5.xlarge", zone="us-east-1c"),
)


def _request(token: str = "job7-acq1", count: int = 3) -> LaunchRequest:
    return LaunchRequest(
        client_token=token, count=count, pools=POOLS,
        bootstrap=AgentBootstrap(control_plane_url="https://cp.example.com", enroll_key="12.secret-key"),
        tags={TAG_JOB: "7", "spotpipe:team": "3"},
    )


IMAGE = "ami-0a1b2c3d4e5f60718"


def _provider(ec2, mode: str = "fleet") -> AwsProvider:
    image = IMAGE
    groups = ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": ["spotpipe-nodes"]}])
    group = (groups["SecurityGroups"][0]["GroupId"] if groups["SecurityGroups"] else
             ec2.create_security_group(GroupName="spotpipe-nodes", Description="nodes")["GroupId"])
    return AwsProvider(AwsConfig(image_id=image, launch_mode=mode, security_group_ids=(group,)),
                       client_factory=lambda region: ec2)


def test_create_fleet_request_shape_and_launch(ec2):
    provider = _provider(ec2)
    nodes = provider.launch(_request())

    assert len(nodes) == 3
    assert all(n.state in ("pending", "running") and n.lifecycle == "spot" for n in nodes)
    assert all(n.tags[TAG_REQUEST] == "job7-acq1" and n.tags[TAG_JOB] == "7" for n in nodes)

    (fleet,) = ec2.request_log.by_action("CreateFleet")
    assert fleet["Type"] == "instant"
    assert fleet["ClientToken"] == "job7-acq1"
    assert fleet["SpotOptions.AllocationStrategy"] == "price-capacity-optimized"
    assert fleet["TargetCapacitySpecification.TotalTargetCapacity"] == "3"
    assert fleet["TargetCapacitySpecification.DefaultTargetCapacityType"] == "spot"
    prefix = "LaunchTemplateConfigs.1."
    assert fleet[prefix + "LaunchTemplateSpecification.Version"] == "$Latest"
    overrides = [(fleet[f"{prefix}Overrides.{i}.InstanceType"], fleet[f"{prefix}Overrides.{i}.AvailabilityZone"])
                 for i in (1, 2, 3)]
    assert overrides == [("p3.2xlarge", "us-east-1a"), ("p3.2xlarge", "us-east-1b"), ("g5.xlarge", "us-east-1c")]
    # Instances and the fleet are tagged with the job and the idempotency token.
    tag_specs = {fleet[f"TagSpecification.{i}.ResourceType"]: {
        fleet[f"TagSpecification.{i}.Tag.{j}.Key"]: fleet[f"TagSpecification.{i}.Tag.{j}.Value"] for j in (1, 2, 3)}
        for i in (1, 2)}
    assert tag_specs["instance"] == {TAG_JOB: "7", TAG_REQUEST: "job7-acq1", "spotpipe:team": "3"}
    assert tag_specs["fleet"] == tag_specs["instance"]

    (template,) = ec2.request_log.by_action("CreateLaunchTemplate")
    assert template["LaunchTemplateName"] == fleet[prefix + "LaunchTemplateSpecification.LaunchTemplateName"]
    assert template["LaunchTemplateData.MetadataOptions.HttpTokens"] == "required"
    assert template["LaunchTemplateData.SecurityGroupId.1"].startswith("sg-")
    user_data = base64.b64decode(template["LaunchTemplateData.UserData"]).decode()
    assert user_data.startswith("#!/bin/bash")
    assert "spotpipe-agent --control-plane https://cp.example.com --cloud aws" in user_data
    assert "SPOTPIPE_ENROLL_KEY=12.secret-key" in user_data


def test_launch_twice_with_same_token_launches_once(ec2):
    provider = _provider(ec2)
    first = provider.launch(_request(token="job8-acq1", count=2))
    second = provider.launch(_request(token="job8-acq1", count=2))

    assert [n.provider_instance_id for n in second] == sorted(n.provider_instance_id for n in first)
    assert len(ec2.request_log.by_action("CreateFleet")) == 1


def test_run_instances_mode_uses_spot_market_options(ec2):
    provider = _provider(ec2, mode="run_instances")
    nodes = provider.launch(_request(token="job9-acq1", count=1))

    assert len(nodes) == 1 and nodes[0].lifecycle == "spot"
    (run,) = ec2.request_log.by_action("RunInstances")
    assert run["InstanceMarketOptions.MarketType"] == "spot"
    assert run["InstanceMarketOptions.SpotOptions.SpotInstanceType"] == "one-time"
    assert run["InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior"] == "terminate"
    assert run["MinCount"] == run["MaxCount"] == "1"
    assert run["ClientToken"] == "job9-acq1"
    assert run["TagSpecification.1.ResourceType"] == "instance"
    assert "spotpipe-agent" in base64.b64decode(run["UserData"]).decode()


def test_describe_and_terminate(ec2):
    provider = _provider(ec2)
    nodes = provider.launch(_request(token="job10-acq1", count=2))
    ids = [n.provider_instance_id for n in nodes]

    described = provider.describe([*ids, "i-0123456789abcdef0"])
    assert [d.state for d in described[:2]] == ["running", "running"]
    assert described[2].state == "missing"

    provider.terminate([ids[0], "i-0123456789abcdef0"])
    states = {d.provider_instance_id: d.state for d in provider.describe(ids)}
    assert states[ids[0]] in ("stopping", "terminated")
    assert states[ids[1]] == "running"
    # One unknown id fails the call on EC2; the provider retries with the ids that exist.
    calls = ec2.request_log.by_action("TerminateInstances")
    assert calls[0]["InstanceId.1"] == ids[0] and calls[0]["InstanceId.2"] == "i-0123456789abcdef0"
    assert calls[-1] == {"Action": "TerminateInstances", "Version": calls[-1]["Version"], "InstanceId.1": ids[0]}
    # A terminated node is not adopted by a later launch with the same token.
    assert [n.provider_instance_id for n in provider.find_by_request("job10-acq1")] == [ids[1]]


def test_launch_without_pools_is_refused(ec2):
    from controlplane.orchestration.providers.base import ProviderError

    request = LaunchRequest(client_token="x", count=1, pools=(), bootstrap=_request().bootstrap)
    with pytest.raises(ProviderError, match="no pool"):
        AwsProvider(AwsConfig(image_id="ami-1"), client_factory=lambda region: ec2).launch(request)


def test_user_data_keeps_the_key_out_of_argv():
    text = render_user_data(AgentBootstrap(control_plane_url="http://cp", enroll_key="k.1"))
    assert "ExecStart=/opt/spotpipe/bin/spotpipe-agent --control-plane http://cp" in text
    assert "k.1" not in text.split("ExecStart=")[1].splitlines()[0]


def _on_demand(request: LaunchRequest) -> LaunchRequest:
    return dataclasses.replace(request, capacity_type="on_demand")


def test_on_demand_fleet_request_shape(ec2):
    provider = _provider(ec2)
    nodes = provider.launch(_on_demand(_request(token="job11-acq1", count=2)))

    assert len(nodes) == 2
    assert {(n.lifecycle, n.region) for n in nodes} == {("on_demand", "us-east-1")}
    (fleet,) = ec2.request_log.by_action("CreateFleet")
    assert fleet["TargetCapacitySpecification.DefaultTargetCapacityType"] == "on-demand"
    assert fleet["OnDemandOptions.AllocationStrategy"] == "lowest-price"
    assert not [k for k in fleet if k.startswith("SpotOptions")]
    # Described again later (EC2 omits InstanceLifecycle for on-demand): still on_demand.
    assert {n.lifecycle for n in provider.describe([n.provider_instance_id for n in nodes])} == {"on_demand"}


def test_run_instances_on_demand_has_no_market_options(ec2):
    provider = _provider(ec2, mode="run_instances")
    (node,) = provider.launch(_on_demand(_request(token="job12-acq1", count=1)))

    assert node.lifecycle == "on_demand" and node.region == "us-east-1"
    (run,) = ec2.request_log.by_action("RunInstances")
    assert not [k for k in run if k.startswith("InstanceMarketOptions")]


class FleetShortOfCapacity:
    """The moto client, except that CreateFleet answers as EC2 does when some offerings have no
    capacity (moto never runs out): each override in `failing` gets an `Errors` entry with its code,
    echoing the override as sent, and the others launch `launch` instances on moto."""

    def __init__(self, client, failing: dict[str, str], launch: int = 0) -> None:
        self.client = client
        self.failing = failing  # InstanceType@(AvailabilityZone or SubnetId) -> ErrorCode
        self.launch = launch

    def __getattr__(self, name: str):
        return getattr(self.client, name)

    def create_fleet(self, **params):
        config = params["LaunchTemplateConfigs"][0]
        overrides = config["Overrides"]

        def key(o: dict) -> str:
            return f"{o['InstanceType']}@{o.get('AvailabilityZone') or o.get('SubnetId')}"

        errors = [{"LaunchTemplateAndOverrides": {"LaunchTemplateSpecification": config["LaunchTemplateSpecification"],
                                                  "Overrides": o},
                   "Lifecycle": "spot", "ErrorCode": self.failing[key(o)],
                   "ErrorMessage": "There is no Spot capacity available that matches your request."}
                  for o in overrides if key(o) in self.failing]
        ok = [o for o in overrides if key(o) not in self.failing]
        response = {"FleetId": "fleet-00000000-0000-0000-0000-000000000000", "Instances": []}
        if ok and self.launch:
            target = {**params["TargetCapacitySpecification"], "TotalTargetCapacity": self.launch}
            response = self.client.create_fleet(**{**params, "TargetCapacitySpecification": target,
                                                   "LaunchTemplateConfigs": [{**config, "Overrides": ok}]})
        return {**response, "Errors": errors + list(response.get("Errors", []))}


def _short_provider(ec2, failing: dict[str, str], launch: int = 0, **config) -> AwsProvider:
    client = FleetShortOfCapacity(ec2, failing, launch)
    return AwsProvider(AwsConfig(image_id=IMAGE, **config), client_factory=lambda region: client)


def _default_subnets(ec2) -> dict[str, str]:
    """moto's default subnet of each zone (moto places a fleet's instance by its SubnetId override
    and ignores an AvailabilityZone one, so tests that check zones launch by subnet)."""
    return {s["AvailabilityZone"]: s["SubnetId"] for s in ec2.describe_subnets()["Subnets"] if s.get("DefaultForAz")}


def test_capacity_errors_name_their_offerings_and_keep_the_nodes_launched(ec2):
    subnets = _default_subnets(ec2)
    provider = _short_provider(ec2, {f"p3.2xlarge@{subnets['us-east-1a']}": "InsufficientInstanceCapacity",
                                     f"p3.2xlarge@{subnets['us-east-1b']}": "MaxSpotInstanceCountExceeded"},
                               launch=1, subnet_by_zone=subnets)

    with pytest.raises(InsufficientCapacity) as caught:
        provider.launch(_request(token="job13-acq1", count=3))

    assert caught.value.pools == ("p3.2xlarge@us-east-1a", "p3.2xlarge@us-east-1b")
    assert caught.value.code == "InsufficientInstanceCapacity,MaxSpotInstanceCountExceeded"
    (node,) = caught.value.nodes
    assert (node.instance_type, node.zone, node.state, node.lifecycle, node.region) == (
        "g5.xlarge", "us-east-1c", "running", "spot", "us-east-1")
    # The partial node is real: a retried launch with the same token adopts it instead of launching again.
    assert [n.provider_instance_id for n in provider.launch(_request(token="job13-acq1", count=3))] == [
        node.provider_instance_id]


def test_capacity_errors_by_availability_zone_and_nothing_launched(ec2):
    failing = {"p3.2xlarge@us-east-1b": "InsufficientInstanceCapacity", "g5.xlarge@us-east-1c": "VcpuLimitExceeded"}
    provider = _short_provider(ec2, failing, launch=0)

    with pytest.raises(InsufficientCapacity) as caught:
        provider.launch(_request(token="job14-acq1", count=2))

    # p3@us-east-1a reported nothing: only the two offerings with a capacity code are named.
    assert caught.value.pools == ("p3.2xlarge@us-east-1b", "g5.xlarge@us-east-1c")
    assert caught.value.code == "InsufficientInstanceCapacity,VcpuLimitExceeded"
    assert caught.value.nodes == []
    assert provider.find_by_request("job14-acq1") == []


def test_an_offering_without_capacity_does_not_fail_a_full_launch(ec2):
    provider = _short_provider(ec2, {"p3.2xlarge@us-east-1a": "InsufficientInstanceCapacity"}, launch=2)

    nodes = provider.launch(_request(token="job15-acq1", count=2))

    assert len(nodes) == 2 and {n.state for n in nodes} == {"running"}


def test_fleet_errors_without_a_capacity_code_stay_provider_errors(ec2):
    failing = {f"{p.instance_type}@{p.zone}": "InvalidParameterValue" for p in POOLS}
    provider = _short_provider(ec2, failing)

    with pytest.raises(ProviderError) as caught:
        provider.launch(_request(token="job16-acq1", count=1))

    assert not isinstance(caught.value, InsufficientCapacity)
    assert caught.value.code == "InvalidParameterValue" and caught.value.transient is False


class FailingCall:
    """The moto client, except that `method` raises a ClientError with `code`, as EC2 answers a
    whole call it refuses."""

    def __init__(self, client, method: str, code: str) -> None:
        self.client, self.method, self.code = client, method, code

    def __getattr__(self, name: str):
        if name == self.method:
            def refuse(**params):
                raise ClientError({"Error": {"Code": self.code, "Message": "refused"}},
                                  "".join(p.title() for p in name.split("_")))
            return refuse
        return getattr(self.client, name)


PRICED = (
    Pool(instance_type="p3.2xlarge", zone="us-east-1a", price=Decimal("0.95")),
    Pool(instance_type="g5.xlarge", zone="us-east-1c", price=Decimal("0.41")),
)


@pytest.mark.parametrize(("mode", "method", "failed"), [
    ("run_instances", "run_instances", ("g5.xlarge@us-east-1c",)),  # the one pool RunInstances tried
    ("fleet", "create_fleet", ("p3.2xlarge@us-east-1a", "g5.xlarge@us-east-1c")),
])
def test_a_quota_refusing_the_whole_call_is_insufficient_capacity(ec2, mode, method, failed):
    client = FailingCall(ec2, method, "VcpuLimitExceeded")
    provider = AwsProvider(AwsConfig(image_id=IMAGE, launch_mode=mode), client_factory=lambda region: client)

    with pytest.raises(InsufficientCapacity) as caught:
        provider.launch(dataclasses.replace(_request(token=f"job17-{mode}"), pools=PRICED))

    assert caught.value.code == "VcpuLimitExceeded"
    assert caught.value.pools == failed
    assert caught.value.nodes == []


@pytest.mark.parametrize("code", ["RequestLimitExceeded", "InternalError"])
def test_throttling_and_server_errors_are_transient(ec2, code):
    client = FailingCall(ec2, "create_fleet", code)
    provider = AwsProvider(AwsConfig(image_id=IMAGE), client_factory=lambda region: client)

    with pytest.raises(ProviderError) as caught:
        provider.launch(_request(token=f"job18-{code}"))

    assert not isinstance(caught.value, InsufficientCapacity)
    assert caught.value.transient is True and caught.value.code == code


class FleetAnswer:
    """The moto client, except that CreateFleet returns `answer` as is (an instance EC2 started but
    DescribeInstances does not show yet: eventual consistency)."""

    def __init__(self, client, answer: dict) -> None:
        self.client, self.answer = client, answer

    def __getattr__(self, name: str):
        return getattr(self.client, name)

    def create_fleet(self, **params):
        return self.answer


def test_a_launched_instance_not_yet_described_comes_back_pending(ec2):
    answer = {"Instances": [{"InstanceIds": ["i-0fedcba9876543210"], "InstanceType": "g5.xlarge",
                             "Lifecycle": "on-demand",
                             "LaunchTemplateAndOverrides": {"Overrides": {"InstanceType": "g5.xlarge",
                                                                          "AvailabilityZone": "us-east-1c"}}}],
              "Errors": []}
    client = FleetAnswer(ec2, answer)
    provider = AwsProvider(AwsConfig(image_id=IMAGE), client_factory=lambda region: client)

    (node,) = provider.launch(_on_demand(_request(token="job19-acq1", count=1)))

    assert (node.provider_instance_id, node.state, node.zone, node.lifecycle, node.region) == (
        "i-0fedcba9876543210", "pending", "us-east-1c", "on_demand", "us-east-1")
    assert node.tags[TAG_REQUEST] == "job19-acq1"
