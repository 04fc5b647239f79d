"""`spotpipe-agent`: the per-node daemon.

It enrols with the control plane (an acquisition's enrolment key, or a ready agent token),
heartbeats, long-polls for commands, watches the metadata endpoint and forwards a notice the
moment it appears, runs the runtime worker for its assignment and hands it new generations, and
reports the worker's metrics in batches. Every call to the control plane retries with backoff, so
the agent rides out a control-plane restart. On SIGTERM it stops its worker and exits.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlparse

from agent.client import ControlPlaneClient, ControlPlaneError, Stopped
from agent.command import AgentCommand
from agent.metadata import MetadataWatcher, make_watcher
from agent.prepare import WAIT_FOR_SHARES_S, PrepareFailed, run_share
from agent.profile import PROFILE_TIMEOUT_S, ProfileFailed, run_node_profile
from agent.requirements import InstallFailed, job_python, job_requirements
from agent.supervisor import WorkerSupervisor
from runtime.config import UPLOAD_PREFIX
from runtime.worker_exits import EXIT_FENCED, EXIT_JOB_FAILED, NOT_CRASHES

# What a worker's `metrics` message carries into the control plane's sample (POST /jobs/{id}/metrics/):
# a training step's loss and speed, or a validation pass's val_loss (a message without loss).
LOG_TAIL_LINES = 20
"""Lines of a crashed worker's log sent with its exit (the job's `end_log` when crashes end it)."""
METRIC_KEYS = ("step", "loss", "val_loss", "samples_per_s", "stage_times", "generation")

logger = logging.getLogger("spotpipe.agent")


@dataclass(kw_only=True)
class AgentConfig:
    control_plane: str
    enroll_key: str = ""
    token: str = ""
    instance: int | None = None
    cloud: str = "aws"
    metadata_url: str | None = None
    heartbeat_s: float = 0.5
    metadata_poll_s: float = 0.1
    commands_wait_s: float = 20.0
    metrics_flush_s: float = 0.5
    profile_timeout_s: float = PROFILE_TIMEOUT_S
    prepare_workers: int = 0
    """Local processes a share of a prepare step tokenizes with (0: this node's CPUs)."""
    prepare_poll_s: float = WAIT_FOR_SHARES_S
    """How often a node with no share left to take asks again during a prepare step."""
    work_dir: Path = Path("/var/lib/spotpipe")
    worker_module: str = "agent.worker_entry"
    address: str = ""
    install_requirements: bool = True
    """Install a job's `requirements` into a per-job venv (every node, the local provider's too);
    False (`--no-requirements`): run every job on the agent's own environment."""
    gpu_index: int = 0
    """Which of this VM's GPUs a `device = "cuda"` job's worker uses (`CUDA_VISIBLE_DEVICES`
    numbering): the worker's spec carries it to `WorkerSpec.device_index`. Ignored on the CPU."""


def _local_address(control_plane: str) -> str:
    """The address this node uses to reach the control plane (what its peers should dial)."""
    parsed = urlparse(control_plane)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((parsed.hostname or "127.0.0.1", parsed.port or 80))
            return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"


class Agent:
    def __init__(self, config: AgentConfig, *, watcher: MetadataWatcher | None = None) -> None:
        self.config = config
        self.stop_event = threading.Event()
        self.client = ControlPlaneClient(config.control_plane, token=config.token, stop=self.stop_event)
        self.watcher = watcher if watcher is not None else (
            make_watcher(config.cloud, config.metadata_url) if config.metadata_url or config.cloud else None)
        self.instance_id = config.instance
        self.job_id: int | None = None
        self.address = config.address or _local_address(config.control_plane)
        self.metrics: queue.Queue[dict] = queue.Queue()
        self.supervisor = WorkerSupervisor(config.work_dir, worker_module=config.worker_module,
                                           gpu_index=config.gpu_index,
                                           on_message=self._on_worker_message, on_exit=self._on_worker_exit)
        self.last_command: AgentCommand | None = None
        self.notices_forwarded: list[dict] = []
        self._restart = threading.Event()
        self._failure = ""  # why the runtime said the job cannot go on (from the worker's `failed` line)
        self._failed_installs: set[int] = set()  # jobs whose requirements failed here (reported once)
        self._profiled: set[int] = set()  # jobs whose model this node profiled (`profile` commands)
        self._preparing: tuple[int, threading.Thread, threading.Event] | None = None  # (job, its shares' thread, stop)
        self._rotate_at: float | None = None  # time.monotonic() at which to rotate the agent token

    # --- lifecycle --------------------------------------------------------------------------------------
    def stop(self, *_args: object) -> None:
        self.stop_event.set()

    def on_signal(self, *_args: object) -> None:
        """SIGTERM/SIGINT: stop now, even from inside a held long-poll (the handler runs in the main
        thread, so raising unwinds it into `run`'s cleanup)."""
        self.stop_event.set()
        raise Stopped()

    def enroll(self) -> None:
        if self.client.token:
            return
        if not self.config.enroll_key:
            raise SystemExit("spotpipe-agent: give --token or SPOTPIPE_ENROLL_KEY")
        provider_id = self._retry(self.watcher.instance_id)
        # AWS: the signed instance identity document proves this is the launched instance.
        document, signature = self._retry(self.watcher.identity) if hasattr(self.watcher, "identity") else ("", "")
        answer = self.client.enroll(enroll_key=self.config.enroll_key, provider_instance_id=provider_id,
                                    address=self.address, identity_document=document, identity_signature=signature)
        self.client.token = answer["token"]
        self._schedule_rotation(answer.get("expires_at"))
        self.instance_id = answer["instance"]
        self.job_id = answer.get("job")
        logger.info("enrolled as instance %s (%s) for job %s", self.instance_id, provider_id, self.job_id)

    def _schedule_rotation(self, expires_at: str | None) -> None:
        """Rotate at half the token's remaining life: early enough to ride out a long outage."""
        if not expires_at:
            self._rotate_at = None
            return
        left = (datetime.fromisoformat(expires_at.replace("Z", "+00:00")) - datetime.now(UTC)).total_seconds()
        self._rotate_at = time.monotonic() + max(0.0, left / 2)

    def _rotate_token_if_due(self) -> None:
        if self._rotate_at is None or time.monotonic() < self._rotate_at:
            return
        try:
            answer = self.client.rotate_token()
        except ControlPlaneError as exc:
            # Refused (the node ended, say): the next heartbeat's 401 stops the agent if so.
            logger.warning("token rotation refused (%s); trying again in a minute", exc)
            self._rotate_at = time.monotonic() + 60.0
            return
        self._schedule_rotation(answer.get("expires_at"))
        logger.info("agent token rotated; the new one expires at %s", answer.get("expires_at"))

    def _retry(self, fn, *, delay: float = 0.1):
        while not self.stop_event.is_set():
            try:
                return fn()
            except Exception as exc:  # the metadata endpoint may not be up yet
                logger.info("%s failed (%s); retrying", getattr(fn, "__name__", fn), exc)
                if self.stop_event.wait(delay):
                    break
                delay = min(delay * 2, 3.0)
        raise Stopped()

    def run(self) -> int:
        try:
            self.enroll()
            threads = [threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True),
                       threading.Thread(target=self._metrics_loop, name="metrics", daemon=True)]
            if self.watcher is not None:
                threads.append(threading.Thread(target=self._watch_loop, name="metadata", daemon=True))
            for thread in threads:
                thread.start()
            self._command_loop()
        except Stopped:
            pass
        finally:
            self.stop_event.set()
            self.supervisor.stop()
            self._flush_metrics(final=True)
        return 0

    # --- loops -------------------------------------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        while not self.stop_event.is_set():
            started = time.monotonic()
            try:
                self._rotate_token_if_due()
                self.client.heartbeat(instance_id=self.instance_id, address=self.address)
            except ControlPlaneError as exc:
                if exc.status in (401, 403, 404, 409):
                    # The instance ended or the token was revoked: this node is done.
                    logger.warning("heartbeat refused (%s); stopping", exc)
                    self.stop()
                    return
            except Stopped:
                return
            self.stop_event.wait(max(0.0, self.config.heartbeat_s - (time.monotonic() - started)))

    def _watch_loop(self) -> None:
        while not self.stop_event.is_set():
            try:
                for notice in self.watcher.poll():
                    logger.warning("notice in metadata: %s %s deadline %s", notice.kind, notice.action,
                                   notice.deadline_iso())
                    if notice.kind == "interruption":
                        # The worker leaves at its next step boundary without waiting for the
                        # control plane's new generation (which follows).
                        (self.config.work_dir / "notice").write_text(notice.deadline_iso() or "")
                    answer = self.client.notice(kind=notice.kind, action=notice.action, deadline=notice.deadline_iso(),
                                                cloud=notice.cloud, raw=notice.raw)
                    self.notices_forwarded.append({"kind": notice.kind, "at": time.time(), "answer": answer})
            except Stopped:
                return
            except Exception as exc:
                logger.info("metadata poll failed: %s", exc)
            self.stop_event.wait(self.config.metadata_poll_s)

    def _command_loop(self) -> None:
        version = ""
        while not self.stop_event.is_set():
            wait = 0.0 if self._restart.is_set() else self.config.commands_wait_s
            try:
                command = AgentCommand.from_dict(self.client.commands(version=version, wait_s=wait))
            except ControlPlaneError as exc:
                if exc.status in (401, 403, 404):
                    logger.warning("commands refused (%s); stopping", exc)
                    return
                raise
            if command.version != version or self._restart.is_set():
                logger.info("command %s: %s", command.version, command.action)
                self._record(command)
                self._restart.clear()
                version = command.version
                self._apply(command)
            if command.action == "stop" and command.job is None:
                return

    def _record(self, command: AgentCommand) -> None:
        """Append what arrived and when to `commands.jsonl` (benchmarks read delivery times here)."""
        with open(self.config.work_dir / "commands.jsonl", "a") as log:
            log.write(json.dumps({"at": time.time(), "version": command.version, "action": command.action,
                                  "generation": command.generation_number}) + "\n")

    def _apply(self, command: AgentCommand) -> None:
        self.last_command = command
        action = command.action
        if action != "prepare":
            self._stop_preparing()
        if command.job is not None:
            self.job_id = command.job.id
        if action in ("run", "standby") and command.job.status == "stopping":
            # A limit stops the job: its worker checkpoints and exits; nothing new starts for it.
            self.supervisor.request_stop(command.job.id)
            return
        if action == "run":
            python = None
            if self.supervisor.needs_start(command):
                python = self._job_python(command)
                if python is None:
                    return  # its requirements failed to install: reported once, nothing to run
            what = self.supervisor.apply(command, python=python)
            logger.info("generation %s: %s", command.generation_number, what)
        elif action == "profile":
            self._profile(command)
        elif action == "prepare":
            self._prepare(command)
        elif action == "standby":
            # Not a member: a running worker leaves at its next iteration boundary.
            if not self.supervisor.hand_over(command):
                self.supervisor.stop()
        else:
            self.supervisor.stop()

    def _job_python(self, command: AgentCommand) -> str | None:
        """The python the job's worker runs on, its requirements installed first (None: they could
        not be; the job is reported failed once, and not tried again on this node)."""
        job = command.job
        if job.id in self._failed_installs:
            return None
        if not self.config.install_requirements:
            if job_requirements(job.config):
                self._event("requirements_output", message="requirements not installed: this node runs jobs on "
                                                           "its own environment (--no-requirements)")
            return sys.executable
        try:
            return job_python(job.id, job.config, work_dir=self.config.work_dir, fetch=self._fetch_package,
                              on_line=lambda line: self._event("requirements_output", message=line),
                              stop=self.stop_event)
        except InstallFailed as exc:
            if self.stop_event.is_set():
                return None
            self._failed_installs.add(job.id)
            logger.warning("job %s: requirements not installed: %s", job.id, exc.reason)
            self._event("requirements_failed", generation=self._command_generation(), message=exc.reason)
            return None

    def _profile(self, command: AgentCommand) -> None:
        """The job waits for its first node's profile of its model function (`plan: auto` sent
        without the model's measures): measure it here, in the job's environment and on its data
        (`runtime.train.node_profile`), and send the profile; a model that cannot run fails the job."""
        job = command.job
        if job.id in self._profiled:
            return
        python = self._job_python(command)
        if python is None:
            return  # its requirements failed to install: reported once
        self._profiled.add(job.id)
        try:
            profile = run_node_profile(python, job.config, work_dir=self.config.work_dir,
                                       timeout_s=self.config.profile_timeout_s)
        except ProfileFailed as exc:
            logger.warning("job %s: the model could not be profiled: %s", job.id, exc.reason)
            self._event("profile_failed", message=exc.reason)
            return
        try:
            self.client.profile(**profile)
        except ControlPlaneError as exc:
            if exc.status != 409:  # 409: planned already (a profile sent before this agent restarted)
                logger.warning("job %s: the profile was refused: %s", job.id, exc)
                self._event("profile_failed", message=f"the control plane refused the profile: {exc}"[:300])
        except Stopped:
            return

    def _prepare(self, command: AgentCommand) -> None:
        """The job prepares its data into shards before it trains (`config.data.prepare`): take shares
        of it, one after another, in a thread of their own, so commands and notices are still heard."""
        job_id = command.job.id
        if self._preparing is not None and self._preparing[0] == job_id and self._preparing[1].is_alive():
            return
        stop = threading.Event()
        thread = threading.Thread(target=self._prepare_shares, args=(command, stop), name="prepare", daemon=True)
        self._preparing = (job_id, thread, stop)
        thread.start()

    def _stop_preparing(self) -> None:
        if self._preparing is not None:
            self._preparing[2].set()
            self._preparing = None

    def _prepare_shares(self, command: AgentCommand, stop: threading.Event) -> None:
        job_id = command.job.id
        python = self._job_python(command)
        if python is None:
            return  # its requirements failed to install: reported once
        try:
            while not (stop.is_set() or self.stop_event.is_set()):
                try:
                    claim = self.client.prepare_claim()
                except ControlPlaneError as exc:  # 409: this node is not running yet, or no more
                    logger.info("job %s: no share now (%s)", job_id, exc)
                    stop.wait(self.config.prepare_poll_s)
                    continue
                if claim["state"] == "waiting":
                    stop.wait(self.config.prepare_poll_s)
                    continue
                if claim["state"] != "assigned":
                    return  # prepared (a generation follows) or the job ended
                logger.info("job %s: preparing share %s/%s of %s", job_id, claim["share"], claim["of"], claim["source"])
                try:
                    result = run_share(python, claim, stop=stop, workers=self.config.prepare_workers,
                                       on_line=lambda line: logger.info("prepare: %s", line))
                except PrepareFailed as exc:
                    logger.warning("job %s: share %s not prepared: %s", job_id, claim["share"], exc.reason)
                    self._event("prepare_failed", message=exc.reason)
                    return
                if result:
                    self._report_share(result)
        except Stopped:
            return

    def _report_share(self, result: dict) -> None:
        try:
            self.client.prepare_done(**{k: result[k] for k in ("share", "of", "index_written", "files",
                                                                "input_bytes", "seconds")})
        except ControlPlaneError as exc:
            # 409: the share went to another node meanwhile (this one was taken for lost); ask again.
            logger.warning("share %s/%s report refused: %s", result["share"], result["of"], exc)

    def _fetch_package(self, entry: str) -> Path:
        """The local copy of an `upload:<sha256>` (from the control plane) or `s3://` requirement."""
        if entry.startswith(UPLOAD_PREFIX):
            sha256 = entry.removeprefix(UPLOAD_PREFIX)
            return self.client.download(f"packages/{sha256}/", self.config.work_dir / "packages" / sha256)
        from runtime.data.s3 import fetch

        return fetch(entry, self.config.work_dir / "packages").path

    # --- worker callbacks --------------------------------------------------------------------------------
    def _on_worker_message(self, message: dict) -> None:
        kind = message.get("type")
        if kind == "metrics":
            sample = {k: message[k] for k in METRIC_KEYS if message.get(k) is not None}
            sample["at"] = datetime.now(UTC).isoformat()
            self.metrics.put(sample)
        elif kind == "generation":
            self._event("generation_applied", generation=message.get("generation"), step=message.get("step"))
        elif kind == "failed":
            self._failure = str(message.get("reason") or "the runtime cannot go on")
        elif kind == "spare":
            # The runtime had no slot for this replacement (more joined than there were holes): it
            # stands by outside the group until a later generation takes it or the job ends, and the
            # node is paid for meanwhile, so the job's timeline says so.
            self._event("worker_spare", generation=self._command_generation(),
                        message=f"runtime generation {message.get('generation')} has no slot for this node; "
                                "it stands by as a spare")

    def _on_worker_exit(self, code: int, deliberate: bool) -> None:
        if deliberate or self.stop_event.is_set():
            return
        self._flush_metrics(final=True)
        generation = self._command_generation()
        failure, self._failure = self._failure, ""
        crashed = code not in NOT_CRASHES
        self._event("worker_exit", code=code, generation=generation, message=failure,
                    log_tail=self.supervisor.log_tail(LOG_TAIL_LINES) if crashed else None)
        if code in (EXIT_JOB_FAILED, EXIT_FENCED):
            # The job is over (the control plane fails it), or it dropped this node and went on: a
            # worker restarted as it was would fail again, in a loop.
            return
        if code != 0 and self.last_command and self.last_command.action == "run":
            self._restart.set()

    def _command_generation(self) -> int | None:
        """The control plane's generation number of the last command (what the worker runs)."""
        return self.last_command.generation_number if self.last_command else None

    def _event(self, kind: str, **fields) -> None:
        try:
            self.client.event(kind=kind, **fields)
        except (Stopped, ControlPlaneError) as exc:
            logger.info("could not report %s: %s", kind, exc)

    def _metrics_loop(self) -> None:
        while not self.stop_event.wait(self.config.metrics_flush_s):
            self._flush_metrics()

    def _flush_metrics(self, *, final: bool = False) -> None:
        batch: list[dict] = []
        while len(batch) < 500:
            try:
                batch.append(self.metrics.get_nowait())
            except queue.Empty:
                break
        if not batch or self.job_id is None:
            return
        try:
            if final:
                # At shutdown, one try only: the control plane may be gone too.
                self.client.request("POST", f"jobs/{self.job_id}/metrics/", json={"samples": batch}, retry=False)
            else:
                self.client.metrics(job_id=self.job_id, samples=batch)
        except (Stopped, ControlPlaneError) as exc:
            logger.info("dropped %d metric samples: %s", len(batch), exc)


