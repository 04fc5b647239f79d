"""`python -m runtime.train.node_profile --config @FILE`: what the first node of a `plan: auto` job
measures of a model function sent without its per-layer measures (the control plane never imports
user code). It validates the model as `spotpipe submit` does, on the job's own data here, and prints
one JSON line: the layer count, each layer's measures on the meta device, the per-layer
forward+backward seconds on this node, and what the model function declares; or `{"error": ...,
"field": ...}` and exit status 1 for a model that cannot run (the job then fails with it)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from runtime.config import JobConfig, LayoutError


def node_profile(config: dict[str, Any]) -> dict[str, Any]:
    """The profile of `config`'s model (a `JobConfig.to_dict()` of a model function) on this node,
    as `POST /api/v1/agents/profile/` takes it. Raises `LayoutError` (or `DataError`) naming the field."""
    from runtime.models.usermodel import apply_declaration
    from runtime.train.model_check import validate_model

    job = JobConfig.from_dict({**config, "dp": 1, "pp": 1, "microbatches": 1})
    apply_declaration(job)
    report = validate_model(job, profile=True)
    return {
        "layers": report.num_layers,
        "layer_measures": [dataclasses.asdict(m) for m in report.measures],
        "layer_costs": report.layer_costs,
        "declared": dict(report.declared),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.train.node_profile", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the job's JobConfig as JSON, or @path to a JSON file")
    args = parser.parse_args(argv)
    text = Path(args.config[1:]).read_text() if args.config.startswith("@") else args.config
    from runtime.data.dataset import DataError

    try:
        print(json.dumps(node_profile(json.loads(text))), flush=True)
    except LayoutError as exc:
        print(json.dumps({"error": exc.message, "field": exc.field}), flush=True)
        return 1
    except DataError as exc:
        print(json.dumps({"error": f"data: {exc}", "field": "data.source"}), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
