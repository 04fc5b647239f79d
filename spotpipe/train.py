"""`spotpipe train`: train on this machine, without a control plane, as `torchrun` would.

The options come from flags, a job file, or both (flags win). It checks the job and opens its data
here first (so a bad source fails before any process starts, and the node cache is filled once for
every rank), starts the ranks as real processes, shows a progress line (step, loss, validation loss,
tokens/s, or samples/s when the samples are not token windows), and writes into the output folder:

- `metrics.jsonl`: one JSON object per step: `step` (steps done: 1 after the first), `loss`,
  `samples_per_s`, `tokens_per_s` (when the samples are token windows) and, when measured, `val_loss`;
- `spotpipe.json`: the resolved config, the data source with its content hash, the tokenizer, the
  final losses, the wall time and every recovery (`spotpipe.recoveries`: also one console line each);
- `tb/`: the same metrics as TensorBoard event files, when the `tensorboard` package is installed;
- `ranks/`: each rank's own metrics log and final parameters;
- `model*.safetensors` (+ `model.safetensors.index.json` when sharded) and `optimizer*.safetensors`:
  the final weights and AdamW state, written by the ranks (`runtime.checkpointing.export`); `spotpipe.json` then
  also names the `model` to build (`spotpipe.load_model(OUT)`, `spotpipe sample OUT`).

`--init-from DIR` starts from such a folder: with its optimizer state the run continues that job at
its `steps_done` (`--steps` is the total), with weights only it starts at step 0.

An output folder that already holds a run is refused unless `--overwrite`, which removes that run's
files first (`run_entries`): two runs' files are never mixed (an old shard index would win over new
weights). `--timeout` (no limit by default) stops every rank and names the last checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from runtime.checkpointing.durability import CHECKPOINTS
from runtime.config import (
    BYTE_VOCAB_SIZE,
    MODEL_PRESETS,
    USER_MODEL_KIND,
    DataSpec,
    JobConfig,
    LayoutError,
    build_job_config,
    contract_from_model_spec,
    each_error,
    explicit_layout,
    model_preset,
    plan_fields_problem,
    plan_nodes_problem,
    preset_vocabulary,
    resolve_strategy,
)
from runtime.models.hf_layout import HF_FOLDER
from spotpipe.jobfile import JobFileError, load_job_file
from spotpipe.recoveries import Recoveries, Recovery
from spotpipe.trackers import TrackerError, check_trackers, default_trackers, open_trackers

_FAIL = re.compile(r"^(kill|notice|stop):(\d+)@(\d+)$")
POLL_S = 0.5
RUN_ENTRIES = ("metrics.jsonl", "ranks", "tb", HF_FOLDER, CHECKPOINTS)
"""What a run writes into its output folder beside its export (`runtime.checkpointing.export.export_files`)."""


@dataclass(kw_only=True, slots=True)
class TrainOptions:
    """What `spotpipe train` was asked for; None: from the job file, else the contract's default."""

    file: Path | None = None
    data: str | None = None
    tokenizer: str | None = None
    model: str | None = None
    model_args: str | None = None
    """`--model-args JSON`: keyword arguments of a model function (`--model package.module:function`)."""
    dp: int | None = None
    pp: int | None = None
    microbatches: int | None = None
    global_batch: int | None = None
    steps: int | None = None
    strategy: str | None = None
    seed: int | None = None
    val_every: int | None = None
    lr: float | None = None
    lr_schedule: str | None = None
    """`--lr-schedule constant|cosine` (after the warmup)."""
    warmup: int | None = None
    """`--warmup STEPS`: linear warmup steps (`warmup_steps`)."""
    lr_min: float | None = None
    clip: float | None = None
    """`--clip NORM`: global gradient-norm clipping (0: off)."""
    weight_decay: float | None = None
    decay_min_dim: int | None = None
    """`--decay-min-dim 2`: decay only tensors with at least 2 dims (`weight_decay_min_dim`)."""
    betas: str | None = None
    """`--betas B1,B2`."""
    eps: float | None = None
    recompute: bool | None = None
    """`--recompute`: activation recomputation per layer."""
    skip_nonfinite: bool | None = None
    """`--skip-nonfinite`: skip (and count) a step whose gradient norm is not finite."""
    precision: str | None = None
    """`--precision bf16` or `fp16`: the forward under bfloat16 or float16 autocast (fp16 with dynamic
    loss scaling)."""
    device: str | None = None
    """`--device cuda`: every node on one GPU of its own (`JobConfig.device`)."""
    init_from: str | None = None
    export: str | None = None
    """`--export hf`: also OUT/hf, a Hugging Face GPT-2 folder (the contract's `export`)."""
    track: list[str] | None = None
    """`--track NAME` (repeatable; job file `tracking`): experiment trackers (`spotpipe.trackers.TRACKERS`)."""
    seq_len: int | None = None
    """`--seq-len N`: the model's context (`[config.model] seq_len`): the data's token windows."""
    vocab_size: int | None = None
    """`--vocab-size N`: the model's vocabulary (`[config.model] vocab_size`), at least the tokenizer's ids."""
    fails: list[str] = field(default_factory=list)
    out: Path = Path("var/train")
    overwrite: bool = False
    """`--overwrite`: train into an `out` that holds a run, its files removed first."""
    timeout_s: float | None = None
    """`--timeout SECONDS`: stop every rank after this long (None: no limit, as training asked for)."""


