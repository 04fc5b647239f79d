"""`spotpipe` console script: `spotpipe demo [options]` (docs/demo.md), and the client commands
`submit`, `jobs`, `status`, `logs`, `cancel`, `resume`, `pull` (a control plane's REST API), `train` (a job file
on this machine, no control plane), `sample` (text from a trained model's weights folder),
`export-hf` (a gpt preset's weights as a Hugging Face GPT-2 folder); see docs/client.md; and `data
prepare` / `data cache` (a corpus tokenized once into shards; this machine's data caches), docs/data.md."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from runtime.config import AUTO_STRATEGY, DEVICES, EXPORT_FORMATS, JOB_STRATEGIES, PRECISIONS
from runtime.traces import FORMATS as TRACE_FORMATS
from spotpipe.trackers import TRACKERS

CLIENT_COMMANDS = ("submit", "jobs", "status", "logs", "cancel", "resume", "pull", "train", "sample", "export-hf",
                   "data")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spotpipe", description="spotpipe: train on spot VMs.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="run a spot training fleet on this machine, end to end",
        description="Seed a market and a demo team, serve the control plane with a Celery worker and beat, "
                    "train a small GPT on local nodes under preemptions, then print its cost report.")
    demo.add_argument("--strategy", choices=JOB_STRATEGIES, default=AUTO_STRATEGY,
                      help=f"how the job survives preemptions (default: {AUTO_STRATEGY})")
    demo.add_argument("--nodes", type=int, default=4, help="nodes of the job (default 4: dp=2 x pp=2)")
    demo.add_argument("--trace", type=Path, help="a preemption trace file (Bamboo CSV, GCP counts or SkyPilot "
                                                 "JSON); default: a synthetic trace drawn with --seed")
    demo.add_argument("--trace-format", choices=tuple(TRACE_FORMATS), default=None,
                      help="how to read --trace: preemption-ticks (one node, JSON tick 1 = preempted), "
                           "availability-count (JSON tick = nodes available), bamboo-csv or gcp-counts; "
                           "default: the format the file names, else its line syntax")
    demo.add_argument("--prices", type=Path, help="a spot price history file (TSV/CSV, gzipped or not); default: "
                                                  "the bundled synthetic market drawn with --seed")
    demo.add_argument("--duration", type=float, default=150.0,
                      help="roughly how long the training should take, in seconds (default 150)")
    demo.add_argument("--seed", type=int, default=0, help="seeds the market, the trace, the notices and the job")
    demo.add_argument("--headless", action="store_true",
                      help="exit when the job is done: status 0 if it finished and learned (validation loss at most "
                           "0.8 x the corpus's unigram entropy); the figures go to var/demo-summary.json")
    demo.add_argument("--screenshot", type=Path, help="save a PNG of the job's dashboard page when it is done "
                                                      "(needs Chromium and playwright)")
    demo.add_argument("--external", metavar="URL", default="",
                      help="use the control plane already serving at URL (docker compose) instead of starting one; "
                           "its worker must run on this host (same process and network namespace)")
    demo.add_argument("--host", default="127.0.0.1", help="address of the web server (default 127.0.0.1)")
    demo.add_argument("--port", type=int, default=8000, help="port of the web server (default 8000)")

    connect = "the control plane in SPOTPIPE_URL / SPOTPIPE_TOKEN or ~/.config/spotpipe/credentials.toml"
    submit = sub.add_parser("submit", help=f"submit a job file (TOML) to {connect}")
    submit.add_argument("file", type=Path)
    sub.add_parser("jobs", help="list your teams' jobs")
    for name, text in (("status", "a job's status and plan"), ("cancel", "cancel a job")):
        sub.add_parser(name, help=text).add_argument("job", type=int)
    resume = sub.add_parser("resume", help="resume a stopped, cancelled or failed job from its newest checkpoint")
    resume.add_argument("job", type=int)
    resume.add_argument("--budget", help="the job's new total budget in USD (needed after a budget stop)")
    pull = sub.add_parser("pull", help="download a finished or stopped job's weights, checksums verified")
    pull.add_argument("job", type=int)
    pull.add_argument("dir", type=Path, nargs="?", help="where to put them (default job-ID)")
    logs = sub.add_parser("logs", help="a job's timeline")
    logs.add_argument("job", type=int)
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")
    add_train_parser(sub)
    add_sample_parser(sub)
    export = sub.add_parser(
        "export-hf", help="write the Hugging Face GPT-2 folder of a gpt preset's weights folder",
        description="Write config.json, model.safetensors (GPT-2 names) and the job's tokenizer, so "
                    "transformers.AutoModelForCausalLM.from_pretrained(OUT) loads the trained model.")
    export.add_argument("dir", help="a finished weights folder (spotpipe train --out, or a job's downloaded weights)")
    export.add_argument("--out", type=Path, help="where to write it (default DIR/hf); never DIR itself")
    export.add_argument("--overwrite", action="store_true",
                        help="replace the weights an --out folder already holds (refused without it)")
    return parser


def add_sample_parser(sub: argparse._SubParsersAction) -> None:
    """`spotpipe sample DIR --prompt TEXT --tokens N`: text from a language model's weights folder."""
    sample = sub.add_parser(
        "sample", help="print text sampled from a trained language model's weights folder",
        description="Load DIR (model*.safetensors + spotpipe.json, as spotpipe train --out or a job writes it; "
                    "or s3://bucket/prefix) and print the prompt followed by N sampled tokens, decoded with the "
                    "job's tokenizer (byte, or its tokenizer.json).")
    sample.add_argument("dir", help="weights folder or s3://bucket/prefix")
    sample.add_argument("--prompt", default="", help="text to continue (default: empty)")
    sample.add_argument("--tokens", type=int, default=200, help="tokens to sample (default 200)")
    sample.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (default 0.8)")
    sample.add_argument("--seed", type=int, default=0, help="seeds the sampling (default 0)")
    sample.add_argument("--tokenizer", metavar="byte|PATH", help="override the tokenizer spotpipe.json names")
    sample.add_argument("--top-k", type=int, metavar="K", help="draw from the K most likely tokens only (default: all)")


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    """`spotpipe train [FILE] [options]`: flags win over the job file's values."""
    train = sub.add_parser(
        "train", help="train here, on local processes (no control plane)",
        description="Train on this machine's processes, like torchrun: options from flags, a job file, or both "
                    "(flags win). Writes OUT/metrics.jsonl, OUT/spotpipe.json and, with tensorboard installed, "
                    "OUT/tb/.")
    train.add_argument("file", type=Path, nargs="?", help="a job file (TOML), optional")
    train.add_argument("--data", metavar="URI", help="data source FORMAT:LOCATION, e.g. text:corpus/ or tokens:data/")
    train.add_argument("--tokenizer", metavar="byte|PATH", help="byte (default) or a Hugging Face tokenizer.json")
    train.add_argument("--model", metavar="SPEC", help="a model preset (gpt-nano; default without a file) or your "
                                                        "model function, package.module:function")
    train.add_argument("--model-args", metavar="JSON", help="keyword arguments of the model function (a JSON object)")
    train.add_argument("--seq-len", type=int, metavar="N",
                       help="the model's context: the data's token windows (a preset's own by default; a model "
                            "function declares it with spotpipe.Model or takes it here)")
    train.add_argument("--vocab-size", type=int, metavar="N",
                       help="the model's vocabulary, at least the tokenizer's ids (a preset follows the tokenizer)")
    for name, text in (("dp", "pipelines (data-parallel degree)"), ("pp", "stages per pipeline"),
                       ("microbatches", "micro-batches per pipeline per step"),
                       ("global-batch", "samples per optimizer step"), ("steps", "optimizer steps"),
                       ("seed", "seeds the initial parameters and the data order"),
                       ("val-every", "validation loss every this many steps (0: never)")):
        train.add_argument(f"--{name}", type=int, help=text)
    train.add_argument("--lr", type=float, help="AdamW learning rate (the peak, with --warmup / --lr-schedule)")
    train.add_argument("--lr-schedule", choices=("constant", "cosine"),
                       help="after the warmup: constant (default) or cosine decay to --lr-min at the last step")
    train.add_argument("--warmup", type=int, metavar="STEPS", help="linear learning-rate warmup steps (default 0)")
    train.add_argument("--lr-min", type=float, help="cosine: the learning rate of the last step (default 0)")
    train.add_argument("--clip", type=float, metavar="NORM", help="clip the global gradient norm (default 0: off)")
    train.add_argument("--weight-decay", type=float, help="AdamW decoupled weight decay (default 0.01)")
    train.add_argument("--decay-min-dim", type=int, metavar="N", help="decay only tensors with at least N dims: "
                                                                      "2 spares biases and norms (default 0: all)")
    train.add_argument("--betas", metavar="B1,B2", help="AdamW betas (default 0.9,0.95)")
    train.add_argument("--eps", type=float, help="AdamW epsilon (default 1e-8)")
    train.add_argument("--recompute", action="store_true", default=None,
                       help="recompute each layer's activations in the backward (less memory, same math)")
    train.add_argument("--precision", choices=PRECISIONS,
                       help="forward compute: fp32 (default), bf16 autocast, or fp16 autocast with dynamic loss "
                            "scaling for GPUs without bf16 (weights and optimizer stay fp32)")
    train.add_argument("--device", choices=DEVICES,
                       help="where each node computes: cpu (default) or cuda (one GPU per node: its layers, optimizer "
                            "state, activations and micro-batches; messages still go over gloo)")
    train.add_argument("--skip-nonfinite", action="store_true", default=None,
                       help="skip (and count) a step whose global gradient norm is inf/NaN (always on with --clip)")
    train.add_argument("--init-from", metavar="DIR", help="start from a weights folder an earlier run wrote: with its "
                                                        "optimizer state it continues that run (--steps is the total); "
                                                        "or a Hugging Face GPT-2 folder (weights only)")
    train.add_argument("--export", choices=EXPORT_FORMATS,
                       help="also write the weights for another library: hf writes OUT/hf, a Hugging Face GPT-2 "
                            "folder (gpt presets)")
    train.add_argument("--track", action="append", choices=TRACKERS, metavar="TRACKER",
                       help=f"log to an experiment tracker, repeatable: {', '.join(TRACKERS)} (default: tensorboard "
                            "when installed; mlflow at MLFLOW_TRACKING_URI or OUT/mlruns; wandb online with "
                            "WANDB_API_KEY or WANDB_MODE=offline)")
    train.add_argument("--strategy", choices=(*JOB_STRATEGIES, "none"), help="fault tolerance (default auto)")
    train.add_argument("--fail", action="append", default=[], metavar="KIND:RANK@STEP",
                       help="inject a failure: kill:RANK@STEP (SIGKILL) or notice:RANK@STEP (graceful leave); "
                            "repeatable")
    train.add_argument("--out", type=Path, default=Path("var/train"),
                       help="output folder (default var/train); one that holds a run is refused without --overwrite")
    train.add_argument("--overwrite", action="store_true",
                       help="train into an --out folder that holds an earlier run: its weights, checkpoints, "
                            "metrics and logs are removed first")
    train.add_argument("--timeout", type=float, metavar="SECONDS",
                       help="stop every rank after this many seconds (default: no limit); the last checkpoint "
                            "and the --init-from to continue from it are printed")

    data = sub.add_parser("data", help="prepare a corpus once into shards; list or clear the data caches")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    prepare = data_sub.add_parser(
        "prepare", help="tokenize a text, jsonl, hf, wds or mds source once into shards + an index (a folder or s3://)",
        description="Tokenize SOURCE once into sharded token files and an index at --out, which jobs then read "
                    "with data.source = shards:OUT. Run it again to resume a prepare that was killed.")
    prepare.add_argument("source", metavar="SOURCE",
                         help="a text:, jsonl:, hf:, wds: or mds: source, as in data.source")
    prepare.add_argument("--tokenizer", default="byte", help="byte (default) or a tokenizer.json path or s3:// URI")
    prepare.add_argument("--out", required=True, metavar="LOCATION", help="a folder or s3://bucket/prefix/")
    prepare.add_argument("--shard-bytes", type=int, help="largest shard (default 64 MiB)")
    prepare.add_argument("--page-bytes", type=int, help="unit a node fetches and caches (default 64 KiB)")
    prepare.add_argument("--workers", type=int, default=1, help="local processes tokenizing files (default 1)")
    prepare.add_argument("--share", metavar="K/N",
                         help="do share K of N of the input files (run one share on each of N machines; the last "
                              "to finish writes the index)")
    cache = data_sub.add_parser("cache", help="list this machine's data caches (or clear them)")
    cache.add_argument("--clear", action="store_true", help="delete every entry no process is using")


