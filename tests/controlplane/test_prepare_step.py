"""A job's prepare step on its nodes (`config.data.prepare`, issue 41): no generation starts while it
runs; each running node, told `prepare`, claims a share of the source's files
(`POST /api/v1/agents/prepare/claim/`) and reports it (`.../prepare/done/`); a lost node's share goes
to the next node that asks; after the last share the job trains on `shards:` of the location and its
first generation starts. Bad reports are 400s naming the field and change nothing; a report for a
share another node holds now is a 409; bad data fails the job once. The node's side (the agent running
`runtime.data.prepare_share`) is tests/orchestration/test_prepare_on_nodes.py."""

from __future__ import annotations

import pytest

from controlplane.fleet.models import Instance
from controlplane.fleet.states import InstanceState
from controlplane.jobs.models import JobEvent, JobGeneration, JobStatus, PrepareShare
from controlplane.orchestration.services import job_grow
from spotpipe.commands import describe_prepare
from tests.controlplane.api_helpers import make_api_token, make_team_world, token_client
from tests.controlplane.factories import DEFAULT_CONFIG, make_instance, make_job

pytestmark = pytest.mark.django_db

SOURCE, OUT = "text:/data/corpus", "/data/prepared"


def _job(world, nodes: int):
    config = {**DEFAULT_CONFIG, "model": {**DEFAULT_CONFIG["model"], "vocab_size": 256}, "global_batch": 24,
              "data": {"source": SOURCE, "prepare": OUT}}
    return make_job(world.team, config=config, plan={"dp": nodes, "pp": 1})


def _agents(world, job, count: int) -> list:
    return [token_client(make_api_token(world.team, instance=make_instance(world.team, job=job, state="running")))
            for _ in range(count)]


def _claim(agent) -> dict:
    answer = agent.post("/api/v1/agents/prepare/claim/", {}, format="json")
    assert answer.status_code == 200, answer.content
    return answer.json()


def _done(agent, share: int, of: int, *, index_written: bool = False):
    return agent.post("/api/v1/agents/prepare/done/", {"share": share, "of": of, "index_written": index_written,
                                                       "files": 2, "input_bytes": 2000, "seconds": 0.5},
                      format="json")


@pytest.fixture
def world():
    return make_team_world()


def test_no_generation_starts_while_the_nodes_are_told_to_prepare(world):
    job = _job(world, 3)
    agents = _agents(world, job, 3)
    assert job_grow(job=job) is None and not JobGeneration.objects.filter(job=job).exists()
    command = agents[0].get("/api/v1/agents/commands/", {"version": "", "wait": 0}).json()
    assert command["action"] == "prepare" and command["job"]["config"]["data"]["prepare"] == OUT
    detail = world.member_client.get(f"/api/v1/jobs/{job.pk}/").json()
    assert detail["prepare"] == {"out": OUT, "shares": 0, "done": 0, "running": 0}
    assert "waiting for the first node" in describe_prepare(detail["prepare"])  # what `spotpipe status` says


def test_each_node_prepares_a_share_and_the_last_report_starts_training(world, monkeypatch):
    monkeypatch.setenv("SPOTPIPE_RENDEZVOUS", "none")  # no store to start: the first generation follows at once
    job = _job(world, 3)
    agents = _agents(world, job, 3)
    claims = [_claim(agent) for agent in agents]
    assert [(c["state"], c["share"], c["of"]) for c in claims] == [("assigned", k, 3) for k in range(3)]
    assert claims[0]["source"] == SOURCE and claims[0]["out"] == OUT and claims[0]["tokenizer"] == "byte"
    assert _claim(agents[0])["share"] == 0  # asked again (an agent restarted): the share it holds
    assert _done(agents[0], 0, 3).status_code == 202
    assert _done(agents[0], 0, 3).status_code == 202  # a retried report is recorded once
    assert _done(agents[1], 1, 3).status_code == 202
    detail = world.member_client.get(f"/api/v1/jobs/{job.pk}/").json()
    assert detail["prepare"] == {"out": OUT, "shares": 3, "done": 2, "running": 1}
    assert "2/3 shares done" in describe_prepare(detail["prepare"])
    assert not JobGeneration.objects.filter(job=job).exists()
    assert _done(agents[2], 2, 3, index_written=True).status_code == 202
    job.refresh_from_db()
    assert job.config["data"]["source"] == f"shards:{OUT}" and job.config["data"]["prepare"] == ""
    prepared = JobEvent.objects.get(job=job, kind="prepared")
    assert prepared.data["files"] == 6 and prepared.data["shares"] == 3 and SOURCE in prepared.message
    assert JobEvent.objects.filter(job=job, kind="prepare_share_done").count() == 3
    assert JobGeneration.objects.filter(job=job).count() == 1  # its three nodes run: the first generation
    assert agents[0].get("/api/v1/agents/commands/", {"version": "", "wait": 0}).json()["action"] == "run"
    assert _claim(agents[1])["state"] == "prepared"
    assert world.member_client.get(f"/api/v1/jobs/{job.pk}/").json()["prepare"] is None