INTERRUPTED = 130
"""Exit status after Ctrl-C (128 + SIGINT, as a shell reports it)."""
TIMED_OUT = 124
"""Exit status after `--timeout` (as coreutils' `timeout` reports it)."""


class TrainError(ValueError):
    """Options that cannot run; the message names the option and what was expected."""


def parse_fail(text: str) -> Any:
    """`kill:RANK@STEP`, `notice:RANK@STEP` or `stop:RANK@STEP` as the launcher's fault."""
    from runtime.train.launcher import Fault

    match = _FAIL.match(text)
    if not match:
        raise TrainError(f"--fail {text!r}: expected KIND:RANK@STEP with KIND kill, notice or stop (e.g. kill:1@3)")
    return Fault(node=int(match[2]), kind=match[1], step=int(match[3]))


def resolve_config(options: TrainOptions) -> JobConfig:
    """The JobConfig of the job file (if any) with the flags applied; raises `JobFileError`,
    `LayoutError` (naming the field) or `TrainError`."""
    body = load_job_file(options.file) if options.file else {}
    plan = _plan_fields(body.get("plan"))
    if plan.get("auto") and options.dp is None:
        raise JobFileError(f"{options.file}: plan.auto needs a control plane's pools and prices (spotpipe submit); "
                           "to train here, give plan.dp and plan.pp (or --dp and --pp)")
    contract, total = (contract_from_model_spec(body["model_spec"]) if "model_spec" in body
                       else (dict(body.get("config") or {}), None))
    contract = json.loads(json.dumps(contract))  # a deep copy the flags can change
    if options.model is not None:
        contract["model"] = _model_dict(options.model, options.model_args)
    elif options.model_args is not None:
        model = contract.get("model")
        if not (isinstance(model, dict) and model.get("kind") == USER_MODEL_KIND):
            raise TrainError("--model-args: the model is not a model function; expected "
                             "--model package.module:function (or a job file's config.model with kind = py) with it")
        model["args"] = _model_args(options.model_args)
    elif not options.file:
        contract.setdefault("model", _preset_dict("gpt-nano"))
    data = contract.setdefault("data", {}) if (options.data or options.tokenizer) else contract.get("data", {})
    for key, value in (("source", options.data), ("tokenizer", options.tokenizer)):
        if value is not None:
            data[key] = value
    # A preset's vocabulary follows the tokenizer (gpt-nano is the default without a file or --model),
    # unless --vocab-size says otherwise; a user's model declares its own (or takes the flags).
    preset = options.model if options.model else (None if options.file else "gpt-nano")
    if preset in MODEL_PRESETS and options.vocab_size is None:
        contract["model"]["vocab_size"] = preset_vocabulary(_tokenizer_vocabulary(data), preset)
    for key in ("seq_len", "vocab_size"):
        if getattr(options, key) is not None:
            if not isinstance(contract.get("model"), dict):
                raise TrainError(f"--{key.replace('_', '-')}: the job has no model; expected --model with it")
            contract["model"][key] = getattr(options, key)
    tokenizer_ids = _tokenizer_vocabulary(data) if options.vocab_size is not None else None
    if tokenizer_ids is not None and options.vocab_size < tokenizer_ids:
        raise TrainError(f"--vocab-size {options.vocab_size} is below the tokenizer's {tokenizer_ids} ids; expected "
                         f"at least {tokenizer_ids}")
    for key in ("global_batch", "seed", "val_every", "lr", "init_from", "lr_schedule", "lr_min", "clip",
                "weight_decay", "eps", "recompute", "skip_nonfinite", "precision", "device", "export"):
        if getattr(options, key) is not None:
            contract[key] = getattr(options, key)
    for key, flag in (("warmup_steps", "warmup"), ("weight_decay_min_dim", "decay_min_dim")):
        if getattr(options, flag) is not None:
            contract[key] = getattr(options, flag)
    if options.betas is not None:
        try:
            contract["betas"] = [float(b) for b in options.betas.split(",")]
        except ValueError:
            raise TrainError(f"--betas {options.betas!r}: expected two numbers B1,B2 (e.g. 0.9,0.95)") from None
    layout = explicit_layout(
        dp=options.dp if options.dp is not None else plan.get("dp", 1),
        pp=options.pp if options.pp is not None else plan.get("pp", 1),
        microbatches=options.microbatches if options.microbatches is not None else plan.get("microbatches"),
        total_microbatches=total,
    )
    _check_nodes(plan.get("nodes"), dp=layout.get("dp", 1), pp=layout.get("pp", 1))
    strategy = options.strategy or body.get("strategy", "auto")
    steps = options.steps if options.steps is not None else body.get("target_steps", 100)
    return build_job_config(contract, **layout, strategy=resolve_strategy(strategy), steps=steps)


