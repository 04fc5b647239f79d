"""A job's artifacts through the API (issue 19): the folder the control plane hands to the agents,
the listing of its weight files with sizes and sha256 (computed once: a sidecar), streaming one by
name (only names in the listing), team scoping (404 for another team's job, 401 without a token),
and the job page's download links and load snippet. The run through real nodes is
tests/orchestration/test_artifacts_end_to_end.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from controlplane.jobs import artifacts
from controlplane.orchestration.services import agent_commands
from runtime.checkpointing.export import export_state_dict, write_json
from tests.controlplane.api_helpers import make_api_token, make_api_user, token_client
from tests.controlplane.factories import make_instance, make_job, make_team
from tests.runtime.data.conftest import moto_s3, s3  # noqa: F401 (fixtures: moto's S3 server, a bucket)

pytestmark = pytest.mark.django_db


@pytest.fixture
def store(tmp_path: Path, settings) -> Path:
    settings.SPOTPIPE_ARTIFACTS = str(tmp_path / "artifacts")
    return tmp_path / "artifacts"


def _export(folder: Path, *, sharded: bool = False) -> dict[str, torch.Tensor]:
    state = {"0.weight": torch.arange(12.0).reshape(3, 4), "0.bias": torch.ones(3), "1.weight": torch.zeros(2, 3)}
    write_json(folder / "spotpipe.json", {"model": {"kind": "mlp"}, "steps_done": 4})
    export_state_dict(folder, state, max_shard_bytes=40 if sharded else 10**9, steps_done=4)
    return state


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_agents_run_command_names_the_jobs_folder(store: Path) -> None:
    team = make_team()
    job = make_job(team)
    instance = make_instance(team, job=job)
    answer = agent_commands(instance_id=instance.pk)
    assert answer["job"]["artifacts"] == str(store / f"job-{job.pk}-{job.artifacts_key}")


def test_listing_download_and_scoping(store: Path, monkeypatch) -> None:
    team = make_team()
    token = make_api_token(team, user=make_api_user(team))
    job = make_job(team)
    client = token_client(token)
    url = f"/api/v1/jobs/{job.pk}/artifacts/"

    # Nothing exported yet (or a partial export): an empty listing, the folder named.
    body = client.get(url).json()
    folder = store / f"job-{job.pk}-{job.artifacts_key}"
    assert body["files"] == [] and not body["complete"] and body["location"] == str(folder)
    folder.mkdir(parents=True)
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"partial")
    assert client.get(url).json()["files"] == []
    assert client.get(url + "model-00001-of-00002.safetensors").status_code == 404
    (folder / "model-00001-of-00002.safetensors").unlink()

    _export(folder, sharded=True)
    (folder / "notes.txt").write_text("not an artifact")
    (folder / ".tmp-model.safetensors-x").write_text("a writer's temporary file")
    (folder / "model-00001-of-00009.safetensors").write_text("a stale shard of an older export")
    body = client.get(url).json()
    assert body["complete"]
    names = [f["name"] for f in body["files"]]
    assert "model.safetensors.index.json" in names and "spotpipe.json" in names
    assert sum(n.endswith(".safetensors") for n in names) >= 2 and "notes.txt" not in names
    assert "model-00001-of-00009.safetensors" not in names  # the index says what the export is
    for f in body["files"]:
        assert f["size"] == (folder / f["name"]).stat().st_size and f["sha256"] == _sha(folder / f["name"])
        assert f["url"].endswith(f"/api/v1/jobs/{job.pk}/artifacts/{f['name']}")
    assert f'spotpipe.load_model("{folder}")' in body["load_snippet"]

    # Checksums are computed once: a second listing reads them from the sidecar.
    monkeypatch.setattr(artifacts, "_sha256", lambda folder, name: pytest.fail(f"hashed {name} again"))
    assert client.get(url).json()["files"] == body["files"]

    # Download: the bytes, only names in the listing.
    name = next(n for n in names if n.endswith(".safetensors"))
    response = client.get(url + name)
    assert response.status_code == 200 and response["X-Checksum-SHA256"] == _sha(folder / name)
    assert b"".join(response.streaming_content) == (folder / name).read_bytes()
    assert name in response["Content-Disposition"]
    (store / "secret.safetensors").write_text("another folder")
    for bad in ("notes.txt", artifacts.SIDECAR, "model-00001-of-00009.safetensors", "..",
                "..%2Fsecret.safetensors", "%2E%2E", "model.safetensors"):
        assert client.get(url + bad).status_code == 404, bad
    assert client.get(f"/api/v1/jobs/{job.pk}/artifacts/../secret.safetensors").status_code == 404
    # An index naming a path outside the folder does not make it servable.
    monkeypatch.undo()  # the rewritten index is hashed again (its size and time changed)
    index = folder / "model.safetensors.index.json"
    body_index = json.loads(index.read_text())
    body_index["weight_map"]["0.bias"] = "../secret.safetensors"
    index.write_text(json.dumps(body_index))
    assert "../secret.safetensors" not in [f["name"] for f in client.get(url).json()["files"]]
    assert client.get(url + "..%2Fsecret.safetensors").status_code == 404

    # Team scope: another team's token sees no such job; no token is 401.
    other = make_team()
    stranger = token_client(make_api_token(other, user=make_api_user(other)))
    assert stranger.get(url).status_code == 404 and stranger.get(url + name).status_code == 404
    assert token_client().get(url).status_code == 401 and token_client().get(url + name).status_code == 401
    # The job's own agents do not read its weights (agent tokens reach only their listed actions).
    agent = token_client(make_api_token(team, instance=make_instance(team, job=job)))
    assert agent.get(url).status_code == 403 and agent.get(url + name).status_code == 403


def test_an_s3_store_lists_and_serves_what_the_workers_uploaded(s3, settings) -> None:  # noqa: F811
    """SPOTPIPE_ARTIFACTS=s3://... (moto): the job's folder is a prefix, the workers' export uploads
    there (runtime.checkpointing.export), the API lists it (sha256 cached in a sidecar object) and streams it."""
    from runtime.checkpointing.export import export_layers, model_entry
    from runtime.config import ModelSpec
    from runtime.models.model import build_layer
    from runtime.train.optim import LayerState

    client, bucket = s3
    settings.SPOTPIPE_ARTIFACTS = f"s3://{bucket}/store"
    settings.SPOTPIPE_S3_ENDPOINT_URL = None  # boto3 finds moto through AWS_ENDPOINT_URL
    team = make_team()
    job = make_job(team)
    location = artifacts.job_artifacts_location(job=job)
    assert location == f"s3://{bucket}/store/job-{job.pk}-{job.artifacts_key}"
    spec = ModelSpec(kind="mlp", n_layer=2, n_embd=8, in_features=4, vocab_size=5)
    states = {i: LayerState(i, build_layer(spec, i, 0)) for i in range(spec.num_layers)}
    layers = {i: s.module for i, s in states.items()}  # the shard plan's shapes
    common = dict(layers=layers, writers={0: 1, 1: 1, 2: 2, 3: 2}, steps_done=3, export_id="x/3",
                  info={"model": model_entry(spec), "steps_done": 3})
    client_api = token_client(make_api_token(team, user=make_api_user(team)))
    url = f"/api/v1/jobs/{job.pk}/artifacts/"
    assert not export_layers(location, node=2, states={i: states[i] for i in (2, 3)}, **common)
    assert client_api.get(url).json()["files"] == []  # not complete yet
    assert export_layers(location, node=1, states={i: states[i] for i in (0, 1)}, **common)
    body = client_api.get(url).json()
    names = [f["name"] for f in body["files"]]
    assert "model.safetensors.index.json" in names and "spotpipe.json" in names and body["complete"]
    for f in body["files"]:
        key = f"store/job-{job.pk}-{job.artifacts_key}/{f['name']}"
        data = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        assert f["size"] == len(data) and f["sha256"] == hashlib.sha256(data).hexdigest()
        response = client_api.get(url + f["name"])
        assert response.status_code == 200 and b"".join(response.streaming_content) == data
    sidecar_key = f"store/job-{job.pk}-{job.artifacts_key}/{artifacts.SIDECAR}"
    sidecar = json.loads(client.get_object(Bucket=bucket, Key=sidecar_key)["Body"].read())
    assert set(sidecar) == set(names)
    assert client_api.get(url + artifacts.SIDECAR).status_code == 404
    assert f'spotpipe.load_model("{location}")' in body["load_snippet"]


@pytest.mark.parametrize("where", ["local", "s3"])
def test_the_hugging_face_folder_of_an_hf_export_is_listed_and_served(where: str, request, store: Path,
                                                                      settings) -> None:
    """`export = "hf"`: the node that completes the export writes `hf/` beside it (`write_hf_beside`,
    staged and uploaded on S3); the listing adds its files once its config.json (written last) is
    there, and serves them by their names under hf/. A linked hf folder is not served."""
    from runtime.checkpointing.export import export_layers, model_entry
    from runtime.config import ModelSpec
    from runtime.models.model import build_layer
    from runtime.train.hf_folder import write_hf_beside
    from runtime.train.optim import LayerState

    if where == "s3":
        _, bucket = request.getfixturevalue("s3")
        settings.SPOTPIPE_ARTIFACTS = f"s3://{bucket}/store"
        settings.SPOTPIPE_S3_ENDPOINT_URL = None  # boto3 finds moto through AWS_ENDPOINT_URL
    team = make_team()
    job = make_job(team)
    location = artifacts.job_artifacts_location(job=job)
    spec = ModelSpec(kind="gpt", n_layer=1, n_embd=8, n_head=2, seq_len=8, vocab_size=256)
    states = {i: LayerState(i, build_layer(spec, i, 0)) for i in range(spec.num_layers)}
    layers = {i: s.module for i, s in states.items()}  # the shard plan's shapes
    assert export_layers(location, layers=layers, writers=dict.fromkeys(states, 0), node=0, states=states, steps_done=3,
                         export_id="x/3", info={"model": model_entry(spec), "steps_done": 3, "tokenizer": "byte"})
    api = token_client(make_api_token(team, user=make_api_user(team)))
    url = f"/api/v1/jobs/{job.pk}/artifacts/"
    assert not [f for f in api.get(url).json()["files"] if f["name"].startswith("hf/")]
    assert write_hf_beside(location) == f"{location}/hf"
    files = {f["name"]: f for f in api.get(url).json()["files"]}
    assert {"hf/config.json", "hf/model.safetensors", "hf/tokenizer.json", "hf/tokenizer_config.json"} <= set(files)
    response = api.get(url + "hf/config.json")
    assert response.status_code == 200 and 'filename="config.json"' in response["Content-Disposition"]
    served = b"".join(response.streaming_content)
    assert json.loads(served)["model_type"] == "gpt2" and hashlib.sha256(served).hexdigest() == files[
        "hf/config.json"]["sha256"]
    for bad in ("hf/notes.txt", "hf/../spotpipe.json", "hf", "hf/", "other/config.json"):
        assert api.get(url + bad).status_code == 404, bad
    if where == "local":  # a linked folder is another folder: nothing in it is served
        folder = store / f"job-{job.pk}-{job.artifacts_key}"
        (folder / "hf").rename(folder / "elsewhere")
        (folder / "hf").symlink_to(folder / "elsewhere")
        assert not [f for f in api.get(url).json()["files"] if f["name"].startswith("hf/")]
        assert api.get(url + "hf/config.json").status_code == 404


def test_the_job_page_links_the_files_and_shows_the_snippet(store: Path) -> None:
    team = make_team()
    user = make_api_user(team)
    job = make_job(team)
    page = token_client()
    page.force_login(user)
    html = page.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="artifacts-empty"' in html and str(store / f"job-{job.pk}-{job.artifacts_key}") in html
    _export(store / f"job-{job.pk}-{job.artifacts_key}")
    html = page.get(f"/jobs/{job.pk}/").content.decode()
    assert f'href="/api/v1/jobs/{job.pk}/artifacts/model.safetensors"' in html
    assert "import spotpipe" in html and "spotpipe.load_model(&quot;" in html
    # The link works with the dashboard's session.
    assert page.get(f"/api/v1/jobs/{job.pk}/artifacts/model.safetensors").status_code == 200


def test_the_job_page_says_when_the_store_cannot_be_read(store: Path, monkeypatch) -> None:
    team = make_team()
    user = make_api_user(team)
    job = make_job(team)
    page = token_client()
    page.force_login(user)

    def unreachable(**kwargs):
        raise OSError("connect timeout on endpoint URL")

    monkeypatch.setattr("frontend.views.job_artifacts_summary", unreachable)
    response = page.get(f"/jobs/{job.pk}/")
    assert response.status_code == 200 and 'id="artifacts-error"' in response.content.decode()
