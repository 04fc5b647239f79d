"""The client commands of `spotpipe`: submit a job file to a control plane, list and follow jobs,
cancel one, or train a job file here without a control plane. Each returns the process's exit
status: 0 done, 1 the control plane refused or failed (its message printed as it is), 2 bad usage
or an unreadable file."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from runtime.models.hf_layout import CONFIG as HF_CONFIG
from runtime.models.hf_layout import HF_FOLDER
from spotpipe.client import Client, ClientError, endpoint_from_environment
from spotpipe.jobfile import JobFileError, deadline_at_send, load_job_file

ENDED = ("finished", "failed", "cancelled", "stopped")  # controlplane.jobs.models.ENDED_JOB_STATUSES, over the wire
FOLLOW_POLL_S = 1.0


def _print_error(exc: ClientError, out: TextIO) -> None:
    print(f"error: {exc}", file=out)
    for field, messages in sorted(exc.errors.items()):
        for message in messages:
            print(f"  {field}: {message}", file=out)


def _client() -> Client:
    return Client(endpoint_from_environment())


def describe_plan(plan: dict[str, Any]) -> str:
    """One line: who chose the plan, the layout, and the planner's prediction when there is one."""
    pools = ", ".join(p["instance_type"] + (f"@{p['zone']}" if p.get("zone") else "") for p in plan.get("pools", []))
    if plan.get("profile") == "pending":
        return (f"planner plan: waiting for the first node ({plan.get('provider')}, one of {pools}) to profile the "
                "model; the job is planned from that profile")
    line = (f"{plan.get('chosen_by', '?')} plan: {plan.get('nodes')} {plan.get('provider')} node(s) on {pools} as "
            f"dp={plan.get('dp')} x pp={plan.get('pp')}, {plan.get('microbatches')} micro-batches per pipeline")
    predicted = plan.get("predicted")
    if predicted:
        line += (f"; predicted {predicted['hours'] * 3600:.1f} s, {estimated_cost(predicted)}, "
                 f"{predicted['samples_per_s']:.1f} samples/s")
    return line


def estimated_cost(predicted: dict[str, Any]) -> str:
    """The planner's cost estimate for the plan's capacity policy (`predicted.capacity`; spot for
    plans made before policies): spot, on-demand, or both for spot_then_on_demand."""
    capacity = predicted.get("capacity", "spot")
    spot = f"${predicted['cost_usd']:.4f} on spot"
    on_demand = predicted.get("on_demand_cost_usd")
    if capacity == "spot" or on_demand is None:
        return f"{spot} (estimate)"
    if capacity == "on_demand":
        return f"${on_demand:.4f} on demand (estimate)"
    return f"{spot}, ceiling ${on_demand:.4f} all on demand (estimates)"


def _guarded(command: Callable[..., int]) -> Callable[..., int]:
    """The command with the control plane's refusals and unreadable files turned into exit statuses:
    1 with the API's message field by field, 2 with what is wrong with the file."""

    @functools.wraps(command)
    def run(*args: Any, err: TextIO | None = None, **kwargs: Any) -> int:
        # The streams of this call, not the ones of the import: a default bound when the module was
        # first imported (say, under a test's captured output) may be closed by now.
        err = err or sys.stderr
        kwargs.setdefault("out", sys.stdout)
        try:
            return command(*args, **kwargs)
        except JobFileError as exc:
            print(f"error: {exc}", file=err)
            return 2
        except ClientError as exc:
            _print_error(exc, err)
            return 1

    return run


@_guarded
def submit(path: Path, *, out: TextIO = sys.stdout) -> int:
    from runtime.config import LayoutError, each_error

    body = load_job_file(path, at_send=True)
    try:
        body = validate_user_model(body)  # before anything is sent: the control plane never imports it
    except LayoutError as exc:
        raise JobFileError("\n".join(f"{path}: {p.field or 'model'}: {p.message}" for p in each_error(exc))) from None
    job = _client().submit(deadline_at_send(body))  # a duration counts from now, after the checks
    print(f"job {job['id']} submitted: {job['name']} ({job['status']})", file=out)
    print(f"  {describe_plan(job['plan'])}", file=out)
    return 0