def _plan_fields(plan: Any) -> dict[str, Any]:
    """A job file's `plan` with the control plane's wording for what it refuses: not an object, or
    a field it does not know (a typo such as `ppp` would otherwise train dp=1 x pp=1)."""
    if plan is None or plan == "auto":
        return {"auto": plan == "auto"}
    if not isinstance(plan, dict):
        raise LayoutError(f"plan must be \"auto\" or an object, got {plan!r}"[:200], field="plan")
    if problem := plan_fields_problem(plan):
        raise problem
    return dict(plan)


def _check_nodes(nodes: Any, *, dp: int, pp: int) -> None:
    """`plan.nodes`, which this machine honours only as dp x pp: one process per worker, no spares."""
    if nodes is None:
        return
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise LayoutError(f"plan.nodes must be a positive integer, got {nodes!r}", field="plan.nodes")
    if problem := plan_nodes_problem(nodes, dp=dp, pp=pp):
        raise problem
    workers = dp * pp
    if nodes > workers:
        raise LayoutError(f"plan.nodes={nodes} asks for {nodes - workers} spare node(s); spotpipe train runs one "
                          f"process per worker (dp={dp} x pp={pp} = {workers}) and no spares; expected nodes = "
                          f"{workers}, or spotpipe submit for spares", field="plan.nodes")


def run_entries(out_dir: Path) -> list[Path]:
    """The files and folders of a run in `out_dir` (its export and `RUN_ENTRIES`); [] when it holds none."""
    from runtime.checkpointing.export import export_files

    return export_files(out_dir) + [out_dir / name for name in RUN_ENTRIES if (out_dir / name).exists()]


def check_out(options: TrainOptions, config: JobConfig) -> None:
    """Refuse an output folder that holds a run, unless `--overwrite` (and never one holding the
    `--init-from` it would clear): raises `TrainError`. Nothing is removed here (`_set_aside` does,
    once every check has passed)."""
    out_dir = options.out
    if out_dir.exists() and not out_dir.is_dir():
        raise TrainError(f"--out {out_dir} is a file; expected a folder (new, or one holding a run to replace with "
                         "--overwrite)")
    held = run_entries(out_dir)
    if not held:
        return
    init = Path(config.init_from).resolve() if config.init_from and "://" not in config.init_from else None
    if init is not None and init.is_relative_to(out_dir.resolve()):
        raise TrainError(f"--init-from {config.init_from} is inside --out {out_dir}, whose run a new one would "
                         f"replace; expected another --out, e.g. {out_dir}-continued")
    if not options.overwrite:
        names = ", ".join(p.name for p in held[:4]) + (", ..." if len(held) > 4 else "")
        raise TrainError(f"--out {out_dir} already holds a run ({names}); expected a new folder, or --overwrite to "
                         "replace that run (its weights, checkpoints, metrics and logs are removed first)")


