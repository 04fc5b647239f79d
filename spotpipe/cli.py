"""`spotpipe` console script: `spotpipe demo [options]`."""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spotpipe", description="spotpipe: train on spot VMs.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="seed a demo team and market, then serve the control plane")
    demo.add_argument("--host", default="127.0.0.1")
    demo.add_argument("--port", type=int, default=8000)
    demo.add_argument("--no-worker", action="store_true", help="do not start a Celery worker")
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from spotpipe.demo import run_demo

    return run_demo(host=args.host, port=args.port, start_worker=not args.no_worker)


if __name__ == "__main__":
    sys.exit(main())
