"""Enrolment proves the node is the launched instance: the AWS instance identity document, signed
(base64 RSA-SHA256, `/latest/dynamic/instance-identity/signature`), checked against the configured
certificate, instance id, account and region. A locally generated key and certificate stand in for
AWS's, and the local metadata server signs with it, so the agent's real code path is exercised."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from agent.main import Agent, AgentConfig
from agent.metadata import AwsImdsWatcher
from controlplane.fleet.models import Instance
from controlplane.orchestration import services
from controlplane.orchestration.identity import (
    IdentityPolicy,
    IdentityRejected,
    generate_signing_pair,
    verify_identity_document,
)
from controlplane.orchestration.providers import set_provider
from controlplane.orchestration.providers.local.metadata import IdentitySigner, MetadataServer
from tests.controlplane.factories import make_job, make_team
from tests.orchestration.fakes import FakeProvider

ACCOUNT = "123456789012"
REGION = "us-east-1"


@pytest.fixture(scope="module")
def pair() -> tuple[bytes, bytes]:
    return generate_signing_pair()


@pytest.fixture(scope="module")
def other_pair() -> tuple[bytes, bytes]:
    return generate_signing_pair(common_name="not aws")


def _signed(key_pem: bytes, *, instance_id: str = "i-0abc", account: str = ACCOUNT,
            region: str = REGION) -> tuple[str, str]:
    signer = IdentitySigner(private_key_pem=key_pem, account_id=account, region=region)
    document = signer.document(instance_id=instance_id, instance_type="p3.2xlarge", zone=f"{region}a")
    return document, signer.sign(document)


def _policy(cert_pem: bytes) -> IdentityPolicy:
    return IdentityPolicy(certificate_pem=cert_pem, account_id=ACCOUNT, region=REGION)


def _verify(document: str, signature: str, cert_pem: bytes, instance_id: str = "i-0abc") -> dict:
    return verify_identity_document(document=document, signature_b64=signature, expected_instance_id=instance_id,
                                    policy=_policy(cert_pem))


def test_a_genuine_document_verifies(pair):
    key, cert = pair
    document, signature = _signed(key)
    fields = _verify(document, signature, cert)
    assert (fields["instanceId"], fields["accountId"], fields["region"]) == ("i-0abc", ACCOUNT, REGION)


@pytest.mark.parametrize(("case", "message"), [
    ("forged document", "does not verify"),
    ("signed by another key", "does not verify"),
    ("wrong instance id", "instanceId 'i-0other' is not the launched instance"),
    ("wrong account", "accountId '999999999999' is not the configured account"),
    ("wrong region", "region 'eu-west-1' is not the configured region"),
    ("missing signature", "document and its signature are required"),
    ("missing document", "document and its signature are required"),
    ("signature not base64", "not base64"),
])
def test_a_document_that_does_not_prove_the_instance_is_rejected(pair, other_pair, case, message):
    key, cert = pair
    document, signature = _signed(key)
    expected = "i-0abc"
    if case == "forged document":  # AWS's signature over a genuine document, its instance id changed
        document, expected = document.replace('"i-0abc"', '"i-0abd"'), "i-0abd"
    elif case == "signed by another key":
        document, signature = _signed(other_pair[0])
    elif case == "wrong instance id":
        document, signature = _signed(key, instance_id="i-0other")
    elif case == "wrong account":
        document, signature = _signed(key, account="999999999999")
    elif case == "wrong region":
        document, signature = _signed(key, region="eu-west-1")
    elif case == "missing signature":
        signature = ""
    elif case == "missing document":
        document = ""
    elif case == "signature not base64":
        signature = "%%%not-base64%%%"
    with pytest.raises(IdentityRejected, match=message) as caught:
        _verify(document, signature, cert, instance_id=expected)
    assert caught.value.status_code == 403


def test_the_agent_reads_the_signed_document_from_the_local_metadata_server(pair, tmp_path):
    key, cert = pair
    server = MetadataServer(instance_id="i-0abc", instance_type="p3.2xlarge", zone="us-east-1a",
                            identity=IdentitySigner(private_key_pem=key, account_id=ACCOUNT, region=REGION)).start()
    try:
        document, signature = AwsImdsWatcher(server.url).identity()
        assert json.loads(document)["instanceId"] == "i-0abc" and "\n" in signature  # 64-column base64, as AWS
        assert _verify(document, signature, cert)["instanceType"] == "p3.2xlarge"
        unsigned = MetadataServer(instance_id="i-0abc").start()
        try:
            assert AwsImdsWatcher(unsigned.url).identity() == ("", "")
        finally:
            unsigned.stop()
    finally:
        server.stop()


# --- through the enrolment API -------------------------------------------------------------------------


@pytest.fixture
def aws_acquisition(pair, tmp_path, monkeypatch, settings):
    """An aws job's acquisition launched on an in-memory provider, with enforcement configured: a
    per-region certificate directory and the account."""
    _, cert = pair
    settings.SPOTPIPE_AWS_REGION = REGION
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / f"{REGION}.pem").write_bytes(cert)
    monkeypatch.setenv("SPOTPIPE_AWS_IDENTITY_CERT", str(tmp_path / "certs"))
    monkeypatch.setenv("SPOTPIPE_AWS_ACCOUNT_ID", ACCOUNT)
    fake = FakeProvider()
    set_provider("aws", fake)
    job = make_job(make_team(), strategy="recycle", plan={"dp": 1, "pp": 2, "provider": "aws"})
    acquisition = services.job_start(job=job)
    services.acquisition_launch(acquisition=acquisition)
    yield acquisition
    set_provider("aws", None)


def _enroll(acquisition, provider_id: str, document: str = "", signature: str = ""):
    return APIClient().post("/api/v1/agents/enroll/", {
        "enroll_key": services.acquisition_enroll_key(acquisition=acquisition), "provider_instance_id": provider_id,
        "identity_document": document, "identity_signature": signature}, format="json")


@pytest.mark.django_db
def test_aws_enrolment_requires_the_launched_instances_signed_document(aws_acquisition, pair, other_pair):
    key, _ = pair
    missing = _enroll(aws_acquisition, "fake-1")
    assert missing.status_code == 403 and "signature are required" in missing.json()["detail"]

    # A machine that learned the key but is not the launched instance: its genuine document names itself.
    other = _enroll(aws_acquisition, "fake-1", *_signed(key, instance_id="i-0attacker"))
    assert other.status_code == 403 and "is not the launched instance ('fake-1')" in other.json()["detail"]
    forged = _enroll(aws_acquisition, "fake-1", *_signed(other_pair[0], instance_id="fake-1"))
    assert forged.status_code == 403 and "does not verify" in forged.json()["detail"]
    assert _enroll(aws_acquisition, "fake-1", *_signed(key, instance_id="fake-1", account="1")).status_code == 403
    assert Instance.objects.get(provider_instance_id="fake-1").state == "pending"  # nothing half-written

    ok = _enroll(aws_acquisition, "fake-1", *_signed(key, instance_id="fake-1"))
    assert ok.status_code == 201
    assert Instance.objects.get(pk=ok.json()["instance"]).state == "running"


@pytest.mark.django_db
def test_enforcement_settings(aws_acquisition, monkeypatch):
    monkeypatch.setenv("SPOTPIPE_ENROLL_VERIFY_IDENTITY", "off")  # dev: the key alone
    assert _enroll(aws_acquisition, "fake-1").status_code == 201
    monkeypatch.setenv("SPOTPIPE_ENROLL_VERIFY_IDENTITY", "auto")
    monkeypatch.delenv("SPOTPIPE_AWS_ACCOUNT_ID")
    refused = _enroll(aws_acquisition, "fake-2")  # enforcing without an account: fail closed
    assert refused.status_code == 403 and "SPOTPIPE_AWS_ACCOUNT_ID" in refused.json()["detail"]


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_local_node_enrols_with_its_signed_document_when_enforced(control_plane, pair, tmp_path: Path,
                                                                   monkeypatch, settings):
    key, cert = pair
    settings.SPOTPIPE_AWS_REGION = REGION
    (tmp_path / "cert.pem").write_bytes(cert)
    monkeypatch.setenv("SPOTPIPE_ENROLL_VERIFY_IDENTITY", "on")  # also for the local provider
    monkeypatch.setenv("SPOTPIPE_AWS_IDENTITY_CERT", str(tmp_path / "cert.pem"))
    monkeypatch.setenv("SPOTPIPE_AWS_ACCOUNT_ID", ACCOUNT)
    set_provider("local", FakeProvider())
    try:
        job = make_job(make_team(), strategy="recycle", plan={"dp": 1, "pp": 2, "provider": "local"})
        acquisition = services.job_start(job=job)
        services.acquisition_launch(acquisition=acquisition)
        enroll_key = services.acquisition_enroll_key(acquisition=acquisition)
        for provider_id, signer_key in (("fake-1", key), ("fake-2", generate_signing_pair()[0])):
            server = MetadataServer(instance_id=provider_id, identity=IdentitySigner(
                private_key_pem=signer_key, account_id=ACCOUNT, region=REGION)).start()
            agent = Agent(AgentConfig(control_plane=control_plane.url, enroll_key=enroll_key, cloud="aws",
                                      metadata_url=server.url, work_dir=tmp_path / provider_id))
            try:
                if provider_id == "fake-1":
                    agent.enroll()
                    assert Instance.objects.get(pk=agent.instance_id).state == "running"
                else:  # signed by a key that is not the configured certificate's
                    with pytest.raises(Exception, match="403"):
                        agent.enroll()
                    assert Instance.objects.get(provider_instance_id="fake-2").state == "pending"
            finally:
                agent.stop()
                server.stop()
    finally:
        set_provider("local", None)


@pytest.mark.django_db
def test_a_node_of_another_configured_region_is_checked_with_that_regions_certificate(pair, other_pair, tmp_path,
                                                                                     monkeypatch, settings):
    from controlplane.orchestration.identity import identity_policy_for

    settings.SPOTPIPE_AWS_REGION = REGION
    (tmp_path / f"{REGION}.pem").write_bytes(other_pair[1])
    (tmp_path / "us-west-2.pem").write_bytes(pair[1])
    monkeypatch.setenv("SPOTPIPE_AWS_IDENTITY_CERT", str(tmp_path))
    monkeypatch.setenv("SPOTPIPE_AWS_ACCOUNT_ID", ACCOUNT)
    monkeypatch.setenv("SPOTPIPE_AWS_REGIONS", f"{REGION},us-west-2")

    policy = identity_policy_for("aws", region="us-west-2")
    assert (policy.region, policy.certificate_pem) == ("us-west-2", pair[1])
    document, signature = _signed(pair[0], instance_id="i-0west", region="us-west-2")
    assert verify_identity_document(document=document, signature_b64=signature, expected_instance_id="i-0west",
                                    policy=policy)["region"] == "us-west-2"
    with pytest.raises(IdentityRejected, match="not a region of SPOTPIPE_AWS_REGIONS"):
        identity_policy_for("aws", region="eu-west-1")
