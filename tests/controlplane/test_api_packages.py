"""Package uploads for jobs' `requirements` (issue 19): POST /api/v1/packages/ stores a wheel/sdist
content-addressed by sha256 for the team, GET /api/v1/packages/<sha256>/ serves it to the team's
users and agents only; bad names and sizes are 400 with nothing written; the same bytes again is
the same package; a job naming an upload its team does not have is refused naming the entry."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from agent.client import ControlPlaneClient, ControlPlaneError
from controlplane.jobs.models import Package, TrainingJob
from tests.controlplane.api_helpers import make_api_token, make_team_world
from tests.runtime.data.conftest import moto_s3, s3  # noqa: F401 (fixtures: moto's S3 server, a bucket)

pytestmark = pytest.mark.django_db

WHEEL = b"PK\x03\x04 not really a wheel, but bytes to store"
NAME = "mypkg-1.0-py3-none-any.whl"


@pytest.fixture
def store(tmp_path: Path, settings) -> Path:
    settings.SPOTPIPE_ARTIFACTS = str(tmp_path / "artifacts")
    return tmp_path / "artifacts" / "packages"


def _upload(client, data: bytes = WHEEL, name: str = NAME, **extra):
    return client.post("/api/v1/packages/", {"file": SimpleUploadedFile(name, data), **extra}, format="multipart")


def test_upload_answers_the_requirement_and_stores_the_bytes_by_sha256(store: Path) -> None:
    world = make_team_world()
    response = _upload(world.member_client)
    assert response.status_code == 201, response.content
    sha = hashlib.sha256(WHEEL).hexdigest()
    assert response.json() == {"sha256": sha, "requirement": f"upload:{sha}", "size": len(WHEEL), "filename": NAME}
    assert (store / sha).read_bytes() == WHEEL

    # The same file again (replayed request): the same answer, one package, one file.
    again = _upload(world.member_client)
    assert again.status_code == 200 and again.json() == response.json()
    assert Package.objects.filter(team=world.team).count() == 1 and [p.name for p in store.iterdir()] == [sha]

    # The team's agent downloads it, named as uploaded, with its checksum; so does a user.
    for client in (world.agent_client, world.admin_client):
        download = client.get(f"/api/v1/packages/{sha}/")
        assert download.status_code == 200
        assert b"".join(download.streaming_content) == WHEEL
        assert download["X-Checksum-SHA256"] == sha and NAME in download["Content-Disposition"]


def test_another_team_and_its_agents_do_not_see_the_package(store: Path) -> None:
    mine, theirs = make_team_world(), make_team_world()
    sha = _upload(mine.member_client).json()["sha256"]
    for client in (theirs.member_client, theirs.agent_client):
        assert client.get(f"/api/v1/packages/{sha}/").status_code == 404
    # Agents do not upload; nor may a user upload to a team they are not in.
    assert _upload(mine.agent_client).status_code == 403
    assert _upload(theirs.member_client, team=mine.team.pk).status_code == 400
    # Their own upload of the same bytes makes it theirs too (the file is stored once).
    assert _upload(theirs.member_client).status_code == 201
    assert theirs.agent_client.get(f"/api/v1/packages/{sha}/").status_code == 200
    assert len(list(store.iterdir())) == 1


@pytest.mark.parametrize(("name", "data", "message"), [
    ("mypkg-1.0.exe", WHEEL, "is not a package file"),
    ("my pkg;rm -rf.whl", WHEEL, "is not a package file"),  # (Django keeps only a basename)
    ("requirements.txt", WHEEL, "is not a package file"),
    (NAME, b"", "empty"),
    (NAME, b"x" * 101, "expected at most 100"),
])
def test_a_bad_upload_is_400_naming_the_file_and_writes_nothing(store: Path, settings, name, data, message) -> None:
    settings.SPOTPIPE_PACKAGE_MAX_BYTES = 100
    world = make_team_world()
    response = _upload(world.member_client, data=data, name=name)
    assert response.status_code == 400, response.content
    assert message in " ".join(response.json()["errors"]["file"])
    assert not Package.objects.exists() and not store.exists()


def test_a_body_far_over_the_limit_is_refused_before_it_is_read(store: Path, settings) -> None:
    settings.SPOTPIPE_PACKAGE_MAX_BYTES = 100
    world = make_team_world()
    response = _upload(world.member_client, data=b"x" * 200_000)
    assert response.status_code == 400 and "expected at most 100" in response.json()["errors"]["file"][0]
    assert not store.exists()


def test_a_job_names_its_uploads_and_an_unknown_one_is_refused(store: Path) -> None:
    world = make_team_world()
    sha = _upload(world.member_client).json()["sha256"]
    body = {"name": "with-reqs", "strategy": "recycle", "target_steps": 4, "plan": {"dp": 1, "pp": 1},
            "deadline": (timezone.now() + timedelta(hours=1)).isoformat(),
            "config": {"requirements": ["numpy>=1.26", f"upload:{sha}", "s3://bucket/pkgs/x-1.0-py3-none-any.whl"]}}
    response = world.member_client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    assert TrainingJob.objects.get(pk=response.json()["id"]).config["requirements"] == body["config"]["requirements"]

    before = TrainingJob.objects.count()
    unknown = "0" * 64
    bad = {**body, "config": {"requirements": ["numpy>=1.26", f"upload:{unknown}", "--index-url=http://x"]}}
    response = world.member_client.post("/api/v1/jobs/", bad, format="json")
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert "pip option" in errors["config.requirements[2]"][0]
    # The shape is checked first; with it right, the unknown upload is named.
    bad["config"]["requirements"] = ["numpy>=1.26", f"upload:{unknown}"]
    errors = world.member_client.post("/api/v1/jobs/", bad, format="json").json()["errors"]
    assert errors == {"config.requirements[1]": [
        f"no package {unknown} among your team's uploads; upload it first (POST /api/v1/packages/)"]}
    assert TrainingJob.objects.count() == before


@pytest.mark.django_db(transaction=True)
def test_the_agents_client_downloads_its_teams_package(store: Path, live_server, tmp_path: Path) -> None:
    # What a node does for `upload:<sha256>` (agent/requirements.py): the file, named as uploaded,
    # its sha256 checked; another team's agent gets a 404.
    world = make_team_world()
    sha = _upload(world.member_client).json()["sha256"]
    agent = ControlPlaneClient(live_server.url, token=make_api_token(world.team, instance=world.instance))
    path = agent.download(f"packages/{sha}/", tmp_path / "dl")
    assert path == tmp_path / "dl" / NAME and path.read_bytes() == WHEEL
    other = make_team_world()
    outsider = ControlPlaneClient(live_server.url, token=make_api_token(other.team, instance=other.instance))
    with pytest.raises(ControlPlaneError) as refused:
        outsider.download(f"packages/{sha}/", tmp_path / "other")
    assert refused.value.status == 404 and not (tmp_path / "other").exists()


def test_an_s3_store_keeps_packages_under_their_sha256(s3, settings) -> None:  # noqa: F811
    client, bucket = s3
    settings.SPOTPIPE_ARTIFACTS = f"s3://{bucket}/store"
    settings.SPOTPIPE_S3_ENDPOINT_URL = None  # boto3 finds moto through AWS_ENDPOINT_URL
    world = make_team_world()
    sha = _upload(world.member_client).json()["sha256"]
    assert client.get_object(Bucket=bucket, Key=f"store/packages/{sha}")["Body"].read() == WHEEL
    assert _upload(world.member_client).status_code == 200
    download = world.agent_client.get(f"/api/v1/packages/{sha}/")
    assert download.status_code == 200 and b"".join(download.streaming_content) == WHEEL
