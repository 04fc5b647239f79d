"""How a generation ends.

- The first member's last commit: its sends of the step's total complete only once each member
  posted the receive, so a first member that ended its process at once reset the connection under
  a slower member, which never learnt that the last step committed (it regrouped alone and waited
  for replacements while the others had finished: an intermittent 80 s hang in CI).
  `Comm.settle_sends` holds the process until those sends completed.
- A generation waiting for replacements stops once the job is done or failed.
- Groups given up after failures are destroyed by `reap` instead of staying parked for good."""

from __future__ import annotations

import datetime
import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from runtime.distributed.comm import _COMMIT_TAG, _GRAVEYARD, Comm, reap
from runtime.distributed.coordinator import Coordinator, connect, serve
from runtime.distributed.generation_plan import GenerationPlan
from runtime.train.trainer import JobCannotContinue, Worker, WorkerSpec
from tests.runtime.conftest import gloo_pair, small_config


def _ended(pid: int) -> bool:
    """The process has exited (a zombie its parent has not reaped yet has closed its sockets too)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def _last_commit(rank: int, port: int, settled: bool, results) -> None:
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=20))
    comm = Comm(dist.PrefixStore("t", store), prefix="pg", node=rank, members=[0, 1], timeout_s=5.0)
    vector = torch.full((4,), float(rank + 1), dtype=torch.float64)
    if rank == 0:  # the first member: commits the last step and ends, as a finished worker does
        store.set("first_pid", str(os.getpid()))
        comm.commit(vector)
        if settled:
            results.put(("failed_sends", comm.settle_sends()))
            results.close()
            results.join_thread()  # os._exit skips the queue's flush
        comm.close()
        os._exit(0)
    # A slower member: its part is sent, and it posts the receive of the total a little later (a
    # busy machine), by which time the first member may be gone.
    comm.send(vector, 0, _COMMIT_TAG)
    comm.wait_sends()
    if settled:
        time.sleep(1.0)
    else:
        # Gone for sure, not after a fixed 1 s: on a loaded machine the first member could still be
        # alive then, and the total reached this member after all.
        first = int(store.get("first_pid"))
        deadline = time.monotonic() + 20
        while not _ended(first) and time.monotonic() < deadline:
            time.sleep(0.01)
    total = torch.empty_like(vector)
    try:
        comm.recv(total, 0, _COMMIT_TAG)
        results.put(("total", total.tolist()))
    except RuntimeError as exc:
        results.put(("failed", str(exc)))


@pytest.mark.runtime
@pytest.mark.parametrize("settled", [True, False])
def test_a_slow_member_gets_the_last_total_only_if_the_first_member_settles(settled: bool) -> None:
    outcomes = dict(gloo_pair(_last_commit, settled, answers=2 if settled else 1))
    if settled:
        assert outcomes["failed_sends"] == 0
        assert outcomes["total"] == [3.0] * 4  # 1 + 2: the member learns the last step committed
    else:  # the behaviour settle exists for: the member's read fails once the first member is gone
        assert "failed" in outcomes, outcomes


def _waiting_worker(tmp_path):
    store = serve(0)
    spec = WorkerSpec(
        job_id="job-waiting",
        node=2,
        rendezvous=f"127.0.0.1:{store.port}",
        config=small_config(strategy="checkpoint", checkpoint_dir=str(tmp_path), join_wait_s=60.0).to_dict(),
    )
    worker = Worker(spec)
    worker.coord = Coordinator(connect(spec.rendezvous), spec.job_id)
    # A generation with too few members for one pipeline: it holds until a replacement joins.
    plan = GenerationPlan(generation=2, slots=[[2, None], [None, None]], members=[2], waiting="1 of 4 members")
    return store, worker, plan


def test_a_generation_waiting_for_replacements_stops_once_the_others_finished_the_job(tmp_path) -> None:
    _store, worker, plan = _waiting_worker(tmp_path)  # `_store` hosts the job's keys while we run
    worker.coord.mark_done()
    started = time.monotonic()
    outcome, reason = worker._wait_for_joiners(plan)
    assert outcome == "failure" and "finished" in reason
    assert time.monotonic() - started < 5.0  # not the 60 s join wait
    assert worker.coord.is_done()  # and `run` then ends as `done_elsewhere` instead of regrouping


def test_a_generation_waiting_for_replacements_stops_once_the_job_failed(tmp_path) -> None:
    _store, worker, plan = _waiting_worker(tmp_path)  # `_store` hosts the job's keys while we run
    worker.coord.mark_failed("generation 3 cannot run: no holder of stage 0")
    with pytest.raises(JobCannotContinue, match="no holder of stage 0"):
        worker._wait_for_joiners(plan)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _abandoned_groups(rank: int, port: int, results) -> None:
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=20))
    before = _fds()
    for generation in range(6):
        comm = Comm(dist.PrefixStore(f"g{generation}", store), prefix="pg", node=rank, members=[0, 1], timeout_s=5.0)
        if rank == 0:  # a step given up: a message owed to us never came, one we owe never went
            comm.drain(torch.empty(4), 1, 7)
            comm.send(torch.ones(4), 1, 8)
        comm.close()
    if rank == 0:
        parked = len(_GRAVEYARD)
        with_parked = _fds()
        started = time.monotonic()
        left = reap(keep=2)
        results.put(
            {
                "parked": parked,
                "left": left,
                "reap_s": time.monotonic() - started,
                "fds_parked": with_parked - before,
                "fds_after": _fds() - before,
            }
        )
    else:
        store.wait(["finished"])


@pytest.mark.runtime
def test_reap_destroys_the_oldest_groups_given_up_after_failures() -> None:
    # A bound, not a measure (reap_s is): two spawned processes import torch and give up six
    # generations' calls on their 5 s timeouts; beside CPU-bound work that outran 60 s once in CI.
    [outcome] = gloo_pair(_abandoned_groups, timeout_s=180.0)
    assert outcome["parked"] == 6  # bury() alone never destroys them: their calls were never waited for
    assert outcome["left"] == 2
    assert outcome["fds_after"] < outcome["fds_parked"], outcome  # their sockets are closed
    assert outcome["reap_s"] < 5.0, outcome  # finished with short waits, not each call's timeout