def _tokenizer_vocabulary(data: dict[str, Any]) -> int | None:
    """The ids of the tokenizer that reads this job's text (None: no text source, or an s3 tokenizer
    not fetched here); a preset's vocabulary follows it."""
    if not DataSpec(source=str(data.get("source") or "")).tokenized:
        return None
    tokenizer = str(data.get("tokenizer") or "byte")
    if tokenizer == "byte":
        return BYTE_VOCAB_SIZE
    if tokenizer.startswith("s3://") or not Path(tokenizer).is_file():
        return None  # the nodes check it against the model
    from runtime.data.tokenizer import HFTokenizer

    return HFTokenizer(Path(tokenizer)).vocab_size


def _model_args(text: str) -> dict[str, Any]:
    try:
        args = json.loads(text)
    except ValueError as exc:
        raise TrainError(f"--model-args {text!r} is not JSON ({exc}); expected a JSON object, "
                         "e.g. '{\"width\": 64}'") from None
    if not isinstance(args, dict):
        raise TrainError(f"--model-args {text!r} is a JSON {type(args).__name__}; expected a JSON object of keyword "
                         "arguments")
    return args


def _model_dict(model: str, args: str | None) -> dict[str, Any]:
    """`--model`: a preset name, or a model function `package.module:function` (with `--model-args`)."""
    if ":" in model:
        return {"kind": USER_MODEL_KIND, "path": model, "args": _model_args(args) if args is not None else {}}
    if args is not None:
        raise TrainError(f"--model-args is for a model function; --model {model!r} is a preset "
                         "(expected --model package.module:function with it)")
    return _preset_dict(model)


def validate_user_model(config: JobConfig, batches: Any = None) -> None:
    """For a user's model: import it, check it (`runtime.train.model_check.validate_model`) and record its
    layer count and profiled per-layer costs into `config`, here, before any process starts; raises
    `LayoutError` (a `ModelError`) naming what is wrong."""
    if config.model.kind != USER_MODEL_KIND:
        return
    from runtime.train.model_check import validate_model

    validate_model(config, batches=batches).record(config)
    config.validate()


def _preset_dict(name: str) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(model_preset(name))


def prepare_here(config: JobConfig, *, out: TextIO) -> None:
    """`data.prepare` on one machine: prepare the source there with this machine's CPUs (or take the
    corpus already there, prepared from the same source), then train on `shards:` of it, as the
    fleet's prepare step does (`controlplane.jobs.prepare_step`)."""
    from runtime.data.prepare_share import run_share

    data = config.data
    print(f"preparing {data.source} into {data.prepare}", file=out, flush=True)
    done = run_share(source=data.source, tokenizer=data.tokenizer, out=data.prepare, share=(0, 1),
                     workers=os.cpu_count() or 1)
    print(f"prepared {data.prepare}" + (" (there already)" if done["prepared_before"] else
                                       f": {done['files']} files in {done['seconds']:.1f} s"), file=out, flush=True)
    config.data = data.prepared()