def _gpu_index(text: str) -> int:
    try:
        index = int(text)
    except ValueError:
        index = -1
    if index < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a GPU number, 0 or more (CUDA_VISIBLE_DEVICES "
                                         "numbering)")
    return index


def parse_args(argv: list[str] | None = None) -> AgentConfig:
    parser = argparse.ArgumentParser(prog="spotpipe-agent", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--control-plane", default=os.environ.get("SPOTPIPE_CONTROL_PLANE", "http://127.0.0.1:8000"))
    parser.add_argument("--token", default=os.environ.get("SPOTPIPE_AGENT_TOKEN", ""),
                        help="an agent token (else enrol with SPOTPIPE_ENROLL_KEY)")
    parser.add_argument("--instance", type=int, default=None, help="instance id of --token")
    parser.add_argument("--cloud", choices=["aws", "gcp", "azure"], default="aws")
    parser.add_argument("--metadata-url", default=None, help="metadata endpoint (default: the cloud's)")
    parser.add_argument("--heartbeat", type=float, default=0.5, help="seconds between heartbeats")
    parser.add_argument("--metadata-poll", type=float, default=0.1, help="seconds between metadata polls")
    parser.add_argument("--commands-wait", type=float, default=20.0, help="long-poll hold, seconds")
    parser.add_argument("--work-dir", type=Path, default=Path(os.environ.get("SPOTPIPE_WORK_DIR", "/var/lib/spotpipe")))
    parser.add_argument("--worker-module", default=os.environ.get("SPOTPIPE_WORKER_MODULE", "agent.worker_entry"))
    parser.add_argument("--address", default="", help="address peers dial (default: detected)")
    parser.add_argument("--no-requirements", action="store_true",
                        help="run jobs on this environment, without installing their requirements (local nodes)")
    parser.add_argument("--gpu-index", type=_gpu_index, metavar="N", default=os.environ.get("SPOTPIPE_GPU_INDEX", "0"),
                        help="which of this VM's GPUs (CUDA_VISIBLE_DEVICES numbering) a cuda job uses "
                             "(default: SPOTPIPE_GPU_INDEX, else 0)")
    parser.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s agent %(message)s")
    return AgentConfig(
        control_plane=args.control_plane, enroll_key=os.environ.get("SPOTPIPE_ENROLL_KEY", ""), token=args.token,
        instance=args.instance, cloud=args.cloud, metadata_url=args.metadata_url, heartbeat_s=args.heartbeat,
        metadata_poll_s=args.metadata_poll, commands_wait_s=args.commands_wait, work_dir=args.work_dir,
        worker_module=args.worker_module, address=args.address, install_requirements=not args.no_requirements,
        gpu_index=args.gpu_index,
    )


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    if config.token and config.instance is None:
        raise SystemExit("spotpipe-agent: --token needs --instance")
    agent = Agent(config)
    signal.signal(signal.SIGTERM, agent.on_signal)
    signal.signal(signal.SIGINT, agent.on_signal)
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
