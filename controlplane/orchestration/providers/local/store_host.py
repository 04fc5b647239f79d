"""Hosts a job's rendezvous store (a torch.distributed TCPStore) in its own process, outside every
worker, so that no node's death takes the store with it (see runtime/distributed/coordinator.py).

    python -m controlplane.orchestration.providers.local.store_host --info FILE [--host 0.0.0.0] [--port 0]

Writes `{"port": p, "pid": ...}` to FILE once listening, then serves until SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--info", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    from runtime.distributed.coordinator import serve

    store = serve(args.port, timeout_s=300)
    tmp = args.info.with_suffix(".tmp")
    tmp.write_text(json.dumps({"port": store.port, "pid": os.getpid()}))
    os.replace(tmp, args.info)
    stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