def run_train(options: TrainOptions, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Train; 0 when every step was done, 1 when the run failed, 2 for options or data that cannot run.
    `out`/`err` default to the streams of the call."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        if options.timeout_s is not None and not options.timeout_s > 0:
            raise TrainError(f"--timeout {options.timeout_s:g}: expected a number of seconds above 0 (or no --timeout: "
                             "no limit)")
        config = resolve_config(options)
        check_out(options, config)
        trackers = tracking_of(options)
        faults = [parse_fail(text) for text in options.fails]
        for fault in faults:
            if not 0 <= fault.node < config.dp * config.pp:
                raise TrainError(f"--fail {fault.kind}:{fault.node}@{fault.step}: rank {fault.node} does not exist; "
                                 f"expected 0..{config.dp * config.pp - 1} (dp={config.dp} x pp={config.pp})")
    except (JobFileError, TrainError, TrackerError) as exc:
        print(f"error: {exc}", file=err)
        return 2
    except LayoutError as exc:
        for problem in each_error(exc):
            print(f"error: {problem.field or 'config'}: {problem.message}", file=err)
        return 2
    if config.requirements:
        # One machine, one environment: what a node would pip-install must be installed here already.
        print(f"note: requirements {config.requirements} are not installed by spotpipe train; it runs on this "
              "environment (docs/runtime.md, 'Your code on the nodes')", file=err)
    from runtime.data.dataset import Batches, DataError
    from runtime.models.usermodel import apply_declaration

    try:
        apply_declaration(config)  # a user model's context sets the data's windows: known before they open
    except LayoutError as exc:
        for problem in each_error(exc):
            print(f"error: {problem.field or 'model'}: {problem.message}", file=err)
        return 2
    if config.data.prepare:
        try:
            prepare_here(config, out=out)
        except DataError as exc:
            print(f"error: data.prepare: {exc}", file=err)
            return 2
    try:
        batches = Batches(config)  # checks the data here and fills this machine's cache for every rank
    except DataError as exc:
        print(f"error: data.source: {exc}", file=err)
        return 2
    try:
        validate_user_model(config, batches)
    except LayoutError as exc:
        for problem in each_error(exc):
            print(f"error: {problem.field or 'model'}: {problem.message}", file=err)
        return 2
    data = batches.dataset.description if batches.dataset else {"source": "synthetic"}
    start = 0
    if config.init_from:
        from runtime.checkpointing.export import ExportError
        from runtime.models.load import initial_state
        from runtime.models.usermodel import meta_layers

        try:
            initial = initial_state(config.init_from, config.model)
            initial.check_fits(dict(enumerate(meta_layers(config))))  # a mismatch would crash every rank mid-run
            start = initial.start_step
        except (ExportError, OSError) as exc:
            print(f"error: init_from: {exc}", file=err)
            return 2
        if start >= config.steps:
            print(f"error: steps: init_from {config.init_from} continues a job that did {start} steps; "
                  f"--steps is the total, expected more than {start}", file=err)
            return 2
    try:
        return _launch(config, faults, data, options, out=out, err=err, start=start,
                       trackers=trackers)
    except TrackerError as exc:  # the tracker's run could not open: nothing of this run is left behind
        print(f"error: {exc}", file=err)
        return 2
    except KeyboardInterrupt:
        # run_local has ended every rank it started (its `finally`); one line, no traceback.
        print(f"\ninterrupted: every rank stopped; what was written so far is in {options.out}", file=err)
        return INTERRUPTED


def _launch(config: JobConfig, faults: list, data: dict[str, Any], options: TrainOptions, *,
            out: TextIO, err: TextIO, start: int = 0,
            trackers: list[str] | None = None) -> int:
    from runtime.train.launcher import run_local

    out_dir = options.out
    ranks = out_dir / "ranks"
    log = _open_log(out_dir, config, overwrite=options.overwrite, start=start, trackers=trackers)
    ranks.mkdir()
    name = config.model.path if config.model.kind == USER_MODEL_KIND else config.model.kind
    print(f"training {name} ({config.model.num_layers} layers) on {data.get('source')}: "
          f"dp={config.dp} x pp={config.pp}, {config.steps} steps, strategy {config.strategy}; output in {out_dir}",
          file=out, flush=True)
    progress = Progress(config, out)
    done = threading.Event()

    def follow() -> None:
        while not done.wait(POLL_S):
            progress.show(log.poll(ranks))
            for recovery in log.recoveries.new():
                progress.say(recovery.line())
                log.told(recovery)

    watcher = threading.Thread(target=follow, daemon=True)
    watcher.start()
    timeout_s = options.timeout_s if options.timeout_s is not None else math.inf
    try:
        result = run_local(config, faults=faults, timeout_s=timeout_s, out_dir=ranks, export_dir=out_dir)
    except TimeoutError:  # run_local has ended every rank it started; said below, with where to continue from
        result = None
    finally:
        done.set()
        watcher.join()
        log.poll(ranks, final=True)
        for recovery in log.recoveries.new(final=True):
            progress.say(recovery.line())
            log.told(recovery)
        log.close({"weights": str(out_dir.resolve())})
    progress.finish(log)
    if result is None:
        failed = [f"timed out after {timeout_s:g} s"]
    else:
        failed = [r["reason"] for r in result.records if r.get("event") == "job_failed"]
    summary = log.summary(config, data, wall_s=result.wall_s if result else timeout_s,
                          failed=failed[0] if failed else None)
    from runtime.checkpointing.export import ExportError, WeightsFolder, model_entry, write_json

    summary["model"] = model_entry(config.model)  # what spotpipe.load_model builds
    summary["init_from"] = config.init_from or None
    write_json(out_dir / "spotpipe.json", summary)
    if result is None:
        print(f"error: {timed_out(config, out_dir, timeout_s, steps_done=log.last_step + 1)}", file=err)
        return TIMED_OUT
    if failed:
        print(f"error: the job failed: {failed[0]}", file=err)
        return 1
    if log.last_step + 1 < config.steps:
        print(f"error: the run stopped after {log.last_step + 1} of {config.steps} steps "
              f"(exit codes {result.exit_codes}); see {ranks}", file=err)
        return 1
    try:
        WeightsFolder(out_dir)  # the index is written last: its presence means every shard is there
    except ExportError as exc:
        print(f"error: all {config.steps} steps trained, but the final weights were not written (worker exit "
              f"codes {result.exit_codes}; see {ranks}): {exc}", file=err)
        return 1
    val = f", validation loss {log.last_val:.4f}" if log.last_val is not None else ""
    told = log.recoveries.summary()
    if told:
        lost_s = sum(r["seconds"] or 0.0 for r in told)
        val += (f"; {len(told)} recover{'y' if len(told) == 1 else 'ies'} ({lost_s:.2f} s, "
                f"{sum(r['steps_redone'] for r in told)} step(s) redone)")
    print(f"done: {config.steps} steps in {result.wall_s:.1f} s, "
          f"loss {log.first_loss:.4f} -> {log.last_loss:.4f}{val}; "
          f"metrics in {out_dir / 'metrics.jsonl'}, weights in {out_dir}/model*.safetensors", file=out)
    if config.export == "hf":  # written by the rank that completed the export
        from runtime.models.hf_layout import CONFIG, HF_FOLDER

        if not (out_dir / HF_FOLDER / CONFIG).is_file():
            print(f"error: the weights are in {out_dir}, but the Hugging Face folder was not written (see the "
                  f"exported events in {ranks}); spotpipe export-hf {out_dir} writes it", file=err)
            return 1
        _say_hf_folder(out_dir / HF_FOLDER, out)
    return 0


def timed_out(config: JobConfig, out_dir: Path, timeout_s: float, *, steps_done: int) -> str:
    """One line after `--timeout`: how far the run got and how to continue from its last checkpoint."""
    from runtime.checkpointing.checkpoints import Checkpoints

    said = (f"timed out: the run did not finish within --timeout {timeout_s:g} s ({steps_done} of {config.steps} "
            "steps done) and every rank was stopped; ")
    latest = Checkpoints(str(out_dir)).latest()
    if latest is None:
        return said + "no checkpoint was written yet to continue from: run it again with a longer --timeout (or none)"
    checkpoint = out_dir / CHECKPOINTS / f"step-{latest}"
    return (said + f"its last checkpoint is {checkpoint} (step {latest}): continue with the same options plus "
            f"--init-from {checkpoint} --out {out_dir}-continued")


def _open_log(out_dir: Path, config: JobConfig, *, overwrite: bool, start: int,
              trackers: list[str] | None) -> MetricsLog:
    """The run's metrics log and trackers, opened before any rank starts. With `overwrite` the old
    run's files are set aside first and removed once the trackers are open; a tracker that cannot
    open (`TrackerError`) leaves the folder as it was (the old run put back, nothing of this one)."""
    created = not out_dir.exists()
    aside = _set_aside(out_dir) if overwrite else None
    out_dir.mkdir(parents=True, exist_ok=True)
    before = set(out_dir.iterdir())
    try:
        log = MetricsLog(out_dir, config, start=start, trackers=trackers)
    except TrackerError:
        if created:
            shutil.rmtree(out_dir, ignore_errors=True)
        else:
            for path in set(out_dir.iterdir()) - before:
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()
            if aside is not None:
                for path in aside.iterdir():
                    path.rename(out_dir / path.name)
                aside.rmdir()
        raise
    if aside is not None:
        shutil.rmtree(aside)
    return log


def _set_aside(out_dir: Path) -> Path | None:
    """Move the run in `out_dir` (`run_entries`) into a hidden folder there; None when it holds none."""
    entries = run_entries(out_dir)
    if not entries:
        return None
    aside = out_dir / f".spotpipe-replaced-{os.urandom(4).hex()}"
    aside.mkdir()
    for path in entries:
        path.rename(aside / path.name)
    return aside


def tracking_of(options: TrainOptions) -> list[str] | None:
    """`--track` (else the job file's `tracking`), each known and installed; None: the default."""
    names = options.track if options.track is not None else (
        load_job_file(options.file).get("tracking") if options.file else None)
    if names is None:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise TrainError(f"tracking = {names!r}; expected a list of tracker names, e.g. [\"mlflow\"]")
    return check_trackers(names)


def run_export_hf(directory: str, target: Path | None, *, overwrite: bool = False, out: TextIO | None = None,
                  err: TextIO | None = None) -> int:
    """`spotpipe export-hf DIR [--out OUT] [--overwrite]`: 0 when written, 2 when DIR cannot be
    exported or OUT would lose weights (`write_hf_folder`)."""
    out, err = out or sys.stdout, err or sys.stderr
    from runtime.checkpointing.export import ExportError
    from runtime.train.hf_folder import write_hf_folder

    try:
        written = write_hf_folder(directory, target, overwrite=overwrite)
    except (ExportError, OSError) as exc:
        print(f"error: {exc}", file=err)
        return 2
    _say_hf_folder(written, out)
    return 0


def _say_hf_folder(folder: Path, out: TextIO) -> None:
    print(f"Hugging Face folder: {folder} (transformers.AutoModelForCausalLM.from_pretrained and "
          "AutoTokenizer.from_pretrained load it)", file=out)


class MetricsLog:
    """Merges the ranks' records into one record per step, appended to `metrics.jsonl` once the
    step is complete (its loss, and its validation loss when one is due), and to the experiment
    trackers (`spotpipe.trackers`)."""

    def __init__(self, out_dir: Path, config: JobConfig, *, start: int = 0, trackers: list[str] | None = None,
                 run_name: str = "") -> None:
        self.config = config
        # The trackers first: one that cannot open leaves no file of this run behind.
        self.trackers = open_trackers(trackers if trackers is not None else default_trackers(), out_dir=out_dir,
                                      config=config.to_dict(), run_name=run_name or out_dir.name)
        self.path = out_dir / "metrics.jsonl"
        self.path.write_text("")
        self.steps: dict[int, dict[str, Any]] = {}
        self.start = start  # the first step this run trains (init_from continues a job there)
        self.written = start - 1
        self._offsets: dict[Path, int] = {}
        self.tracking: list[dict[str, Any]] = []
        self.tokens_per_sample = config.tokens_per_sample
        self.recoveries = Recoveries()

    def poll(self, ranks: Path, *, final: bool = False) -> dict[str, Any] | None:
        """Read the ranks' logs, write the steps now complete; returns the newest step's record."""
        for path in sorted(ranks.glob("metrics-*.jsonl")):
            for record in self._new_records(path):
                self.recoveries.add(record)
                if "step" not in record or "event" in record:
                    continue
                # Keyed by the runtime's step index; written as steps done (1-based), as the console,
                # spotpipe.json, checkpoints (step-N) and the control plane count.
                merged = self.steps.setdefault(record["step"], {"step": record["step"] + 1})
                if record.get("loss") is not None and "loss" not in merged:
                    merged["loss"] = record["loss"]
                    merged["samples_per_s"] = self.config.global_batch / record["step_time_s"]
                    if self.tokens_per_sample is not None:
                        merged["tokens_per_s"] = merged["samples_per_s"] * self.tokens_per_sample
                if record.get("val_loss") is not None and "val_loss" not in merged:
                    merged["val_loss"] = record["val_loss"]
        with open(self.path, "a") as fh:
            while self.written + 1 in self.steps:
                record = self.steps[self.written + 1]
                due = self.config.validation_due(record["step"])
                if "loss" not in record or (due and "val_loss" not in record and not final):
                    break
                fh.write(json.dumps(record) + "\n")
                self._to_trackers(record)
                self.written += 1
        return self.steps.get(self.written) if self.written >= self.start else None

    def _new_records(self, path: Path) -> list[dict[str, Any]]:
        """The complete records appended to `path` since the last poll (each poll reads only what is
        new: re-reading whole logs every poll grew with the run, on the workers' cores)."""
        offset = self._offsets.get(path, 0)
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                chunk = fh.read()
        except OSError:
            return []
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a torn last line is read again next time
        self._offsets[path] = offset + len(complete)
        return [json.loads(line) for line in complete.splitlines() if line.strip()]

    def _to_trackers(self, record: dict[str, Any]) -> None:
        metrics = {k: record[k] for k in ("loss", "val_loss", "samples_per_s", "tokens_per_s") if k in record}
        for tracker in self.trackers:
            tracker.log(record["step"], metrics)

    def told(self, recovery: Recovery) -> None:
        """A recovery for the trackers: the count so far and its seconds, at the last step written."""
        metrics = {"recoveries": float(len(self.recoveries.told))}
        if recovery.seconds is not None:
            metrics["recovery_s"] = recovery.seconds
        for tracker in self.trackers:
            tracker.log(max(self.written + 1, 0), metrics)

    def close(self, outputs: dict[str, str]) -> None:
        """Close the trackers' runs with `outputs` (where the weights are)."""
        self.tracking = [tracker.finish(outputs) for tracker in self.trackers]

    @property
    def last_step(self) -> int:
        return self.written

    @property
    def first_loss(self) -> float:
        return self.steps[self.start]["loss"]

    @property
    def last_loss(self) -> float:
        return self.steps[self.written]["loss"]

    @property
    def last_val(self) -> float | None:
        vals = [r["val_loss"] for s, r in sorted(self.steps.items()) if "val_loss" in r]
        return vals[-1] if vals else None

    def summary(self, config: JobConfig, data: dict[str, Any], *, wall_s: float, failed: str | None) -> dict[str, Any]:
        """What `spotpipe.json` holds."""
        done = [r for s, r in sorted(self.steps.items()) if self.start <= s <= self.written]
        return {
            "config": config.to_dict(),
            "data": data,
            "tokenizer": config.data.tokenizer if config.data.source else None,
            "steps_done": self.written + 1,
            "final_loss": done[-1]["loss"] if done else None,
            "final_val_loss": self.last_val,
            "wall_s": wall_s,
            "failed": failed,
            "recoveries": self.recoveries.summary(),
            "tracking": self.tracking,
        }



class Progress:
    """One progress line: rewritten in place on a terminal, a new line per step elsewhere (logs)."""

    def __init__(self, config: JobConfig, out: TextIO) -> None:
        self.steps = config.steps
        self.out = out
        self.tty = hasattr(out, "isatty") and out.isatty()
        self.shown = -1
        self.started = time.monotonic()

    def show(self, record: dict[str, Any] | None) -> None:
        if record is None or record["step"] == self.shown:
            return
        self.shown = record["step"]
        done = record["step"]
        width = 24
        bar = "#" * (width * done // max(self.steps, 1))
        val = f" val {record['val_loss']:.4f}" if "val_loss" in record else ""
        rate = (f"{record['tokens_per_s']:,.0f} tok/s" if "tokens_per_s" in record
                else f"{record.get('samples_per_s', 0):,.1f} samples/s")
        line = (f"step {done:>{len(str(self.steps))}}/{self.steps} [{bar:<{width}}] loss {record['loss']:.4f}{val} "
                f"{rate}")
        print(f"\r{line}" if self.tty else line, end="" if self.tty else "\n", file=self.out, flush=True)

    def say(self, line: str) -> None:
        """A line of its own above the progress line (which a terminal then redraws below it)."""
        print(f"\r{line}\033[K" if self.tty else line, file=self.out, flush=True)
        if self.tty and self.shown >= 0:
            self.shown = -1  # redraw the progress line on the next update

    def finish(self, log: MetricsLog) -> None:
        self.show(log.steps.get(log.written))
        if self.tty:
            print(file=self.out)
