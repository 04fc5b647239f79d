"""The aws provider against moto's server: launch, describe and terminate, with the request shapes
a real account receives (checked on the wire, as EC2 Query parameters)."""

from __future__ import annotations

import base64

import pytest

from controlplane.orchestration.providers.aws import AwsConfig, AwsProvider, render_user_data
from controlplane.orchestration.providers.base import TAG_JOB, TAG_REQUEST, AgentBootstrap, LaunchRequest, Pool

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
