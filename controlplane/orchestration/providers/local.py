"""The `local` provider: every node is a process group on this host (the embedded default and the
demo). A node is `python -m controlplane.orchestration.local.node`, which serves the node's
metadata endpoint and runs the agent; its directory under `root` holds `node.json` and the log.

Preemption: `preempt()` posts a notice to the node's metadata endpoint (in the cloud's own
format) and the node kills its own process group when the notice period ends; `kill()` pulls the
plug with no notice.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from controlplane.orchestration.providers.base import LaunchRequest, NodeInfo, ProviderError

REPO_ROOT = Path(__file__).resolve().parents[3]
LOCAL_INSTANCE_TYPE = "local.node"
LOCAL_ZONE = "local"

# Popen objects of the nodes this process started, so their exit status is collected (no zombie
# left behind by a long-lived worker process).
_CHILDREN: dict[int, subprocess.Popen] = {}


def _reap() -> None:
    for pid, proc in list(_CHILDREN.items()):
        if proc.poll() is not None:
            _CHILDREN.pop(pid, None)


def pid_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as dead)."""
    _reap()
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def group_pids(pgid: int) -> list[int]:
    """Live processes of process group `pgid` (to check that nothing is left behind)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            pids.append(int(entry.name))
    return pids


class LocalProvider:
    """Nodes as local process groups under `root` (one directory per node)."""

    kind = "local"

    def __init__(self, root: Path, *, python: str | None = None, start_timeout_s: float = 15.0,
                 terminate_grace_s: float = 3.0, extra_env: dict[str, str] | None = None) -> None:
        self.root = Path(root)
        self.python = python or sys.executable
        self.start_timeout_s = start_timeout_s
        self.terminate_grace_s = terminate_grace_s
        self.extra_env = extra_env or {}

    # --- helpers ---------------------------------------------------------------------------------------
    def node_ids_for(self, request: LaunchRequest) -> list[str]:
        """Deterministic ids, so a retried launch finds the nodes of the first one."""
        digest = hashlib.sha256(request.client_token.encode()).hexdigest()[:10]
        return [f"local-{digest}-{i}" for i in range(request.count)]

    def node_dir(self, node_id: str) -> Path:
        if "/" in node_id or node_id.startswith("."):
            raise ProviderError(f"bad local node id {node_id!r}")
        return self.root / node_id

    def node_info_file(self, node_id: str) -> dict | None:
        try:
            return json.loads((self.node_dir(node_id) / "node.json").read_text())
        except (FileNotFoundError, ValueError):
            return None

    def _info(self, node_id: str) -> NodeInfo:
        data = self.node_info_file(node_id)
        if data is None:
            state = "pending" if (self.node_dir(node_id) / "spawned").exists() and self._spawn_recent(node_id) else (
                "terminated" if self.node_dir(node_id).exists() else "missing")
            return NodeInfo(provider_instance_id=node_id, instance_type=LOCAL_INSTANCE_TYPE, zone=LOCAL_ZONE,
                            state=state)
        alive = pid_alive(int(data["pid"]))
        return NodeInfo(
            provider_instance_id=node_id, instance_type=data.get("instance_type", LOCAL_INSTANCE_TYPE),
            zone=data.get("zone", LOCAL_ZONE), state="running" if alive else "terminated",
            address=data.get("metadata_url", ""),
        )

    def _spawn_recent(self, node_id: str) -> bool:
        try:
            spawned = float((self.node_dir(node_id) / "spawned").read_text())
        except (FileNotFoundError, ValueError):
            return False
        return time.time() - spawned < self.start_timeout_s

    def _spawn(self, node_id: str, request: LaunchRequest) -> None:
        directory = self.node_dir(node_id)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "spawned").write_text(str(time.time()))
        env = {**os.environ, **self.extra_env, "SPOTPIPE_ENROLL_KEY": request.bootstrap.enroll_key,
               "PYTHONUNBUFFERED": "1"}
        # The node must not inherit the test or worker's Django settings overrides; it talks HTTP only.
        env.pop("DJANGO_SETTINGS_MODULE", None)
        argv = [self.python, "-m", "controlplane.orchestration.local.node", "--node-dir", str(directory),
                "--node-id", node_id, *request.bootstrap.agent_argv()]
        with open(directory / "node.log", "ab") as log:
            proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        _CHILDREN[proc.pid] = proc

    # --- Provider interface ------------------------------------------------------------------------
    def launch(self, request: LaunchRequest) -> list[NodeInfo]:
        """Start the request's nodes (those already started by an earlier launch are returned as
        they are) and wait until each serves its metadata endpoint."""
        ids = self.node_ids_for(request)
        for node_id in ids:
            if not self.node_dir(node_id).exists():
                self._spawn(node_id, request)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if all(self.node_info_file(i) is not None for i in ids):
                break
            time.sleep(0.02)
        else:
            missing = [i for i in ids if self.node_info_file(i) is None]
            raise ProviderError(f"local nodes {missing} did not start within {self.start_timeout_s}s; "
                                f"see {self.root}/<id>/node.log", transient=True)
        return [self._info(i) for i in ids]

    def describe(self, ids: Sequence[str]) -> list[NodeInfo]:
        return [self._info(i) for i in ids]

    def terminate(self, ids: Sequence[str]) -> None:
        """SIGTERM each node's process group (the agent stops its workers cleanly), then SIGKILL
        whatever is left after the grace period."""
        groups = []
        for node_id in ids:
            data = self.node_info_file(node_id)
            if data is None or not pid_alive(int(data["pid"])):
                continue
            groups.append(int(data["pgid"]))
            _signal_group(int(data["pgid"]), signal.SIGTERM)
        deadline = time.monotonic() + self.terminate_grace_s
        while groups and time.monotonic() < deadline:
            if not any(group_pids(g) for g in groups):
                break
            time.sleep(0.05)
        for pgid in groups:
            _signal_group(pgid, signal.SIGKILL)
        _reap()

    # --- local extras ---------------------------------------------------------------------------------
    def preempt(self, node_id: str, *, notice_s: float, kind: str = "interruption") -> dict:
        """Serve an interruption notice on the node's metadata endpoint; the node dies `notice_s`
        later. Returns the AWS-format body now served."""
        data = self.node_info_file(node_id)
        if data is None:
            raise ProviderError(f"no local node {node_id!r}")
        request = urllib.request.Request(
            data["metadata_url"] + "/_spotpipe/notice", method="POST",
            data=json.dumps({"kind": kind, "notice_s": notice_s}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())

    def kill(self, node_id: str) -> None:
        """Pull the plug: SIGKILL the node's whole process group, no notice."""
        data = self.node_info_file(node_id)
        if data is None:
            raise ProviderError(f"no local node {node_id!r}")
        _signal_group(int(data["pgid"]), signal.SIGKILL)

    def all_node_ids(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir()) if self.root.exists() else []

    def live_pids(self) -> list[int]:
        """Every live process of every node under `root` (for no-orphan checks)."""
        pids = []
        for node_id in self.all_node_ids():
            data = self.node_info_file(node_id)
            if data is not None:
                pids += group_pids(int(data["pgid"]))
        return pids


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