def validate_user_model(body: dict[str, Any]) -> dict[str, Any]:
    """A job file's body with its user model (`config.model.kind = "py"`) checked here, where the
    code is (the control plane never imports it), and its layer count, per-layer measures (what
    `plan: auto` plans from) and profiled per-layer costs recorded in the contract
    (`config.model.layers`, `config.model.layer_measures`, `config.layer_costs`); raises
    `LayoutError` naming what is wrong. Other models: the body unchanged."""
    config = body.get("config")
    model = config.get("model") if isinstance(config, dict) else None
    if not (isinstance(model, dict) and model.get("kind") == "py"):
        return body
    from runtime.config import JobConfig
    from runtime.models.usermodel import apply_declaration
    from runtime.train.model_check import validate_model

    plan = body.get("plan") if isinstance(body.get("plan"), dict) else {}
    layout = {name: plan[name] if isinstance(plan.get(name), int) else 1 for name in ("dp", "pp", "microbatches")}
    job = JobConfig.from_dict({**config, **layout, "strategy": "none", "steps": 1})
    apply_declaration(job)
    report = validate_model(job, need_data=False)
    measured = {"layer_measures": [dataclasses.asdict(m) for m in report.measures]} if report.measures else {}
    body = {**body, "config": {**config, "model": {**model, "layers": report.num_layers, **report.declared,
                                                   **measured}}}
    if report.layer_costs is not None and config.get("layer_costs") is None:
        body["config"]["layer_costs"] = report.layer_costs
    return body


@_guarded
def jobs(*, out: TextIO = sys.stdout) -> int:
    listed = _client().jobs()  # before the header: a refusal prints nothing on stdout
    print(f"{'id':>6}  {'status':<12} {'steps':>13}  {'loss':>8}  {'layout':<10} name", file=out)
    for job in listed:
        plan = job.get("plan") or {}
        loss = f"{job['last_loss']:.4f}" if job.get("last_loss") is not None else "-"
        layout = f"{plan.get('dp', '?')}x{plan.get('pp', '?')}"
        print(f"{job['id']:>6}  {job['status']:<12} {job['steps_done']:>6}/{job['target_steps']:<6}  {loss:>8}  "
              f"{layout:<10} {job['name']}", file=out)
    return 0


@_guarded
def status(job_id: int, *, out: TextIO = sys.stdout) -> int:
    client = _client()
    job = client.job(job_id)
    loss = f", loss {job['last_loss']:.4f}" if job.get("last_loss") is not None else ""
    if job.get("last_val_loss") is not None:
        loss += f", val loss {job['last_val_loss']:.4f}"
    print(f"job {job['id']} {job['name']}: {job['status']} {job['status_message']}".rstrip(), file=out)
    print(f"  steps {job['steps_done']}/{job['target_steps']}{loss}, generation {job['current_generation']}, "
          f"strategy {job['strategy']}", file=out)
    print(f"  {describe_plan(job['plan'])}", file=out)
    if job.get("prepare"):
        print(f"  {describe_prepare(job['prepare'])}", file=out)
    print(f"  {describe_capacity(job)}", file=out)
    print(f"  {describe_spend(job)}", file=out)
    if job.get("end_reason"):
        print(f"  end reason: {job['end_reason']}" + (f" (exit code {job['exit_code']})"
                                                       if job.get("exit_code") is not None else ""), file=out)
        if job.get("end_log"):
            print("  last log lines:\n    " + "\n    ".join(job["end_log"].splitlines()), file=out)
    if job.get("queue_position"):
        print(f"  queued: position {job['queue_position']} in the team's queue", file=out)
    if job.get("deadline_unreachable_at"):
        print(f"  warning: the deadline became unreachable even on on-demand at {job['deadline_unreachable_at']}",
              file=out)
    # One more GET: the cost report carries the spot / on-demand split.
    report = client.call("GET", f"jobs/{job_id}/cost-report/")
    print(f"  {describe_cost(report)}", file=out)
    weights = describe_weights(client, job)
    if weights:
        print(f"  {weights}", file=out)
    for tracker in job.get("tracking") or []:
        print(f"  {describe_tracker(tracker)}", file=out)
    return 0


