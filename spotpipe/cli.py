"""`spotpipe` console script: `spotpipe demo [options]` (see docs/demo.md)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

STRATEGIES = ("recycle", "bamboo", "oobleck", "checkpoint", "auto")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spotpipe", description="spotpipe: train on spot VMs.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="run a spot training fleet on this machine, end to end",
        description="Seed a market and a demo team, serve the control plane with a Celery worker and beat, "
                    "train a small GPT on local nodes under preemptions, then print its cost report.")
    demo.add_argument("--strategy", choices=STRATEGIES, default="recycle",
                      help="how the job survives preemptions (default: recycle)")
    demo.add_argument("--nodes", type=int, default=4, help="nodes of the job (default 4: dp=2 x pp=2)")
    demo.add_argument("--trace", type=Path, help="a preemption trace file (Bamboo CSV, GCP counts or SkyPilot "
                                                 "JSON); default: a synthetic trace drawn with --seed")
    demo.add_argument("--prices", type=Path, help="a spot price history file (TSV/CSV, gzipped or not); default: "
                                                  "the bundled synthetic market drawn with --seed")
    demo.add_argument("--duration", type=float, default=150.0,
                      help="roughly how long the training should take, in seconds (default 150)")
    demo.add_argument("--seed", type=int, default=0, help="seeds the market, the trace, the notices and the job")
    demo.add_argument("--headless", action="store_true",
                      help="exit when the job is done: status 0 if it finished with its loss below the initial loss")
    demo.add_argument("--screenshot", type=Path, help="save a PNG of the job's dashboard page when it is done "
                                                      "(needs Chromium and playwright)")
    demo.add_argument("--external", metavar="URL", default="",
                      help="use the control plane already serving at URL (docker compose) instead of starting one; "
                           "its worker must run on this host (same process and network namespace)")
    demo.add_argument("--host", default="127.0.0.1", help="address of the web server (default 127.0.0.1)")
    demo.add_argument("--port", type=int, default=8000, help="port of the web server (default 8000)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("trace", "prices"):
        path = getattr(args, name)
        if path is not None and not path.is_file():
            print(f"spotpipe demo: --{name} {path}: no such file", file=sys.stderr)
            return 2
    if args.nodes < 1 or args.duration <= 0:
        print(f"spotpipe demo: --nodes ({args.nodes}) and --duration ({args.duration}) must be positive",
              file=sys.stderr)
        return 2

    if not args.external:
        # The demo is the whole product on this machine: development mode, asked for explicitly
        # (settings fail closed). Its servers and workers inherit it. With --external, the stack
        # it joins (docker compose) brings its own production settings.
        os.environ.setdefault("SPOTPIPE_DEV", "1")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from spotpipe.demo import DemoOptions, run_demo

    return run_demo(DemoOptions(
        host=args.host, port=args.port, strategy=args.strategy, nodes=args.nodes,
        trace=args.trace.resolve() if args.trace else None, prices=args.prices.resolve() if args.prices else None,
        duration=args.duration, seed=args.seed, headless=args.headless,
        screenshot=args.screenshot.resolve() if args.screenshot else None, external=args.external,
    ))


if __name__ == "__main__":
    sys.exit(main())
