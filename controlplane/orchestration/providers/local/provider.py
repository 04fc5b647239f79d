"""The `local` provider: every node is a process group on this host (the embedded default and the
demo). A node is `python -m controlplane.orchestration.providers.local.node`, which serves the node's
metadata endpoint and starts the agent as a child process; its directory under `root` holds
`node.json` and the log.

Preemption: `preempt()` posts a notice to the node's metadata endpoint (in the cloud's own
format) and the node kills its own process group when the notice period ends; `kill()` pulls the
plug with no notice.

Leftovers: node ids come from the request token, so a reused root (a database reset, a crash and a
restart) can hold a directory for the same id from an earlier run. Each launch has a *launch id*
(hash of token, enrolment key and control-plane URL) written beside the node and into its
`node.json`, with the process's kernel start time. A launch adopts only a node of the same launch
whose process is the one recorded (same pid *and* start time, so a reused pid is not taken for it);
anything else in the directory is stale: its processes (found by their `--node-dir`) are killed,
the directory is removed and the node is started afresh.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from controlplane.market.local_pool import LOCAL_INSTANCE_TYPE, LOCAL_REGION, LOCAL_ZONE
from controlplane.orchestration.providers.base import (
    CAPACITY_CODES,
    InsufficientCapacity,
    LaunchRequest,
    NodeInfo,
    Pool,
    ProviderError,
)
from controlplane.orchestration.providers.local.environment import node_environment
from runtime.planner.capacity_policy import CAPACITY_TYPES, SPOT

REPO_ROOT = Path(__file__).resolve().parents[4]

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


def proc_start(pid: int) -> int | None:
    """The kernel start time of `pid` (clock ticks since boot): with the pid, a process's identity."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError, ValueError):
        return None