def describe_prepare(prepare: dict[str, Any]) -> str:
    """One line: how far the job's prepare step (`data.prepare`) is; it trains once every share is done."""
    if not prepare.get("shares"):
        return f"preparing the data into {prepare['out']}: waiting for the first node to take a share"
    return (f"preparing the data into {prepare['out']}: {prepare['done']}/{prepare['shares']} shares done, "
            f"{prepare['running']} being prepared; training starts when all are done")


def describe_tracker(tracker: dict[str, Any]) -> str:
    """One line: where a job's experiment tracker run is and how far the control plane logged it."""
    if not tracker.get("run_id"):
        state = "not opened yet (the control plane opens it with the job's first steps)"
    else:
        how = "closed" if tracker.get("ended") else "logging"
        state = f"run {tracker.get('run_name') or ''} {tracker['run_id']} at {tracker.get('where') or '?'}, " \
                f"{tracker.get('last_step', 0)} steps sent, {how}"
    error = f"; last error: {tracker['error']}" if tracker.get("error") else ""
    return f"tracking {tracker.get('name', '?')}: {state}{error}"


def describe_spend(job: dict[str, Any]) -> str:
    """One line: spend so far, the budget, and the projection at completion."""
    spend = job.get("spend") or {}
    budget = f" of ${spend['budget_usd']} budget" if spend.get("budget_usd") else " (no budget)"
    projected = f", projected ${spend['projected_usd']} at completion" if spend.get("projected_usd") else ""
    return f"spend ${spend.get('spent_usd', '?')}{budget} at ${spend.get('usd_per_hour', '?')}/h{projected}"


def describe_capacity(job: dict[str, Any]) -> str:
    """One line: the job's capacity policy and what its nodes are bought as now."""
    return f"capacity {job.get('capacity', '?')}, {job.get('capacity_type', '?')} now"


def describe_cost(report: dict[str, Any]) -> str:
    """One line from the job's cost report: the total, and spot and on-demand hours and cost apart."""
    split = report.get("by_capacity_type") or {}
    parts = [f"{label} {split[kind]['hours']} h ${split[kind]['cost_usd']}"
             for kind, label in (("spot", "spot"), ("on_demand", "on-demand")) if kind in split]
    line = f"cost: total ${report['total_usd']} ({report['billed_hours']} h)"
    return line + (f"; {', '.join(parts)}" if parts else "")


@_guarded
def logs(job_id: int, *, follow: bool, out: TextIO = sys.stdout) -> int:
    """Print the job's timeline; with `follow`, keep printing (and the progress) until the job ends."""
    client = _client()
    seen: set[int] = set()
    since: str | None = None

    def print_new(*, whole: bool = False) -> None:
        nonlocal since
        for event in client.events(job_id, since=None if whole else since):
            if event["id"] not in seen:
                seen.add(event["id"])
                print(f"{event['at']}  {event['kind']:<24} {event['message']}", file=out, flush=True)
                since = event["at"]

    progress = None
    while True:
        print_new()
        if not follow:
            return 0
        job = client.job(job_id)
        if (job["steps_done"], job["status"]) != progress:
            progress = (job["steps_done"], job["status"])
            loss = f" loss {job['last_loss']:.4f}" if job.get("last_loss") is not None else ""
            if job.get("last_val_loss") is not None:
                loss += f" val loss {job['last_val_loss']:.4f}"
            print(f"-- step {job['steps_done']}/{job['target_steps']}{loss} ({job['status']})", file=out, flush=True)
        if job["status"] in ENDED:
            # The whole timeline, not from `since`: an event is stamped when it is written but seen
            # when its transaction commits, so one stamped before `since` (the job's final status
            # and its job_finished event among them) can commit after a later one was printed.
            print_new(whole=True)
            return 0 if job["status"] == "finished" else 1
        time.sleep(FOLLOW_POLL_S)


@_guarded
def cancel(job_id: int, *, out: TextIO = sys.stdout) -> int:
    job = _client().cancel(job_id)
    print(f"job {job['id']} {job['status']}", file=out)
    return 0


@_guarded
def resume(job_id: int, *, budget: str | None = None, out: TextIO = sys.stdout) -> int:
    """Resume a stopped, cancelled or failed job (with a new total `budget` in USD, if given); says
    from which step (its newest checkpoint, or 0)."""
    job = _client().resume(job_id, budget_usd=budget)
    print(f"job {job['id']} {job['status']}: {job['resumed_from']['message']}", file=out)
    return 0


