"""Entry point: `python -m bench NAME [--quick] [--json PATH]`."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import sys
from pathlib import Path

import bench
from bench.report import Progress, machine_reference


def default_options(module: object) -> dict:
    """A benchmark's options with nothing given on the command line."""
    parse_args = getattr(module, "parse_args", None)
    return parse_args([]) if parse_args is not None else {}


def available() -> list[str]:
    """Names of the benchmark modules (every module in `bench/` with a `run` function)."""
    names = []
    for info in pkgutil.iter_modules(bench.__path__):
        if info.name in {"report", "__main__"} or info.name.startswith("_"):
            continue
        names.append(info.name)
    return sorted(names)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("name", choices=available(), help="which benchmark to run")
    parser.add_argument("--quick", action="store_true", help="small sizes, for CI")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args, extra = parser.parse_known_args(argv)
    # Benchmarks run on a development checkout: ask for development mode (settings fail closed);
    # the servers and workers they start inherit it.
    os.environ.setdefault("SPOTPIPE_DEV", "1")
    module = importlib.import_module(f"bench.{args.name}")
    kwargs = {}
    if hasattr(module, "parse_args"):
        kwargs = module.parse_args(extra)
    elif extra:
        parser.error(f"unrecognised arguments for {args.name}: {' '.join(extra)}")
    missing = module.requirements(quick=args.quick, **kwargs) if hasattr(module, "requirements") else []
    if missing:
        print(f"bench {args.name} cannot run here; missing:", *(f"  - {m}" for m in missing), sep="\n",
              file=sys.stderr)
        return 2
    machine = machine_reference()
    print(f"machine: {machine['cores']} cores, plain Python {machine['python_loop_ns_per_iteration']} ns a loop "
          f"iteration, load {machine['load_average_1m']} (compare timings only between runs where these are alike)")
    progress = Progress()
    figures = module.run(quick=args.quick, progress=progress, **kwargs)
    progress.done()
    result = {args.name: figures, "machine": machine}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, sort_keys=True, default=str) + "\n")
        print(f"\nwrote {args.json}")
    # A benchmark that checks something (chaos) says `"ok": false` when a check failed.
    return 1 if isinstance(figures, dict) and figures.get("ok") is False else 0


if __name__ == "__main__":
    sys.exit(main())
