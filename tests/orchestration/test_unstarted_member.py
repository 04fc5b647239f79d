"""A member the control plane drops before its worker ever started (declared dead while its node was
still starting) must not hold the job at the rendezvous: the runtime counts a member as gone only
once its heartbeats stop, and this one never sent any."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from agent.worker_entry import _Watcher
from runtime.distributed.coordinator import Coordinator, serve
from runtime.train.reference import train_reference
from runtime.train.trainer import WorkerSpec, spec_json
from tests.orchestration.agent_commands import wire_generation
from tests.orchestration.conftest import wait_for
from tests.runtime.conftest import small_config

REPO = Path(__file__).resolve().parents[2]


def _generation(number: int, nodes: list[int]) -> str:
    return json.dumps(wire_generation(number, membership=[{"node": n} for n in nodes]))


class _CountedReads:
    """The control file as the watcher sees it (it only calls `read_text`), counting its reads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.reads = 0

    def read_text(self) -> str:
        text = self.path.read_text()
        self.reads += 1
        return text


@pytest.mark.timeout(30)
def test_watcher_marks_dead_only_dropped_members_that_never_started(tmp_path) -> None:
    coordinator = Coordinator(serve(0), "job-w")
    store = coordinator.store  # the job's keys
    store.set("hb/1", str(time.time()))  # node 1's worker started; node 3's never did
    control = tmp_path / "control.json"
    control.write_text(_generation(1, [0, 1, 2, 3]))
    reads = _CountedReads(control)
    watcher = _Watcher(reads, tmp_path / "notice", 0, coordinator)
    watcher.start()
    try:
        # Generation 1 must be what the watcher read first: a watcher whose first read is already
        # generation 2 has no earlier membership to drop anyone from. (A fixed 0.2 s pause was not
        # always enough for its thread to get there on a loaded machine.)
        assert wait_for(lambda: reads.reads >= 1)
        assert not store.check(["dead/3"]), "nothing is dropped yet"
        control.write_text(_generation(2, [0, 2, 4]))  # 1 and 3 dropped, 4 a replacement
        assert wait_for(lambda: store.check(["dead/3"]))
        time.sleep(0.2)
        assert not store.check(["dead/1"]), "a started member leaves by its own notice, it is not dead"
        assert not store.check(["notice/0"]), "this node is still a member"
    finally:
        watcher.done.set()
        watcher.join(timeout=5)


@pytest.mark.runtime
@pytest.mark.timeout(150)
def test_survivors_train_without_a_member_that_never_started_once_it_is_marked_dead(tmp_path) -> None:
    # Without the dead mark the survivors would wait at the rendezvous for its whole timeout (100 s)
    # and then fail; the test's own timeout would end first.
    config = small_config(strategy="recycle", schedule="fiw", steps=6, rendezvous_timeout_s=100.0)
    store = serve(0)
    procs = []
    try:
        for node in (0, 1, 2):  # node 3 of DP=2 x PP=2 never starts
            spec = WorkerSpec(job_id="job-u", node=node, rendezvous=f"127.0.0.1:{store.port}",
                              config=config.to_dict(), out_dir=str(tmp_path))
            procs.append(subprocess.Popen([sys.executable, "-m", "runtime.train.trainer", "--spec", spec_json(spec)],
                                          cwd=REPO, stdout=subprocess.PIPE, text=True))
        coordinator = Coordinator(store, "job-u")
        assert wait_for(lambda: all(coordinator.store.check([f"hb/{n}"]) for n in (0, 1, 2)), timeout_s=60)
        time.sleep(1.0)  # they are waiting for node 3 at the rendezvous
        coordinator.mark_dead(3)  # what the watcher does when the control plane drops it
        outs = [p.communicate(timeout=60)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert all(json.loads(out.splitlines()[-1])["outcome"] == "done" for out in outs)
    expected, _ = train_reference(config)
    copies = [torch.load(path, weights_only=True)["params"] for path in sorted(tmp_path.glob("node-*.pt"))]
    assert len(copies) == 3
    held = {name for copy in copies for name in copy}
    assert held == set(expected), "the survivors hold the whole model"
    for copy in copies:
        for name, tensor in copy.items():
            torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0)  # bit for bit (grad_order)
