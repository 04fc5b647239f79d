"""End to end on this machine: the control plane (live server), a real Celery worker on the
configured broker (Redis when REDIS_URL is set), the local provider's 4 node agents running the
torch runtime (DP=2 x PP=2). One node gets a notice and leaves gracefully, another is killed with
no notice; the job keeps training, replacements join, the job finishes, and its final parameters
equal the failure-free single-process run of the same seed."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from controlplane.fleet.models import Instance, InterruptionNotice
from controlplane.jobs.models import JobGeneration, JobStatus, Reconfiguration, TrainingJob
from controlplane.orchestration import tasks
from controlplane.orchestration.models import Acquisition, Rendezvous
from controlplane.orchestration.providers import set_provider
from controlplane.orchestration.providers.local.provider import LocalProvider, pid_alive
from runtime.config import JobConfig
from runtime.train.reference import train_reference
from tests.controlplane.factories import make_job, make_team
from tests.orchestration.test_tasks_worker import retrying, worker  # noqa: F401 - the fixture

# Long enough that a replacement joins before the job ends even when starting one (a node process,
# its agent, a worker importing torch) is slow: steps are paced by emulated device time, start-up
# is CPU work that a loaded host slows down. With 150 the replacement joined at step 46, 8 s before
# the end, on a host at load 4 (CI, 2026-11-27 17:12 UTC); with 250, at step 58 and 16 s before the end
# (load 4.8, 17:19 UTC).
STEPS = 250


STORY: list = []


def _story() -> str:
    """The job's timeline and instances, for a failure message."""
    if not STORY:
        return ""
    job = TrainingJob.objects.get(pk=STORY[0])
    lines = [f"job {job.pk} {job.status} steps {job.steps_done}/{job.target_steps} gen {job.current_generation}"]
    lines += [f"  {e.at:%H:%M:%S.%f} {e.kind}: {e.message}" for e in job.events.order_by("at", "id")]
    lines += [f"  instance {i.pk} {i.provider_instance_id} {i.state}" for i in Instance.objects.filter(job=job)]
    lines += [f"  acquisition {a.request_token} {a.status} {a.error[:200]}"
              for a in Acquisition.objects.filter(job=job)]
    lines += [f"  rendezvous {r.address} pid {r.pid} released {r.released_at}"
              for r in Rendezvous.objects.filter(job=job)]
    lines += [f"  reconfiguration {r.trigger} {r.trigger_key} {r.status} {r.decision} -> {r.to_generation}"
              for r in Reconfiguration.objects.filter(job=job)]
    return "\n".join(lines)


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = retrying(predicate)
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{retrying(_story)}")


class Beat(threading.Thread):
    """What celery beat does in production (controlplane/beat.py), at the same periods."""

    def __init__(self) -> None:
        super().__init__(name="beat", daemon=True)
        self.stop = threading.Event()

    def run(self) -> None:
        ticks = 0
        from controlplane.orchestration.tasks import sweep_notices

        while not self.stop.wait(0.5):
            tasks.detect_dead_agents.delay()
            ticks += 1
            if ticks % 6 == 0:
                tasks.reconcile_all.delay()
            if ticks % 10 == 0:
                sweep_notices.delay()


def _final_params(root: Path) -> dict[str, list[torch.Tensor]]:
    copies: dict[str, list[torch.Tensor]] = {}
    for path in sorted(root.glob("*/work/out/node-*.pt")):
        for name, tensor in torch.load(path)["params"].items():
            copies.setdefault(name, []).append(tensor)
    return copies


def assert_reference_math(job: TrainingJob, nodes_dir: Path) -> None:
    """Every parameter the finished nodes saved equals the failure-free single-process run of the
    job's seed bit for bit (`runtime.distributed.grad_order`), and together they hold the model."""
    config = JobConfig.from_dict(job.config)  # what the agents handed to their workers
    reference, _ = train_reference(config)
    copies = _final_params(nodes_dir)
    assert set(copies) == set(reference), "the finished nodes do not hold the whole model"
    for name, expected in reference.items():
        for copy in copies[name]:
            torch.testing.assert_close(copy, expected, rtol=0, atol=0, msg=lambda m, n=name: f"{n}: {m}")


def _node_of(job: TrainingJob, pipeline: int, stage: int) -> Instance:
    generation = JobGeneration.objects.get(job=job, number=1)
    member = next(m for m in generation.membership if (m["pipeline"], m["stage"]) == (pipeline, stage))
    return Instance.objects.get(pk=member["instance"])