def node_dir_pids(directory: Path) -> list[int]:
    """Live processes started as a local node of `directory` (`--node-dir DIR` on their command line)."""
    wanted = str(directory).encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        named = any(a == b"--node-dir" and b == wanted for a, b in itertools.pairwise(argv))
        if named and pid_alive(int(entry.name)):
            pids.append(int(entry.name))
    return pids


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
                 terminate_grace_s: float = 3.0, extra_env: dict[str, str] | None = None,
                 capacity_script: Path | None = None) -> None:
        self.root = Path(root)
        self.python = python or sys.executable
        self.start_timeout_s = start_timeout_s
        self.terminate_grace_s = terminate_grace_s
        self.extra_env = extra_env or {}
        self.capacity = CapacityScript.load(capacity_script, epoch_file=self.root / ".capacity-epoch") \
            if capacity_script else None

    # --- helpers ---------------------------------------------------------------------------------------
    def node_ids_for(self, request: LaunchRequest) -> list[str]:
        """Deterministic ids, so a retried launch finds the nodes of the first one."""
        digest = hashlib.sha256(request.client_token.encode()).hexdigest()[:10]
        return [f"local-{digest}-{i}" for i in range(request.count)]

    @staticmethod
    def launch_id(request: LaunchRequest) -> str:
        """What tells this launch's nodes from a leftover with the same id: a retry of the launch
        has the same token, enrolment key and control plane; an earlier run differs in one."""
        boot = request.bootstrap
        text = f"{request.client_token}\0{boot.enroll_key}\0{boot.control_plane_url}"
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def _process_is_node(self, data: dict) -> bool:
        """The process `node.json` names still runs and is that node (not a reused pid)."""
        pid = int(data["pid"])
        if not pid_alive(pid):
            return False
        recorded = data.get("proc_start")
        return recorded is None or proc_start(pid) == int(recorded)

    def _launch_record(self, node_id: str) -> dict | None:
        try:
            return json.loads((self.node_dir(node_id) / "launch.json").read_text())
        except (FileNotFoundError, ValueError):
            return None

    def _leftover(self, node_id: str, launch: str) -> bool:
        """True when the node's directory holds anything but this launch's node (alive, dead or
        still starting)."""
        directory = self.node_dir(node_id)
        if not directory.exists():
            return False
        record = self._launch_record(node_id)
        if record is None or record.get("launch") != launch:
            return True
        data = self.node_info_file(node_id)
        if data is None:
            return not self._spawn_recent(node_id) and not node_dir_pids(directory)
        if data.get("launch") != launch:
            return True
        # This launch's node: adopted whether it still runs or has died since (like EC2, a retried
        # launch returns the instances of the first one even when they are gone) -- unless its pid
        # was reused by another process, which is then not ours to report or to signal.
        return pid_alive(int(data["pid"])) and not self._process_is_node(data)

    def _clear(self, node_id: str) -> None:
        """Kill whatever still runs as a node of this directory, then remove the directory."""
        directory = self.node_dir(node_id)
        for _ in range(3):
            pids = node_dir_pids(directory)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(os.getpgid(pid), signal.SIGKILL)
            time.sleep(0.1)
            _reap()
        shutil.rmtree(directory, ignore_errors=True)

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
            state = "pending" if self._spawn_recent(node_id) else (
                "terminated" if self.node_dir(node_id).exists() else "missing")
            return NodeInfo(provider_instance_id=node_id, instance_type=LOCAL_INSTANCE_TYPE, zone=LOCAL_ZONE,
                            state=state)
        alive = self._process_is_node(data)
        record = self._launch_record(node_id) or {}
        return NodeInfo(
            provider_instance_id=node_id, instance_type=data.get("instance_type", LOCAL_INSTANCE_TYPE),
            zone=data.get("zone", LOCAL_ZONE), state="running" if alive else "terminated",
            address=data.get("metadata_url", ""), lifecycle=record.get("lifecycle", SPOT), region=LOCAL_REGION,
        )

    def _spawn_recent(self, node_id: str) -> bool:
        record = self._launch_record(node_id)
        if record is None:
            return False
        return time.time() - float(record.get("spawned_at", 0)) < self.start_timeout_s

    def _spawn(self, node_id: str, request: LaunchRequest, pool: Pool) -> None:
        directory = self.node_dir(node_id)
        directory.mkdir(parents=True, exist_ok=True)
        launch = self.launch_id(request)
        record = {"launch": launch, "token": request.client_token, "spawned_at": time.time(),
                  "lifecycle": request.capacity_type}
        (directory / "launch.json").write_text(json.dumps(record))
        # Not the control plane's environment: a team's code runs on the node (environment.py).
        env = {**node_environment(os.environ), **self.extra_env, "SPOTPIPE_ENROLL_KEY": request.bootstrap.enroll_key,
               "SPOTPIPE_LOCAL_LAUNCH": launch, "PYTHONUNBUFFERED": "1"}
        argv = [self.python, "-m", "controlplane.orchestration.providers.local.node", "--node-dir", str(directory),
                "--node-id", node_id, "--instance-type", pool.instance_type or LOCAL_INSTANCE_TYPE,
                "--zone", pool.zone or LOCAL_ZONE, *request.bootstrap.agent_argv()]
        with open(directory / "node.log", "ab") as log:
            proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        _CHILDREN[proc.pid] = proc

    # --- Provider interface ------------------------------------------------------------------------
    def launch(self, request: LaunchRequest) -> list[NodeInfo]:
        """Start the request's nodes in its first pool (the cheapest: like RunInstances, one pool a
        call), or raise `InsufficientCapacity` for that pool while the capacity script says it has
        none. Nodes already started by an earlier try of this launch are returned as they are;
        leftovers of another run under the same ids are cleared first. Waits until each node serves
        its metadata endpoint."""
        if request.count < 1:
            return []
        pool = request.pools[0] if request.pools else Pool(instance_type=LOCAL_INSTANCE_TYPE, zone=LOCAL_ZONE)
        ids = self.node_ids_for(request)
        launch = self.launch_id(request)
        adopted = all(not self._leftover(i, launch) and self.node_dir(i).exists() for i in ids)
        self._log_launch(request, pool, adopted=adopted)
        error = self.capacity.error_for(pool.key, capacity_type=request.capacity_type) \
            if self.capacity and not adopted else None
        if error:
            raise InsufficientCapacity(f"local pool {pool.key}: {error} (capacity script)", code=error,
                                       pools=[pool.key])
        for node_id in ids:
            if self._leftover(node_id, launch):
                self._clear(node_id)
            if not self.node_dir(node_id).exists():
                self._spawn(node_id, request, pool)
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
            if data is None or not self._process_is_node(data):
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
        # A SIGKILLed process still runs for a moment while it exits (a torch worker unmaps a lot):
        # return once it is gone, so that a caller checking for leftovers right after finds none.
        deadline = time.monotonic() + 5.0
        while any(group_pids(g) for g in groups) and time.monotonic() < deadline:
            time.sleep(0.02)
        _reap()

    def _log_launch(self, request: LaunchRequest, pool: Pool, *, adopted: bool) -> None:
        """One line per launch call in `<root>/launches.jsonl`: which pool was asked, when (the capacity
        bench checks that no launch asked an offering marked unavailable)."""
        self.root.mkdir(parents=True, exist_ok=True)
        line = {"at": time.time(), "token": request.client_token, "pool": pool.key, "count": request.count,
                "capacity_type": request.capacity_type, "adopted": adopted}
        with open(self.root / "launches.jsonl", "a") as log:
            log.write(json.dumps(line) + "\n")

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
        if self._process_is_node(data):
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


