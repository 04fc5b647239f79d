"""One local "VM": a process group holding the node's metadata server and its agent (and the
agent's workers). The local provider starts it with `start_new_session=True`, so killing the
process group is pulling the plug on the whole node, workers included.

    python -m controlplane.orchestration.providers.local.node --node-dir DIR --node-id ID [agent args...]

When an interruption notice is posted to the metadata server, the node kills its own process
group when the notice period ends, like a cloud reclaiming the VM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

from controlplane.orchestration.providers.local.metadata import IdentitySigner, MetadataServer


def _kill_group_at(deadline: float) -> None:
    def fire() -> None:
        delay = deadline - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=fire, name="reclaim", daemon=True).start()


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--node-dir", type=Path, required=True)
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--instance-type", default="local.node")
    parser.add_argument("--zone", default="local")
    args, agent_args = parser.parse_known_args(argv)

    identity = None
    if os.environ.get("SPOTPIPE_LOCAL_IDENTITY_KEY"):
        # Sign an instance identity document as AWS would (the control plane verifies it when enforcing).
        identity = IdentitySigner(private_key_pem=Path(os.environ["SPOTPIPE_LOCAL_IDENTITY_KEY"]).read_bytes(),
                                  account_id=os.environ.get("SPOTPIPE_LOCAL_IDENTITY_ACCOUNT", "000000000000"),
                                  region=os.environ.get("SPOTPIPE_LOCAL_IDENTITY_REGION", "local"))
    server = MetadataServer(instance_id=args.node_id, instance_type=args.instance_type, zone=args.zone,
                            on_notice=_kill_group_at, identity=identity).start()
    args.node_dir.mkdir(parents=True, exist_ok=True)
    stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    write_json_atomic(args.node_dir / "node.json", {
        "node_id": args.node_id, "pid": os.getpid(), "pgid": os.getpgrp(), "metadata_url": server.url,
        "instance_type": args.instance_type, "zone": args.zone, "started_at": time.time(),
        # Who this process is, so the provider never mistakes a leftover or a reused pid for it.
        "launch": os.environ.get("SPOTPIPE_LOCAL_LAUNCH", ""), "proc_start": int(stat[19]),
    })
    # The agent runs as its own process, as on a cloud VM (`spotpipe-agent`), not imported into this
    # one: the control plane's code never shares an interpreter with it. It installs a job's
    # requirements into a venv of its own work folder, as a cloud node does (docs/runtime.md, "Your
    # code on the nodes").
    if "--gpu-index" not in agent_args and "SPOTPIPE_GPU_INDEX" not in os.environ:
        # Local nodes share this host's GPUs: spread them by node id (the runtime wraps the index
        # around the GPUs it sees), as `spotpipe train` spreads its nodes.
        agent_args = [*agent_args, "--gpu-index", str(zlib.crc32(args.node_id.encode()) % 1024)]
    agent = subprocess.Popen([sys.executable, "-m", "agent.main", *agent_args, "--metadata-url", server.url,
                              "--work-dir", str(args.node_dir / "work")])
    # The provider stops a node by signalling its whole process group: the agent gets the signal
    # itself and stops its workers; this process waits for it rather than dying first.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    try:
        return agent.wait()
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