def test_a_lost_nodes_share_goes_to_the_next_node_that_asks(world):
    job = _job(world, 2)
    first, second = _agents(world, job, 2)
    assert (_claim(first)["share"], _claim(second)["share"]) == (0, 1)
    third = _agents(world, job, 1)[0]
    assert _claim(third) == {"state": "waiting", "share": None, "of": None, "source": "", "tokenizer": "",
                             "out": OUT}
    lost = PrepareShare.objects.get(job=job, number=0).instance_id
    Instance.objects.filter(pk=lost).update(state=InstanceState.TERMINATED)
    assert _done(second, 1, 2).status_code == 202
    retaken = _claim(second)
    assert (retaken["state"], retaken["share"]) == ("assigned", 0)
    assert PrepareShare.objects.get(job=job, number=0).attempts == 2
    late = _done(first, 0, 2, index_written=True)  # the lost node's report, too late
    assert late.status_code == 409
    assert _done(second, 0, 2, index_written=True).status_code == 202
    job.refresh_from_db()
    assert job.config["data"]["source"] == f"shards:{OUT}"
    claimed = JobEvent.objects.filter(job=job, kind="prepare_share_claimed").values_list("data", flat=True)
    assert sorted(d["share"] for d in claimed) == [0, 0, 1]


@pytest.mark.parametrize("body,field", [
    ({"share": 5, "of": 2, "index_written": True}, "share"),
    ({"share": 1, "of": 3, "index_written": True}, "share"),
    ({"share": -1, "of": 2, "index_written": True}, "share"),
    ({"share": "one", "of": 2, "index_written": True}, "share"),
    ({"share": 0, "of": 2}, "index_written"),
    ({"share": 0, "of": 2, "index_written": True, "files": "\u0000"}, "files"),
    ({"share": 0, "of": 2, "index_written": True, "seconds": -1}, "seconds"),
])
def test_a_report_that_is_not_a_share_of_the_step_is_a_400_naming_the_field(world, body, field):
    job = _job(world, 2)
    agent = _agents(world, job, 1)[0]
    assert _claim(agent)["share"] == 0
    before = list(PrepareShare.objects.filter(job=job).values())
    answer = agent.post("/api/v1/agents/prepare/done/", body, format="json")
    assert answer.status_code == 400, answer.content
    assert field in answer.json()["errors"], answer.json()
    assert list(PrepareShare.objects.filter(job=job).values()) == before
    assert not JobEvent.objects.filter(job=job, kind="prepare_share_done").exists()


def test_data_a_node_cannot_prepare_fails_the_job_once(world):
    job = _job(world, 2)
    agents = _agents(world, job, 2)
    for agent in agents:
        answer = agent.post("/api/v1/agents/events/", {"kind": "prepare_failed",
                                                       "message": "text:/data/corpus matches no file"}, format="json")
        assert answer.status_code == 202, answer.content
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and job.end_reason == "config_error"
    assert JobEvent.objects.filter(job=job, message__contains="could not be prepared: text:/data/corpus").count() == 1


def test_every_share_done_without_an_index_fails_the_job(world):
    job = _job(world, 1)
    agent = _agents(world, job, 1)[0]
    assert _claim(agent)["share"] == 0
    assert _done(agent, 0, 1, index_written=False).status_code == 202
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and "none wrote /data/prepared/index.json" in job.status_message


@pytest.mark.parametrize("data,expected", [
    ({"source": "tokens:/data/train.bin", "prepare": OUT}, "only text, jsonl, hf, wds, mds sources"),
    ({"prepare": OUT}, "needs a data.source"),
    ({"source": SOURCE, "prepare": "ftp://host/x"}, "expected a folder or an s3://bucket/prefix/"),
    # Hostile values, refused before anything is stored (PostgreSQL refuses a NUL in JSON).
    ({"source": SOURCE, "prepare": "/data/\u0000x"}, "NUL"),
    ({"source": SOURCE, "prepare": "/d" + "x" * 20_000}, "at most 1,000 characters"),
    ({"source": SOURCE, "prepare": {"a": {"b": [[["x"]]]}}}, "must be a string"),
    ({"source": SOURCE, "prepare": 7}, "must be a string"),
])
def test_a_bad_prepare_field_is_a_400_at_submission(world, data, expected):
    payload = {"name": "bad-prepare", "strategy": "recycle", "target_steps": 10, "budget_usd": "5.00",
               "config": {**DEFAULT_CONFIG, "model": {**DEFAULT_CONFIG["model"], "vocab_size": 256}, "data": data},
               "plan": {"dp": 1, "pp": 1}}
    answer = world.member_client.post("/api/v1/jobs/", payload, format="json")
    assert answer.status_code == 400, answer.content
    assert expected in str(answer.json()["errors"]["config.data.prepare"])


def test_the_job_page_says_how_far_the_prepare_step_is(world):
    job = _job(world, 2)
    agent = _agents(world, job, 1)[0]
    assert _claim(agent)["share"] == 0 and _done(agent, 0, 2).status_code == 202
    page = token_client()
    page.force_login(world.member)
    html = page.get(f"/jobs/{job.pk}/").content.decode()
    assert f"Preparing the data into {OUT} first:" in html and "1/2 shares done, 0 being prepared" in html