def run_scenario(*, strategy: str, server, tmp_path: Path, monkeypatch, runtime: dict) -> None:
    nodes_dir = tmp_path / "nodes"
    provider = LocalProvider(nodes_dir, start_timeout_s=30)
    set_provider("local", provider)
    monkeypatch.setenv("SPOTPIPE_RENDEZVOUS", "process")
    monkeypatch.setenv("SPOTPIPE_PUBLIC_URL", server.url)
    # Not the 2 s default: on a loaded 2-core host a node starting up (a replacement importing torch)
    # can miss 2 s of heartbeats and be declared dead while it lives (as the hand-over tests saw);
    # this test times neither the detection nor the start-up.
    monkeypatch.setenv("SPOTPIPE_HEARTBEAT_TIMEOUT_S", "5.0")
    beat = Beat()
    job = None
    try:
        job = make_job(
            make_team(), strategy=strategy, target_steps=STEPS,
            config={"model": {"kind": "mlp", "n_layer": 2, "n_embd": 16}, "global_batch": 8,
                    "seed": 3, **runtime},
            plan={"dp": 2, "pp": 2, "microbatches": 2, "provider": "local"},
        )
        STORY[:] = [job.pk]
        tasks.acquire_capacity.delay(job.pk)
        beat.start()
        wait_for(lambda: JobGeneration.objects.filter(job=job, number=1).exists(), 60, "generation 1")
        wait_for(lambda: TrainingJob.objects.get(pk=job.pk).steps_done >= 10, 60, "training to start")

        # A notice, with several iterations of lead time: the node leaves at a step boundary.
        leaving = _node_of(job, 0, 1)
        # 12 s of notice, not 4: on a loaded 2-core machine the agent's poll, the hand-off and the
        # worker's drain took longer than 4 s once, the node died first and its leave was a death.
        provider.preempt(leaving.provider_instance_id, notice_s=12.0)
        wait_for(lambda: InterruptionNotice.objects.filter(provider_instance_id=leaving.provider_instance_id).exists(),
                 12, "the agent's notice")
        wait_for(lambda: Reconfiguration.objects.filter(job=job, instance=leaving, trigger="notice",
                                                        status="applied").exists(), 12, "the notice's reconfiguration")
        steps_at_notice = TrainingJob.objects.get(pk=job.pk).steps_done

        # A silent kill of another node: caught by the heartbeat timeout.
        victim = _node_of(job, 1, 0)
        provider.kill(victim.provider_instance_id)
        # Bounded, not timed: how fast a death is detected is `python -m bench reconfigure`'s figure
        # (a 4 s bound here failed at 4.06 s with the machine at load 29, with a 2 s heartbeat timeout).
        wait_for(lambda: Instance.objects.get(pk=victim.pk).state == "preempted", 20, "the death to be detected")

        # The job keeps training, replacements join, the job finishes.
        wait_for(lambda: TrainingJob.objects.get(pk=job.pk).steps_done > steps_at_notice + 5, 60, "training on")
        wait_for(lambda: Reconfiguration.objects.filter(job=job, trigger="join").exists(), 90, "a replacement")
        wait_for(lambda: TrainingJob.objects.get(pk=job.pk).status == JobStatus.FINISHED, 120, "the job to finish")
        wait_for(lambda: not Instance.objects.filter(job=job, state__in=["running", "pending", "notice"]).exists(),
                 30, "every node released")

        job.refresh_from_db()
        assert Acquisition.objects.filter(job=job, reason="replacement").exists()
        leaving.refresh_from_db()
        assert leaving.notice_at is not None and leaving.state in ("preempted", "terminated")
        kinds = set(job.events.values_list("kind", flat=True))
        assert {"acquisition", "acquired", "generation", "instance_interruption", "instance_lost",
                "job_finished", "released"} <= kinds
        assert_reference_math(job, nodes_dir)
    finally:
        beat.stop.set()
        stop_everything(provider, job)


def local_nodes(tmp_path: Path, monkeypatch, control_plane_url: str) -> LocalProvider:
    """The local provider the end-to-end runs buy nodes from, its nodes pointed at the live control
    plane (rendezvous store in a process of its own; a heartbeat timeout a loaded host keeps)."""
    provider = LocalProvider(tmp_path / "nodes", start_timeout_s=30)
    set_provider("local", provider)
    monkeypatch.setenv("SPOTPIPE_RENDEZVOUS", "process")
    monkeypatch.setenv("SPOTPIPE_PUBLIC_URL", control_plane_url)
    monkeypatch.setenv("SPOTPIPE_HEARTBEAT_TIMEOUT_S", "5.0")
    return provider


def stop_everything(provider: LocalProvider, job: TrainingJob | None) -> None:
    """End a local run: its nodes and its rendezvous store; fail if a process is left behind."""
    provider.terminate(provider.all_node_ids())
    if job is not None:
        from controlplane.orchestration.rendezvous import rendezvous_release

        retrying(rendezvous_release, job=job)
        row = retrying(Rendezvous.objects.filter(job=job).first)
        assert row is None or not row.pid or not pid_alive(row.pid), "the rendezvous store was left behind"
    set_provider("local", None)
    assert provider.live_pids() == [], "node processes were left behind"


@pytest.mark.integration
@pytest.mark.scenario
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(240)
def test_recycle_survives_a_notice_and_a_kill(control_plane, worker, tmp_path, monkeypatch):  # noqa: F811
    run_scenario(strategy="recycle", server=control_plane, tmp_path=tmp_path, monkeypatch=monkeypatch,
                 runtime={"op_timeout_s": 2.0, "schedule": "fiw",
                          "device_time": {"forward_ms": 4, "backward_input_ms": 4, "backward_weight_ms": 4}})


@pytest.mark.integration
@pytest.mark.scenario
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(240)
def test_checkpoint_survives_a_notice_and_a_kill(control_plane, worker, tmp_path, monkeypatch):  # noqa: F811
    run_scenario(strategy="checkpoint", server=control_plane, tmp_path=tmp_path, monkeypatch=monkeypatch,
                 runtime={"op_timeout_s": 2.0, "checkpoint_dir": str(tmp_path / "ckpt"), "checkpoint_interval": 10,
                          "device_time": {"forward_ms": 4, "backward_input_ms": 4, "backward_weight_ms": 4}})