def _download_order(name: str) -> int:
    """Shards first, then the indexes (and a single-file model: the export's own "complete" mark, as
    config.json is the Hugging Face folder's), spotpipe.json last: a folder interrupted midway never
    looks like a finished one."""
    if name == "spotpipe.json":
        return 2
    return 1 if name.endswith(".index.json") or name in ("model.safetensors", f"{HF_FOLDER}/{HF_CONFIG}") else 0


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _megabytes(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"


@_guarded
def pull(job_id: int, directory: Path | None = None, *, out: TextIO = sys.stdout) -> int:
    """Download a finished (or stopped) job's weights into `directory` (default `job-<id>`), each
    file's size and sha256 checked against the listing; files already there and whole are kept, so
    an interrupted pull continues. 1 when the job has no complete weights yet."""
    client = _client()
    listing = client.artifacts(job_id)
    if not listing.get("complete"):
        job = client.job(job_id)
        raise ClientError(f"job {job_id} has no complete weights yet ({job['status']}, step {job['steps_done']} of "
                          f"{job['target_steps']}): its workers write them when it finishes or stops")
    files = sorted(listing["files"], key=lambda f: (_download_order(f["name"]), f["name"]))
    unsafe = [f["name"] for f in files if not _pullable(f["name"])]
    if unsafe:
        raise ClientError(f"the listing names files outside the job's folder and its {HF_FOLDER}/ folder: {unsafe}; "
                          "refusing to write them")
    target = Path(directory) if directory is not None else Path(f"job-{job_id}")
    target.mkdir(parents=True, exist_ok=True)
    if any(f["name"].startswith(f"{HF_FOLDER}/") for f in files):
        (target / HF_FOLDER).mkdir(exist_ok=True)
    total = sum(f["size"] for f in files)
    print(f"job {job_id}: {len(files)} files, {_megabytes(total)}, into {target}", file=out, flush=True)
    for k, f in enumerate(files, 1):
        dest = target / f["name"]
        if dest.is_file() and dest.stat().st_size == f["size"] and _sha256(dest) == f["sha256"]:
            print(f"  [{k}/{len(files)}] {f['name']}: already here, sha256 verified", file=out, flush=True)
            continue
        print(f"  [{k}/{len(files)}] {f['name']} ({_megabytes(f['size'])})", file=out, flush=True)
        client.download(job_id, f["name"], dest, size=f["size"], sha256=f["sha256"])
    print(f"done: every file's sha256 verified. Load them with:\n"
          f"  python -c 'import spotpipe; print(spotpipe.load_model(\"{target}\"))'", file=out)
    try:
        kind = json.loads((target / "spotpipe.json").read_text()).get("model", {}).get("kind")
    except (OSError, ValueError, AttributeError):
        kind = None
    if (target / HF_FOLDER / HF_CONFIG).is_file():
        print(f"  transformers.AutoModelForCausalLM.from_pretrained(\"{target / HF_FOLDER}\")   # the Hugging Face "
              "folder", file=out)
    if kind == "gpt":
        print(f"  spotpipe sample {target} --prompt 'Hello'   # or: spotpipe export-hf {target} (Hugging Face)",
              file=out)
    return 0


def _pullable(name: str) -> bool:
    """A listed name `pull` writes: a plain file name, or one inside the Hugging Face folder."""
    parts = name.split("/")
    plain = all(p and not p.startswith(".") and "\\" not in p for p in parts)
    return plain and (len(parts) == 1 or (len(parts) == 2 and parts[0] == HF_FOLDER))


def describe_weights(client: Client, job: dict[str, Any]) -> str | None:
    """One line for an ended job: where its weights are and how to fetch them (None while it runs)."""
    if job["status"] not in ENDED:
        return None
    listing = client.artifacts(job["id"])
    if not listing.get("complete"):
        return "weights: none complete (a job writes them when it finishes or stops)"
    size = _megabytes(sum(f["size"] for f in listing["files"]))
    return f"weights: {len(listing['files'])} files, {size} at {listing['location']}: spotpipe pull {job['id']}"
