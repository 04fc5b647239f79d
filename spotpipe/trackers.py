"""Experiment trackers of `spotpipe train` (`--track`, job file `tracking = [...]`): TensorBoard, MLflow
and Weights & Biases, each an optional extra, fed from one process (the command's, which merges the
ranks' records) with the config at the start, each step's metrics, every recovery, and the final
weights' location at the end.

- `tensorboard`: event files in `OUT/tb/` (`pip install 'spotpipe[tensorboard]'`);
- `mlflow`: a run in experiment `spotpipe` at `MLFLOW_TRACKING_URI`, else a file store in
  `OUT/mlruns` (`pip install 'spotpipe[mlflow]'`);
- `wandb`: a run in project `WANDB_PROJECT` (default `spotpipe`), online with `WANDB_API_KEY`, or
  offline with `WANDB_MODE=offline` (files in `OUT/wandb/`; `pip install 'spotpipe[wandb]'`).

Without `--track`, TensorBoard is written when its package is installed (as before). A tracker whose
package is missing is one error naming the extra, before any rank starts.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Any, Protocol

TRACKERS = ("tensorboard", "mlflow", "wandb")
_PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}
"""The module each tracker needs; its extra has the tracker's name."""
PARAM_CHARS = 500
"""MLflow keeps a parameter's value to this many characters."""


class TrackerError(ValueError):
    """A tracker that cannot be used; the message names it and what to install or set."""


class Tracker(Protocol):
    name: str

    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def suspend(self) -> None:
        """Let go of the run without ending it (the control plane resumes it by id with its next batch)."""
        ...

    def finish(self, outputs: dict[str, str]) -> dict[str, Any]:
        """Close the run, recording `outputs` (the weights' location); returns what spotpipe.json keeps."""
        ...


def check_trackers(names: list[str]) -> list[str]:
    """The trackers asked for, each known and installed; raises `TrackerError`."""
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise TrackerError(f"tracking {unknown} is unknown; expected some of {list(TRACKERS)}")
    for name in names:
        if importlib.util.find_spec(_PACKAGES[name]) is None:
            raise TrackerError(f"tracking {name!r} needs the {_PACKAGES[name]} package: pip install 'spotpipe[{name}]'")
    return list(dict.fromkeys(names))


def default_trackers() -> list[str]:
    """TensorBoard when installed (what `spotpipe train` always wrote)."""
    return ["tensorboard"] if importlib.util.find_spec("tensorboard") is not None else []


def open_trackers(names: list[str], *, out_dir: Path, config: dict[str, Any], run_name: str) -> list[Tracker]:
    """A new run of each tracker; when one cannot open, those already open are closed and its error raised."""
    opened: list[Tracker] = []
    try:
        for name in names:
            opened.append(open_tracker(name, out_dir=out_dir, config=config, run_name=run_name))
    except BaseException:
        for tracker in opened:
            with contextlib.suppress(Exception):  # the first error is the one to tell
                tracker.finish({})
        raise
    return opened


def open_tracker(name: str, *, out_dir: Path, config: dict[str, Any], run_name: str,
                 run_id: str | None = None) -> Tracker:
    """A new run of tracker `name` with `config` logged, or (`run_id`, MLflow and W&B) that run resumed."""
    kind = {"tensorboard": _TensorBoard, "mlflow": _MLflow, "wandb": _WandB}[name]
    return kind(out_dir=out_dir, config=config, run_name=run_name, run_id=run_id)  # type: ignore[no-any-return]


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """`{"model.n_layer": "4", ...}`: nested config as flat string parameters."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            out[f"{prefix}{key}"] = text[:PARAM_CHARS]
    return out


class _TensorBoard:
    name = "tensorboard"

    def __init__(self, *, out_dir: Path, config: dict[str, Any], run_name: str, run_id: str | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.path = out_dir / "tb"
        self.writer = SummaryWriter(log_dir=str(self.path))
        self.writer.add_text("config", f"```\n{json.dumps(config, indent=2)}\n```")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar("val/loss" if key == "val_loss" else f"train/{key}", value, step)

    def suspend(self) -> None:
        self.writer.flush()

    def finish(self, outputs: dict[str, str]) -> dict[str, Any]:
        for key, value in outputs.items():
            self.writer.add_text(key, value)
        self.writer.close()
        return {"tracker": self.name, "where": str(self.path)}


class _MLflow:
    """Through `MlflowClient` with the run's id (MLflow's fluent API keeps its active run per thread,
    and steps are logged from the command's progress thread)."""

    name = "mlflow"

    def __init__(self, *, out_dir: Path, config: dict[str, Any], run_name: str, run_id: str | None = None) -> None:
        import time

        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.uri = os.environ.get("MLFLOW_TRACKING_URI") or ""
        if not self.uri:  # no server named: a file store beside the run (MLflow 3 asks to opt in to it)
            self.uri = (out_dir.resolve() / "mlruns").as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=self.uri)
        self.clock = time.time
        if run_id:
            self.run = self.client.get_run(run_id)
            self.run_id = run_id
            return
        experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "spotpipe"
        experiment = self.client.get_experiment_by_name(experiment_name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(experiment_name)
        self.run = self.client.create_run(experiment_id, run_name=run_name)
        self.run_id = self.run.info.run_id
        params = [Param(k, v) for k, v in _flat(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters a batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        at = int(self.clock() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), at, step) for k, v in metrics.items()])

    def suspend(self) -> None:
        """Nothing to let go of: MLflow's client holds nothing open, the run id is the whole handle."""

    def finish(self, outputs: dict[str, str]) -> dict[str, Any]:
        for key, value in outputs.items():
            self.client.set_tag(self.run_id, key, value)
        self.client.set_terminated(self.run_id)
        return {"tracker": self.name, "run_id": self.run_id, "run_name": self.run.info.run_name, "where": self.uri}


class _WandB:
    name = "wandb"

    def __init__(self, *, out_dir: Path, config: dict[str, Any], run_name: str, run_id: str | None = None) -> None:
        import wandb

        try:
            self.run = wandb.init(project=os.environ.get("WANDB_PROJECT") or "spotpipe", name=run_name,
                                  dir=str(out_dir), config=None if run_id else config, id=run_id,
                                  resume="allow" if run_id else None, reinit="finish_previous")
        except wandb.errors.Error as exc:  # no credentials, a server that refuses: one line, not its traceback
            said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise TrackerError(f"tracking 'wandb' cannot open a run ({said}); set WANDB_API_KEY (or run wandb "
                               "login), or WANDB_MODE=offline to log under OUT/wandb/") from None
        self.run_id = self.run.id

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def suspend(self) -> None:
        self.run.finish()  # its local service ends; resumed by id (`resume="allow"`) with the next batch

    def finish(self, outputs: dict[str, str]) -> dict[str, Any]:
        for key, value in outputs.items():
            self.run.summary[key] = value
        where = str(Path(self.run.dir).parent)
        record = {"tracker": self.name, "run_id": self.run.id, "run_name": self.run.name, "where": where}
        self.run.finish()
        return record
