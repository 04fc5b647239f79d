"""Job configuration: the model spec and the training layout, validated before any process starts.

Configs are plain `kw_only`/`slots` dataclasses (torchtitan style) that round-trip through JSON, so
the node agent can hand them to `python -m runtime.worker --spec JSON` unchanged.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

STRATEGIES = ("none", "checkpoint", "bamboo", "recycle", "oobleck")
SCHEDULES = ("1f1b", "fiw")


class LayoutError(ValueError):
    """An impossible layout or configuration; the message names the value and what was expected."""


@dataclass(kw_only=True, slots=True)
class ModelSpec:
    """Which model to build. Both kinds are a list of layers: input layer, `n_layer` blocks, head."""

    kind: str = "mlp"
    """`gpt` (nanoGPT-style decoder) or `mlp` (tanh MLP classifier, for fast tests)."""
    n_layer: int = 4
    """Number of transformer blocks (gpt) or hidden layers (mlp); the model has n_layer + 2 layers."""
    n_embd: int = 32
    """Width: embedding size (gpt) or hidden size (mlp)."""
    n_head: int = 2
    """Attention heads (gpt only); must divide n_embd."""
    seq_len: int = 16
    """Sequence length in tokens (gpt only)."""
    vocab_size: int = 64
    """Vocabulary size (gpt) or number of classes (mlp)."""
    in_features: int = 16
    """Input features (mlp only)."""

    @property
    def num_layers(self) -> int:
        """Layers the partitioner can place: input layer + blocks + head."""
        return self.n_layer + 2

    def validate(self) -> None:
        """Raise `LayoutError` for a model that cannot be built."""
        if self.kind not in ("gpt", "mlp"):
            raise LayoutError(f"model kind {self.kind!r} is unknown; expected 'gpt' or 'mlp'")
        for name in ("n_layer", "n_embd", "seq_len", "vocab_size", "in_features", "n_head"):
            if getattr(self, name) < 1:
                raise LayoutError(f"model {name}={getattr(self, name)} must be at least 1")
        if self.kind == "gpt" and self.n_embd % self.n_head:
            raise LayoutError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")


@dataclass(kw_only=True, slots=True)
class DeviceTime:
    """Emulated device time: every compute action is padded (with sleep) to this profiled duration.

    On 2 CPU cores several stages cannot compute at once, so pipeline bubbles are not real; padding
    each action to a per-layer duration lets the sleeping stages overlap as devices would.
    """

    forward_ms: float = 2.0
    """Forward time of one layer for one micro-batch."""
    backward_input_ms: float = 2.0
    """Backward-input (activation gradient) time of one layer for one micro-batch."""
    backward_weight_ms: float = 2.0
    """Backward-weight (parameter gradient) time of one layer for one micro-batch."""


@dataclass(kw_only=True, slots=True)
class JobConfig:
    """Everything that fixes the math of a run: model, layout, data order, optimizer."""

    model: ModelSpec = field(default_factory=ModelSpec)
    """The model to train."""
    dp: int = 2
    """Data-parallel degree: number of pipelines."""
    pp: int = 2
    """Pipeline-parallel degree: stages per pipeline."""
    microbatches: int = 4
    """Micro-batches per pipeline per step; the step has dp * microbatches micro-batches in all."""
    global_batch: int = 16
    """Samples per optimizer step, the same under every membership (the math must not change)."""
    strategy: str = "none"
    """Fault tolerance: none, checkpoint, bamboo, recycle or oobleck."""
    schedule: str = "1f1b"
    """Pipeline schedule: `1f1b` (fused backward) or `fiw` (backward split into input and weight)."""
    seed: int = 0
    """Seeds the initial parameters and the synthetic data order."""
    steps: int = 4
    """Optimizer steps to run."""
    lr: float = 1e-2
    """AdamW learning rate."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay."""
    layer_costs: list[float] | None = None
    """Measured relative cost per layer (forward+backward) for balancing stages; None = estimate."""
    device_time: DeviceTime | None = None
    """Emulated device time per action (None: real compute time only)."""
    op_timeout_s: float = 1.5
    """Timeout of every blocking collective / point-to-point call of a training step; bounds hang
    detection. Kept short (about 1 s), so it does not bound state hand-overs (`transfer_timeout_s`)."""
    transfer_timeout_s: float = 0.0
    """Timeout of every call of a state hand-over (layers and optimizer state moved at a regroup, on a
    short-lived transfer group); 0 (the default) derives it per hand-over (`transfer_timeout`). A
    layer of hundreds of MB takes seconds over a network, far over `op_timeout_s`; a hung peer in a
    hand-over is detected within this bound (bystanders within `heartbeat_timeout_s`)."""
    transfer_floor_mb_s: float = 50.0
    """The bandwidth (MB/s, 10^6 bytes) a hand-over is assumed to get at least, to derive
    `transfer_timeout_s`: 50 MB/s (400 Mbit/s) is below what one TCP flow gets between cloud VMs,
    even across zones, so the derived bound fails a slow transfer only when something is wrong."""
    heartbeat_timeout_s: float = 3.0
    """A member whose heartbeat is older than this is declared dead at rendezvous (after op_timeout_s
    of waiting, one that has not answered and whose heartbeat is older than 1.5 x op_timeout_s is too)."""
    rendezvous_timeout_s: float = 60.0
    """Upper bound on waiting for a generation to form."""
    join_wait_s: float = 600.0
    """Strategies that restart from a checkpoint: how long survivors too few for one pipeline wait for
    replacements to join before the job fails."""
    recycle_spill: bool = True
    """recycle: True (the default) lets a lost hop go to any survivor (which fetches that stage's
    layers) when the schedule estimate says the step is shorter -- needed when few pipelines leave one
    peer doing twice the work; False sends it to same-stage peers only, ReCycle as published (see
    docs/runtime.md)."""
    min_stages: int = 1
    """oobleck: the fewest nodes a pipeline template may have (the model must fit on them)."""
    checkpoint_dir: str = ""
    """checkpoint: local directory or s3://bucket/prefix; empty means a temporary directory."""
    checkpoint_interval: int = 0
    """checkpoint: steps between checkpoints; 0 derives it from Young/Daly (see checkpoint_cost_s)."""
    mtbf_s: float = 3600.0
    """checkpoint: observed mean time between failures of the job, for Young/Daly."""
    checkpoint_cost_s: float = 0.05
    """checkpoint: measured time to write one checkpoint, for Young/Daly."""
    step_time_s: float = 0.1
    """checkpoint: measured time of one step, to turn the Young/Daly period into steps."""

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step over all pipelines (constant under every membership)."""
        return self.dp * self.microbatches

    @property
    def microbatch_size(self) -> int:
        """Samples per micro-batch."""
        return self.global_batch // self.num_microbatches

    @property
    def num_nodes(self) -> int:
        """Nodes of the full layout."""
        return self.dp * self.pp

    def transfer_timeout(self, nbytes: int) -> float:
        """The bound of each call of a hand-over that moves `nbytes` in all (every message of it).

        `transfer_timeout_s` if set, else op_timeout_s + nbytes / transfer_floor_mb_s: the op timeout
        covers a message's latency and scheduling hiccups, as in a step, and the second term is the
        time the bytes take at the floor bandwidth. All the hand-over's bytes are counted, not one
        message's: a receiver's call may wait while its source sends to others first, so the
        hand-over's whole traffic through one link is the most any call can legitimately wait.
        Every node derives the same bound from the plan. Tiny test models get about op_timeout_s; a
        GPT-2 XL block (d=1600, 30.7M parameters, sent as params + two AdamW moments in float64,
        738 MB) gets op_timeout_s + 14.8 s.
        """
        if self.transfer_timeout_s > 0:
            return self.transfer_timeout_s
        return self.op_timeout_s + nbytes / (self.transfer_floor_mb_s * 1e6)

    def validate(self) -> None:
        """Raise `LayoutError` naming the bad value and what was expected; no process is started."""
        self.model.validate()
        if self.strategy not in STRATEGIES:
            raise LayoutError(f"strategy {self.strategy!r} is unknown; expected one of {STRATEGIES}")
        if self.schedule not in SCHEDULES:
            raise LayoutError(f"schedule {self.schedule!r} is unknown; expected one of {SCHEDULES}")
        if self.dp < 1 or self.pp < 1:
            raise LayoutError(f"dp={self.dp} and pp={self.pp} must both be at least 1")
        if self.pp > self.model.num_layers:
            raise LayoutError(
                f"pp={self.pp} stages but the model has only {self.model.num_layers} layers "
                f"(n_layer={self.model.n_layer} + input + head); expected pp <= {self.model.num_layers}"
            )
        if self.microbatches < 1:
            raise LayoutError(f"microbatches={self.microbatches} must be at least 1")
        if self.global_batch % self.num_microbatches:
            raise LayoutError(
                f"global_batch={self.global_batch} is not divisible by dp*microbatches="
                f"{self.num_microbatches}; expected a multiple of {self.num_microbatches}"
            )
        if self.layer_costs is not None and len(self.layer_costs) != self.model.num_layers:
            raise LayoutError(
                f"layer_costs has {len(self.layer_costs)} entries; "
                f"expected {self.model.num_layers} (one per layer)"
            )
        if not 1 <= self.min_stages <= self.pp:
            raise LayoutError(f"min_stages={self.min_stages} must be between 1 and pp={self.pp}")
        if self.steps < 0:
            raise LayoutError(f"steps={self.steps} must be >= 0")
        if not self.op_timeout_s > 0:  # `not >` also rejects NaN
            raise LayoutError(f"op_timeout_s={self.op_timeout_s} must be a positive number of seconds")
        if not (self.transfer_timeout_s == 0 or self.op_timeout_s <= self.transfer_timeout_s < math.inf):
            raise LayoutError(
                f"transfer_timeout_s={self.transfer_timeout_s} is invalid; expected 0 (derive it from the "
                f"bytes moved) or a finite number of seconds at least op_timeout_s={self.op_timeout_s}"
            )
        if not 0 < self.transfer_floor_mb_s < math.inf:
            raise LayoutError(
                f"transfer_floor_mb_s={self.transfer_floor_mb_s} must be a positive, finite bandwidth in MB/s"
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (inverse of `from_dict`)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobConfig:
        """Build from `to_dict` output; nested specs are rebuilt as dataclasses."""
        data = dict(data)
        data["model"] = ModelSpec(**data.get("model", {}))
        if data.get("device_time") is not None:
            data["device_time"] = DeviceTime(**data["device_time"])
        return cls(**data)
