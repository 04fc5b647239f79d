"""Pipeline parallelism splits the training state (issue 19): each rank holds only its own layers'
parameters and AdamW moments. A model whose whole state exceeds a per-rank budget trains at pp=4
with every rank under it, and the ranks' shares add up to the whole model."""

from __future__ import annotations

import pytest

from runtime.config import JobConfig, ModelSpec
from runtime.models.model import build_layer
from runtime.strategies import initial_layout
from runtime.train.launcher import run_local

MODEL = ModelSpec(kind="gpt", n_layer=6, n_embd=128, n_head=4, seq_len=16, vocab_size=4096)
"""2.2M parameters: 26.8 MB of float32 parameters + two AdamW moments; embedding and head 6.3 MB each."""
BUDGET = 12 * 10**6
"""Bytes of parameters + optimizer state a rank may hold: under half of the whole model's."""


def model_state_bytes(spec: ModelSpec) -> int:
    """Parameters + two AdamW moments of the whole model, float32, from shapes (meta device)."""
    import torch

    with torch.device("meta"):
        numel = sum(p.numel() for i in range(spec.num_layers) for p in build_layer(spec, i, 0).parameters())
    return 3 * 4 * numel


@pytest.mark.runtime
@pytest.mark.timeout(90)
def test_each_rank_holds_only_its_stage() -> None:
    config = JobConfig(model=MODEL, dp=1, pp=4, microbatches=2, global_batch=4, steps=2, strategy="none",
                       op_timeout_s=4.0, heartbeat_timeout_s=8.0)
    whole = model_state_bytes(MODEL)
    assert whole > 2 * BUDGET  # the whole model would not fit one rank's budget
    result = run_local(config, timeout_s=80)
    assert all(code == 0 for code in result.exit_codes.values()), result.exit_codes
    held = {r["node"]: r for r in result.records if r.get("event") == "held_state"}
    stages = initial_layout(config).stages
    assert sorted(held) == [0, 1, 2, 3]
    for node, record in held.items():
        assert record["layers"] == list(range(*stages[node]))  # its own stage's layers, no other
        state = record["param_bytes"] + record["optimizer_bytes"]
        assert 0 < state <= BUDGET, (node, state)
        assert record["optimizer_bytes"] == 2 * record["param_bytes"]  # float32 moments, as the parameters
        assert record["snapshot_bytes"] == 0  # strategy none keeps no rollback copy
        assert record["peak_rss_bytes"] > 0  # reported (not asserted on: it counts the whole runtime)
    assert sum(r["param_bytes"] + r["optimizer_bytes"] for r in held.values()) == whole
