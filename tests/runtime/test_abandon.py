"""A member that abandons a step releases its peers at once: it poisons what it owes and posts the
receives of what it is owed (gloo completes a peer's send only once its receive is posted, and the
abandoned group is parked with its sockets open, so without them that peer waited in `wait_sends`
for its full op timeout -- the intermittent 1.5 s extra after a kill)."""

from __future__ import annotations

import datetime
import os

import pytest
import torch
import torch.distributed as dist

from runtime.distributed.comm import Comm, PeerAborted
from runtime.models.model import build_layer
from runtime.parallel.schedule import ALL_REDUCE, RECV_GRAD, SEND_ACT, build_schedule
from runtime.strategies import initial_layout
from runtime.train.executor import Executor
from runtime.train.optim import LayerState, norm_needed
from tests.runtime.conftest import gloo_pair, small_config


class RecordingComm:
    """Stands in for `Comm`: records what an abandoning executor sends and drains."""

    def __init__(self) -> None:
        self.poisoned: list[tuple[int, int]] = []
        self.drained: list[tuple[int, int]] = []
        self.drained_reduces: list[tuple[int, tuple[int, ...]]] = []
        self.norms_poisoned = 0

    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        pass  # a real message sent before the failure

    def send_poison(self, like: torch.Tensor, dst: int, tag: int) -> None:
        self.poisoned.append((dst, tag))

    def drain(self, like: torch.Tensor, src: int, tag: int) -> None:
        self.drained.append((src, tag))

    def poison_allreduce(self, owners: tuple[int, ...], tag: int, run, replicas: tuple[int, ...] = ()) -> None:
        pass

    def abandon_allreduce(self, handle) -> None:
        pass

    def poison_norms(self, numel: int) -> None:
        self.norms_poisoned += 1

    def drain_allreduce(self, owners: tuple[int, ...], tag: int, run, replicas: tuple[int, ...] = ()) -> None:
        self.drained_reduces.append((tag, owners))


def _abandon_at(kind_of_failure: type[RuntimeError], index: int):
    config = small_config(dp=2, pp=2)
    layout = initial_layout(config)
    node = 0  # first stage of pipeline 0: receives gradients back from the last stage
    held = {i: LayerState(i, build_layer(config.model, i, config.seed)) for i in layout.layers_of(node)}
    comm = RecordingComm()
    executor = Executor(config, layout, node, held, comm)  # type: ignore[arg-type]
    actions = build_schedule(layout, "1f1b")[node]

    def hook(i: int, total: int) -> None:
        if i == index:
            raise kind_of_failure("peer failed")

    executor.hook = hook
    with pytest.raises(RuntimeError):
        executor.run_step(0, actions)
    return executor, actions, comm


def _tags(executor: Executor, actions, kind: str) -> list[tuple[int, int]]:
    out = []
    for act in actions:
        if act.kind == kind:
            _lo, hi = executor.layout.stages[act.stage]
            out.append((act.peer, executor._tag(act.microbatch, hi, kind == RECV_GRAD)))
    return out


def test_abandoning_a_step_drains_every_message_still_owed_to_it() -> None:
    executor, actions, comm = _abandon_at(RuntimeError, 0)
    assert _tags(executor, actions, RECV_GRAD), "the schedule has gradients to receive"
    assert sorted(comm.drained) == sorted(_tags(executor, actions, RECV_GRAD))
    assert sorted(comm.poisoned) == sorted(_tags(executor, actions, SEND_ACT))
    reduces = [a for a in actions if a.kind == ALL_REDUCE]
    assert [(tag, owners) for tag, owners in comm.drained_reduces] == [(a.layers[0], a.group) for a in reduces]
    # whoever waits for our part of the gradient-norm exchange (clip, skip_nonfinite) gives up too
    assert comm.norms_poisoned == int(norm_needed(executor.config))


def test_a_receive_that_got_the_poison_is_not_drained_again() -> None:
    config = small_config(dp=2, pp=2)
    actions = build_schedule(initial_layout(config), "1f1b")[0]
    first_grad = next(i for i, a in enumerate(actions) if a.kind == RECV_GRAD)
    executor, actions, comm = _abandon_at(PeerAborted, first_grad)  # as if this receive was poisoned
    expected = _tags(executor, actions[first_grad + 1 :], RECV_GRAD)
    assert sorted(comm.drained) == sorted(expected)


def _gloo_pair(rank: int, port: int, drain: bool, results) -> None:
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=20))
    comm = Comm(dist.PrefixStore("t", store), prefix="pg", node=rank, members=[0, 1], timeout_s=3.0)
    if rank == 1:  # finished its part of the step: sent, and waits for the send to complete
        comm.send(torch.ones(256), 0, 7)
        try:
            comm.wait_sends()
            results.put("completed")
        except RuntimeError as exc:
            results.put(f"failed: {exc}")
    else:  # abandons the step before receiving that message, with another receive still pending
        buf = torch.empty(4)
        comm.pending.append((False, comm._world().recv([buf], 1, 99), buf))
        if drain:
            comm.drain(torch.empty(256), 1, 7)
        assert comm.close() == 1  # parked: its sockets stay open
        store.wait(["finished"])
        os._exit(0)  # destroying the parked group would wait for the pending receive's timeout


@pytest.mark.runtime
@pytest.mark.parametrize("drain", [True, False])
def test_a_peers_send_completes_only_when_the_abandoning_member_drains(drain: bool) -> None:
    [outcome] = gloo_pair(_gloo_pair, drain)
    if drain:
        assert outcome == "completed"
    else:  # the gloo behaviour the drain exists for: the send waits for its timeout
        assert outcome.startswith("failed") and "Timed out" in outcome
