"""A job's data through the API (issue 18): `config.data` (source, tokenizer, held-out share,
validation batches) and `config.val_every` are the runtime's JobConfig fields, validated at submit
with the runtime's own grammar (`runtime.config.parse_source`); an s3 source or tokenizer is looked up on S3
(moto's server here) with the control plane's AWS credentials before anything is stored; without
credentials that lookup is skipped and the job says so; a `py:` source is never imported."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import boto3
import pytest
from django.utils import timezone

from controlplane.jobs.data_checks import _s3_problem
from controlplane.jobs.models import JobEvent, TrainingJob
from runtime.config import DataSpec, JobConfig
from tests.controlplane.api_helpers import make_team_world
from tests.orchestration.conftest import moto_server  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db

MLP = {"model": {"kind": "mlp", "n_layer": 2, "n_embd": 16}, "global_batch": 32}
GPT = {"model": {"kind": "gpt", "n_layer": 2, "n_embd": 32, "n_head": 2, "seq_len": 16, "vocab_size": 256},
       "global_batch": 8}
BUCKET = "spotpipe-h18-corpus"


@pytest.fixture
def world():
    return make_team_world()


def _submit(world, config):
    payload = {"name": "data", "strategy": "recycle", "target_steps": 20, "config": config,
               "deadline": (timezone.now() + timedelta(hours=1)).isoformat()}
    return world.member_client.post("/api/v1/jobs/", payload, format="json")


def _notes(job_id: int) -> list[str]:
    return JobEvent.objects.get(job_id=job_id, kind="submitted").data.get("data_checks", [])


@pytest.fixture
def no_aws_credentials(monkeypatch, tmp_path):
    """boto3's default chain finds nothing: no variables, no files, no instance metadata."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                 "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def s3(moto_server, monkeypatch, settings):  # noqa: F811
    """The control plane's S3 is moto's server, with credentials in the environment; a bucket with a
    corpus under `corpus/` and a tokenizer."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    settings.SPOTPIPE_S3_ENDPOINT_URL = moto_server
    settings.SPOTPIPE_DATA_S3_CHECK = True
    client = boto3.client("s3", region_name="us-east-1", endpoint_url=moto_server,
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    if BUCKET not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
        client.create_bucket(Bucket=BUCKET)
        client.put_object(Bucket=BUCKET, Key="corpus/part-000.txt", Body=b"to be or not to be\n")
        client.put_object(Bucket=BUCKET, Key="tok/tokenizer.json", Body=b"{}")
        client.create_bucket(Bucket=f"{BUCKET}-empty")
    return client


# --- the contract: syntax, all problems at once, nothing written ---------------------------------------


@pytest.mark.parametrize(
    ("data", "extra", "field"),
    [
        ({"source": "csv:/data/x.csv"}, {}, "config.data.source"),
        ({"source": "text:https://example.com/corpus"}, {}, "config.data.source"),
        ({"source": "text:"}, {}, "config.data.source"),
        ({"source": "tokens:/data/d?dtype=int8"}, {}, "config.data.source"),
        ({"source": "jsonl:/data/*.jsonl?column=body"}, {}, "config.data.source"),
        ({"source": "text:s3://No_Such_Bucket/x"}, {}, "config.data.source"),
        ({"source": "py:not a module"}, {}, "config.data.source"),
        ({"source": "text:/c", "tokenizer": "https://hf.co/tokenizer.json"}, {}, "config.data.tokenizer"),
        ({"source": "text:/c", "val_fraction": 1.5}, {}, "config.data.val_fraction"),
        ({"source": "text:/c", "val_batches": 0}, {}, "config.data.val_batches"),
        ({"source": "text:/c", "sorce": "x"}, {}, "config.data.sorce"),
        ({}, {"val_every": -1}, "config.val_every"),
        ({}, {"val_every": 10}, "config.val_every"),  # validation needs a data source
    ],
)
def test_a_bad_data_spec_is_refused_naming_the_field(world, data, extra, field):
    response = _submit(world, {**MLP, "data": data, **extra})
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"], response.json()
    assert not TrainingJob.objects.filter(name="data").exists()


def test_every_data_problem_is_reported_at_once(world):
    config = {**GPT, "model": {**GPT["model"], "vocab_size": 64}, "val_every": -2,
              "data": {"source": "text:ftp://x/y", "tokenizer": " spaced", "val_batches": 0}}
    errors = _submit(world, config).json()["errors"]
    assert {"config.data.source", "config.data.tokenizer", "config.data.val_batches", "config.val_every"} <= set(errors)
    response = _submit(world, {**GPT, "model": {**GPT["model"], "vocab_size": 64}, "data": {"source": "text:/c"}})
    assert "config.model.vocab_size" in response.json()["errors"]  # the byte tokenizer needs 256 ids
    assert not TrainingJob.objects.filter(name="data").exists()


def test_the_data_spec_is_stored_as_the_runtimes_and_what_was_not_checked_is_said(world):
    config = {**GPT, "val_every": 5,
              "data": {"source": "jsonl:/data/*.jsonl?field=body", "tokenizer": "/models/tok.json", "val_batches": 2}}
    response = _submit(world, config)
    assert response.status_code == 201, response.content
    job = TrainingJob.objects.get(pk=response.json()["id"])
    stored = JobConfig.from_dict(job.config)  # what every node's worker gets, unchanged
    assert stored.val_every == 5
    assert (stored.data.source, stored.data.tokenizer, stored.data.val_batches) == (
        "jsonl:/data/*.jsonl?field=body", "/models/tok.json", 2)
    assert stored.data.val_fraction == DataSpec().val_fraction  # the runtime's default
    notes = _notes(job.pk)
    assert any("/data/*.jsonl" in n and "nodes' disks" in n for n in notes), notes
    assert any("/models/tok.json" in n and "nodes' disks" in n for n in notes), notes
    # Synthetic data (no source) is still the default, with nothing to say.
    plain = _submit(world, MLP).json()
    assert JobConfig.from_dict(TrainingJob.objects.get(pk=plain["id"]).config).data == DataSpec()
    assert _notes(plain["id"]) == []


def test_a_py_source_is_never_imported_by_the_control_plane(world, tmp_path: Path, monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "h18_user_dataset.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\ndef build():\n    raise SystemExit('ran user code')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    response = _submit(world, {**MLP, "data": {"source": "py:h18_user_dataset:build"}})
    assert response.status_code == 201, response.content
    assert "h18_user_dataset" not in sys.modules and not marker.exists()
    assert any("user code" in n for n in _notes(response.json()["id"]))


MEASURES = [{"parameters": 4096 + 64, "forward_flops": 8192.0 * 64, "activation_bytes": 256.0 * 4,
             "output_bytes": 256.0, "kernels": 3, "input_grad": i > 0} for i in range(4)]
"""Four layers of a model function as `spotpipe submit` records them (per sample, `LayerMeasure`)."""


def test_a_model_function_is_never_imported_and_is_auto_planned_from_its_measures(world, tmp_path: Path,
                                                                                   monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "h19_user_model.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\ndef net():\n    raise SystemExit('ran user code')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    model = {"kind": "py", "path": "h19_user_model:net", "args": {"width": 8}, "layers": 4}
    payload = {"name": "mine", "strategy": "recycle", "target_steps": 20, "config": {"model": model},
               "deadline": (timezone.now() + timedelta(hours=1)).isoformat()}
    # Without its measures the first node profiles it (tests/controlplane/test_profile_first.py).
    auto = world.member_client.post("/api/v1/jobs/", {**payload, "plan": {"auto": True}}, format="json")
    assert auto.status_code == 201, auto.content
    assert auto.json()["plan"]["profile"] == "pending" and auto.json()["plan"]["nodes"] == 1
    measured = {**payload, "config": {"model": {**model, "layer_measures": MEASURES}}}
    planned = world.member_client.post("/api/v1/jobs/", {**measured, "plan": {"auto": True}}, format="json")
    assert planned.status_code == 201, planned.content
    plan = planned.json()["plan"]
    assert plan["chosen_by"] == "planner" and plan["predicted"]["hours"] > 0 and plan["predicted"]["cost_usd"] > 0
    stored = JobConfig.from_dict(TrainingJob.objects.get(pk=planned.json()["id"]).config)
    assert (stored.dp, stored.pp) == (plan["dp"], plan["pp"]) and len(stored.layer_costs) == 4
    # The same feasibility rules as a preset: a deadline no plan meets names the fastest plan.
    late = world.member_client.post("/api/v1/jobs/", {**measured, "target_steps": 10**6,
                                                      "plan": {"auto": True, "max_nodes": 2},
                                                      "deadline": (timezone.now() + timedelta(seconds=1)).isoformat()},
                                    format="json")
    assert late.status_code == 400, late.content
    assert "the fastest plan" in late.json()["errors"]["deadline"][0]
    # An explicit plan with a deadline is judged from the start, as a preset's is.
    explicit_measured = world.member_client.post("/api/v1/jobs/", {**measured, "plan": {"dp": 2, "pp": 2}},
                                                 format="json")
    assert explicit_measured.status_code == 201, explicit_measured.content
    assert explicit_measured.json()["plan"]["predicted"]["hours"] > 0
    explicit = world.member_client.post("/api/v1/jobs/", {**payload, "plan": {"dp": 2, "pp": 2}}, format="json")
    assert explicit.status_code == 201, explicit.content
    assert explicit.json()["config"]["model"]["path"] == "h19_user_model:net"
    unvalidated = world.member_client.post(
        "/api/v1/jobs/", {**payload, "config": {"model": {**model, "layers": 0}}, "plan": {"dp": 2, "pp": 2}},
        format="json")
    assert unvalidated.status_code == 400, unvalidated.content
    assert "spotpipe submit" in str(unvalidated.json()["errors"]["config.model.layers"])
    # On token data its context and vocabulary must be declared (spotpipe submit records them): a
    # 400 naming both, nothing stored, never the GPT's defaults.
    count = TrainingJob.objects.count()
    text = {**payload, "config": {"model": model, "data": {"source": "text:/srv/corpus.txt"}},
            "plan": {"dp": 2, "pp": 2}}
    undeclared = world.member_client.post("/api/v1/jobs/", text, format="json")
    assert undeclared.status_code == 400, undeclared.content
    assert {"config.model.seq_len", "config.model.vocab_size"} <= set(undeclared.json()["errors"])
    assert TrainingJob.objects.count() == count
    declared = {**text, "config": {**text["config"], "model": {**model, "seq_len": 32, "vocab_size": 256}}}
    accepted = world.member_client.post("/api/v1/jobs/", declared, format="json")
    assert accepted.status_code == 201, accepted.content
    shown = accepted.json()["config"]["model"]
    assert (shown["seq_len"], shown["vocab_size"]) == (32, 256) and "n_embd" not in shown  # its kind's fields only
    assert "h19_user_model" not in sys.modules and not marker.exists()


@pytest.mark.parametrize(("measures", "field", "message"), [
    (MEASURES[:3], "config.model.layer_measures", "has 3 entries; expected model.layers=4"),
    ([{**m, "parameters": 0} for m in MEASURES], "config.model.layer_measures", "no layer holds parameters"),
    ([{**MEASURES[0], "forward_flops": -1.0}, *MEASURES[1:]], "config.model.layer_measures[0].forward_flops",
     "must be >= 0"),
    ([{**MEASURES[0], "parameters": "many"}, *MEASURES[1:]], "config.model.layer_measures[0].parameters",
     "must be an integer"),
    ([{**MEASURES[0], "weight": 1}, *MEASURES[1:]], "config.model.layer_measures[0].weight", "unknown field"),
    ([1, 2, 3, 4], "config.model.layer_measures[0]", "must be an object"),
    ("x", "config.model.layer_measures", "must be a list of per-layer measures"),
])
def test_bad_layer_measures_are_a_400_naming_the_field_and_nothing_is_stored(world, measures, field, message):
    model = {"kind": "py", "path": "h19_user_model:net", "layers": 4, "layer_measures": measures}
    before = TrainingJob.objects.count()
    body = {"name": "mine", "strategy": "recycle", "target_steps": 20, "config": {"model": model},
            "plan": {"auto": True}, "deadline": (timezone.now() + timedelta(hours=1)).isoformat()}
    response = world.member_client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400, response.content
    assert message in " ".join(response.json()["errors"].get(field, [])), response.json()
    assert TrainingJob.objects.count() == before


# --- S3: looked up with the control plane's credentials -----------------------------------------------


def test_an_s3_source_and_tokenizer_that_exist_are_accepted(world, s3):
    config = {**GPT, "data": {"source": f"text:s3://{BUCKET}/corpus/",
                              "tokenizer": f"s3://{BUCKET}/tok/tokenizer.json"}}
    response = _submit(world, config)
    assert response.status_code == 201, response.content
    notes = _notes(response.json()["id"])
    assert f"s3://{BUCKET}/corpus/ checked on s3" in notes
    assert f"s3://{BUCKET}/tok/tokenizer.json checked on s3" in notes
    # A glob is listed up to its first wildcard.
    assert _submit(world, {**GPT, "data": {"source": f"text:s3://{BUCKET}/corpus/part-*.txt"}}).status_code == 201


def test_missing_s3_data_is_a_400_naming_each_field_and_nothing_is_stored(world, s3):
    config = {**GPT, "data": {"source": f"text:s3://{BUCKET}-gone/corpus/",
                              "tokenizer": f"s3://{BUCKET}/tok/missing.json"}}
    response = _submit(world, config)
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert "no such bucket" in errors["config.data.source"][0] and f"{BUCKET}-gone" in errors["config.data.source"][0]
    assert "no such object" in errors["config.data.tokenizer"][0]
    empty = _submit(world, {**GPT, "data": {"source": f"text:s3://{BUCKET}-empty/corpus/"}}).json()["errors"]
    assert "holds no object under 'corpus/'" in empty["config.data.source"][0]
    nothing = _submit(world, {**GPT, "data": {"source": f"text:s3://{BUCKET}/other/"}}).json()["errors"]
    assert "config.data.source" in nothing
    prefix = _submit(world, {**GPT, "data": {"source": "text:/c", "tokenizer": f"s3://{BUCKET}/tok/"}}).json()
    assert "not a prefix" in prefix["errors"]["config.data.tokenizer"][0]
    assert not TrainingJob.objects.filter(name="data").exists()


def test_without_aws_credentials_s3_is_not_checked_and_the_job_says_so(world, settings, no_aws_credentials):
    settings.SPOTPIPE_S3_ENDPOINT_URL = "http://127.0.0.1:9"  # would refuse a connection if asked
    response = _submit(world, {**GPT, "data": {"source": f"text:s3://{BUCKET}-gone/corpus/"}})
    assert response.status_code == 201, response.content
    assert "s3 not checked: the control plane has no AWS credentials" in _notes(response.json()["id"])


def test_s3_out_of_reach_or_switched_off_does_not_refuse_a_job(world, settings, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    settings.SPOTPIPE_S3_ENDPOINT_URL = "http://127.0.0.1:9"  # nothing listens: a connection error
    response = _submit(world, {**GPT, "data": {"source": f"text:s3://{BUCKET}/corpus/"}})
    assert response.status_code == 201, response.content
    assert any("s3 did not answer" in n for n in _notes(response.json()["id"]))
    settings.SPOTPIPE_DATA_S3_CHECK = False
    response = _submit(world, {**GPT, "data": {"source": f"text:s3://{BUCKET}/corpus/"}})
    assert "s3 not checked: SPOTPIPE_DATA_S3_CHECK is off" in _notes(response.json()["id"])


def test_s3_answers_are_read_as_missing_denied_or_unknown():
    from botocore.exceptions import ClientError

    def error(code: str) -> ClientError:
        return ClientError({"Error": {"Code": code, "Message": code}}, "ListObjectsV2")

    assert "no such bucket" in _s3_problem("ListObjectsV2", error("NoSuchBucket"), "s3://b/p")
    assert "no such object" in _s3_problem("HeadObject", error("404"), "s3://b/k")
    denied = _s3_problem("ListObjectsV2", error("AccessDenied"), "s3://b/p")
    assert "may not read it" in denied and "SPOTPIPE_DATA_S3_CHECK=false" in denied
    for code in ("SlowDown", "InternalError", "503"):
        assert _s3_problem("ListObjectsV2", error(code), "s3://b/p") is None  # S3 away: not the job's fault


JOB_FILE = """
name = "gpt-on-text"
strategy = "recycle"
target_steps = 2000
deadline = "6h"

[config]
global_batch = 64
val_every = 100                 # the validation loss every 100 steps (and after the last)
[config.model]
kind = "gpt"
n_layer = 4
n_embd = 128
n_head = 4
seq_len = 128
vocab_size = 256                # the byte tokenizer's 256 ids
[config.data]
source = "text:s3://my-team-data/corpus/"   # FORMAT:LOCATION[?options]
tokenizer = "byte"              # or the path / s3:// URI of a tokenizer.json
val_fraction = 0.05             # held out from the end when the source has no validation split
val_batches = 4
"""


def test_a_job_file_with_config_data_is_the_apis_body(world, tmp_path: Path, no_aws_credentials):
    """The `[config.data]` example of docs/client.md, sent as `spotpipe submit` sends it."""
    from spotpipe.jobfile import load_job_file

    path = tmp_path / "gpt-on-text.toml"
    path.write_text(JOB_FILE)
    body = load_job_file(path)
    response = world.member_client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    config = JobConfig.from_dict(TrainingJob.objects.get(pk=response.json()["id"]).config)
    assert config.val_every == 100
    assert config.data == DataSpec(source="text:s3://my-team-data/corpus/", tokenizer="byte", val_fraction=0.05,
                                   val_batches=4)