class CapacityScript:
    """When local pools have no capacity: a JSON list of `{"pool": "TYPE@ZONE", "from_s": N, "to_s":
    N, "error": CODE}`, seconds from the provider's start, each for spot launches unless it says
    `"capacity_type": "on_demand"`. The start is stamped once in the nodes' root (`.capacity-epoch`),
    so every worker process of one control plane counts from the same moment; delete the file to
    start the script again."""

    def __init__(self, windows: list[dict], epoch: float) -> None:
        self.windows = windows
        self.epoch = epoch

    @classmethod
    def load(cls, path: Path, *, epoch_file: Path) -> CapacityScript:
        try:
            windows = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ProviderError(f"SPOTPIPE_LOCAL_CAPACITY {path}: cannot read it as JSON: {exc}") from exc
        if not isinstance(windows, list):
            raise ProviderError(f"SPOTPIPE_LOCAL_CAPACITY {path}: expected a list of windows")
        for index, window in enumerate(windows):
            ok = (isinstance(window, dict) and isinstance(window.get("pool"), str) and "@" in window["pool"]
                  and all(isinstance(window.get(k), int | float) for k in ("from_s", "to_s"))
                  and window.get("error", "InsufficientInstanceCapacity") in CAPACITY_CODES
                  and window.get("capacity_type", SPOT) in CAPACITY_TYPES)
            if not ok:
                raise ProviderError(
                    f"SPOTPIPE_LOCAL_CAPACITY {path}: window {index} is {window!r}; expected "
                    f'{{"pool": "TYPE@ZONE", "from_s": N, "to_s": N, "error": one of {sorted(CAPACITY_CODES)}, '
                    f'"capacity_type" (optional): one of {list(CAPACITY_TYPES)}}}')
        return cls(windows, _epoch(epoch_file))

    def error_for(self, pool_key: str, *, capacity_type: str = SPOT, now: float | None = None) -> str | None:
        """The error a launch of `capacity_type` into `pool_key` meets now, or None when it has capacity."""
        elapsed = (now if now is not None else time.time()) - self.epoch
        for window in self.windows:
            if (window["pool"] == pool_key and window.get("capacity_type", SPOT) == capacity_type
                    and window["from_s"] <= elapsed < window["to_s"]):
                return str(window.get("error", "InsufficientInstanceCapacity"))
        return None


def _epoch(path: Path) -> float:
    """The time stamped in `path`, stamping now if nobody has (the first process wins)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w") as out:
            out.write(repr(time.time()))
    for _ in range(50):  # another process created it and is writing
        text = path.read_text().strip()
        if text:
            return float(text)
        time.sleep(0.01)
    raise ProviderError(f"{path} holds no start time")