def run_client(args: argparse.Namespace) -> int:
    from spotpipe import commands

    if args.command == "submit":
        return commands.submit(args.file)
    if args.command == "jobs":
        return commands.jobs()
    if args.command == "status":
        return commands.status(args.job)
    if args.command == "logs":
        return commands.logs(args.job, follow=args.follow)
    if args.command == "cancel":
        return commands.cancel(args.job)
    if args.command == "pull":
        return commands.pull(args.job, args.dir)
    if args.command == "resume":
        return commands.resume(args.job, budget=args.budget)
    if args.command == "data":
        from spotpipe.data import run_cache, run_prepare

        if args.data_command == "cache":
            return run_cache(clear=args.clear)
        return run_prepare(args.source, tokenizer=args.tokenizer, out=args.out, shard_bytes=args.shard_bytes,
                           page_bytes=args.page_bytes, workers=args.workers, share=args.share)
    if args.command == "export-hf":
        from spotpipe.train import run_export_hf

        return run_export_hf(args.dir, args.out, overwrite=args.overwrite)
    if args.command == "sample":
        from spotpipe.sample import run_sample

        return run_sample(args.dir, prompt=args.prompt, tokens=args.tokens, temperature=args.temperature,
                          seed=args.seed, tokenizer=args.tokenizer, top_k=args.top_k)
    from spotpipe.train import TrainOptions, run_train

    return run_train(TrainOptions(
        file=args.file, data=args.data, tokenizer=args.tokenizer, model=args.model, dp=args.dp, pp=args.pp,
        microbatches=args.microbatches, global_batch=args.global_batch, steps=args.steps, strategy=args.strategy,
        seed=args.seed, val_every=args.val_every, lr=args.lr, init_from=args.init_from, fails=args.fail, out=args.out,
        timeout_s=args.timeout, model_args=args.model_args, lr_schedule=args.lr_schedule, warmup=args.warmup,
        lr_min=args.lr_min, clip=args.clip, weight_decay=args.weight_decay, decay_min_dim=args.decay_min_dim,
        betas=args.betas, eps=args.eps, recompute=args.recompute, skip_nonfinite=args.skip_nonfinite,
        precision=args.precision, device=args.device, export=args.export, seq_len=args.seq_len,
        vocab_size=args.vocab_size, track=args.track, overwrite=args.overwrite,
    ))


def import_from_here() -> None:
    """Let a user's `module:function` (a model, a loss, a `py:` dataset) be found in the folder the
    command runs in, as under `python -m`: the console script's sys.path starts with its own bin
    folder instead. The ranks a local run starts get this sys.path (multiprocessing sends it)."""
    try:
        here = os.getcwd()
    except OSError:  # the folder was removed under us: nothing to import from it
        return
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in CLIENT_COMMANDS:
        import_from_here()
        try:
            return run_client(args)
        except KeyboardInterrupt:  # Ctrl-C: one line, no traceback (train has ended its ranks by now)
            print("\ninterrupted", file=sys.stderr)
            return 130
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
    from spotpipe.demo.run import DemoOptions, run_demo

    return run_demo(DemoOptions(
        host=args.host, port=args.port, strategy=args.strategy, nodes=args.nodes,
        trace=args.trace.resolve() if args.trace else None, trace_format=args.trace_format,
        prices=args.prices.resolve() if args.prices else None,
        duration=args.duration, seed=args.seed, headless=args.headless,
        screenshot=args.screenshot.resolve() if args.screenshot else None, external=args.external,
    ))


if __name__ == "__main__":
    sys.exit(main())
