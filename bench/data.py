"""Data at fleet scale (issue 41): prepare once, stream shards from S3, the same samples.

    python -m bench data [--quick] [--json PATH]

A generated text corpus (random letters, spaces and newlines in 32 MB files; full: 100 MB and
1 GB, quick: 10 MB and 100 MB) is prepared with the byte tokenizer (`spotpipe data prepare`,
shards of 1 MiB, 256 KiB quick: moto's server reads a whole object for each range it answers, so
larger shards would measure moto, not spotpipe; and a step's windows then fall in as many shards
at both sizes), and uploaded to moto's S3 server, run as its own process as S3 is to a node.

- `prepare_mb_per_s`: input MB per second per worker process (one worker; and two, to show the
  parallel prepare scales).
- `first_step_s.{small,large,ratio}`: from opening `shards:s3://...` on a node with an empty cache
  to holding every micro-batch of step 0 (the index, then the pages). Median of 5, the two sizes
  alternated. Baseline
  `full_copy_first_step_s_small`: the same for `text:s3://...` of the small corpus (the node mirrors
  the prefix and tokenizes it), the behaviour before.
- `steady_ratio_vs_local`: steps per second of the single-process trainer (`reference_run`, a
  byte-level GPT of 4 layers of width 128, seq_len 256) streaming the large corpus from moto
  through a cache of `cache_bytes` (smaller than the corpus), over the same on a local folder,
  from the start of step `warm` to the start of step `warm + n`, fresh caches; 3 rounds, local and
  S3 alternated, the median of the rounds' ratios.
- `cache_peak_bytes` / `cache_bytes`: the most the page cache held during the streamed runs.
- `losses_equal_local`: the losses and validation losses of the small corpus streamed from moto
  equal the run on the text source itself (local, read whole), bit for bit.
"""

from __future__ import annotations

import io
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bench.report import Progress, print_table

FILE_BYTES = 32 << 20
SHARD_BYTES = {"quick": 256 << 10, "full": 1 << 20}
PAGE_BYTES = 64 << 10
FIRST_STEP_TRIALS = 5
STEADY_ROUNDS = 3
ALPHABET = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz      \n.,", dtype=np.uint8)


def _corpus(folder: Path, size: int, seed: int) -> None:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    written = 0
    number = 0
    while written < size:
        count = min(FILE_BYTES, size - written)
        (folder / f"part-{number:05d}.txt").write_bytes(ALPHABET[rng.integers(0, len(ALPHABET), count)].tobytes())
        written += count
        number += 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _moto() -> tuple[subprocess.Popen, str]:
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server, url
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise RuntimeError("moto's server did not start")


def _upload(client: Any, bucket: str, folder: Path, prefix: str) -> None:
    files = [p for p in folder.rglob("*") if p.is_file()]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: client.upload_file(str(p), bucket, prefix + p.relative_to(folder).as_posix()), files))


def _config(source: str, *, steps: int, cache_bytes: int, val_every: int = 0) -> Any:
    from runtime.config import DataSpec, JobConfig, ModelSpec

    # Compute per sample like a small real model's, not a toy's: a node's data work per sample
    # (a range read, a digest, a cache write) is fixed, and a toy makes it look large.
    model = ModelSpec(kind="gpt", n_layer=4, n_embd=128, n_head=4, seq_len=256, vocab_size=256)
    return JobConfig(model=model, dp=1, pp=1, microbatches=2, global_batch=16, steps=steps, seed=5, lr=0.003,
                     val_every=val_every, data=DataSpec(source=source, val_batches=2, cache_bytes=cache_bytes))


def _fresh_cache(root: Path) -> Path:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    os.environ["SPOTPIPE_DATA_CACHE"] = str(root)
    return root


def _first_step_s(source: str, cache: Path, cache_bytes: int) -> float:
    from runtime.data.dataset import Batches

    config = _config(source, steps=1, cache_bytes=cache_bytes)
    _fresh_cache(cache)
    began = time.perf_counter()
    batches = Batches(config)
    for index in range(config.num_microbatches):
        batches.train(step=0, index=index, size=config.microbatch_size)
    took = time.perf_counter() - began
    batches.close()
    return took


def _steady_steps_per_s(source: str, cache: Path, warm: int, measured: int, cache_bytes: int) -> float:
    """Steps a second of a run after its first `warm` steps (a fresh cache), from when each step starts."""
    from runtime.train.reference import reference_run

    _fresh_cache(cache)
    starts: list[float] = []
    reference_run(_config(source, steps=warm + measured + 1, cache_bytes=cache_bytes),
                  on_step=lambda step: starts.append(time.perf_counter()))
    return measured / (starts[warm + measured] - starts[warm])


def run(*, quick: bool = False, progress: Progress) -> dict[str, Any]:
    import boto3

    from runtime.data.pagecache import PageCache
    from runtime.data.prepare import prepare
    from runtime.train.reference import reference_run

    small_bytes, large_bytes = (10 << 20, 100 << 20) if quick else (100 << 20, 1 << 30)
    shard_bytes = SHARD_BYTES["quick" if quick else "full"]
    warm, measured = (5, 20) if quick else (10, 60)
    cache_bytes = 32 << 20
    work = Path(tempfile.mkdtemp(prefix="bench-data-"))
    server, url = _moto()
    saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                            "AWS_DEFAULT_REGION", "SPOTPIPE_DATA_CACHE")}
    os.environ.update(AWS_ENDPOINT_URL=url, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_DEFAULT_REGION="us-east-1")
    try:
        client = boto3.client("s3")
        client.create_bucket(Bucket="corpus")
        sources: dict[str, dict[str, str]] = {}
        rates = {}
        for name, size, seed in (("small", small_bytes, 1), ("large", large_bytes, 2)):
            progress.step(f"generating the {name} corpus ({size / 1e6:,.0f} MB)")
            folder = work / f"{name}-text"
            _corpus(folder, size, seed)
            for workers in (1, 2) if name == "large" else (1,):
                out = work / f"{name}-shards-{workers}"
                progress.step(f"preparing the {name} corpus with {workers} worker(s)")
                _fresh_cache(work / "prepare-cache")
                summary = prepare(f"text:{folder}", tokenizer="byte", out=str(out), shard_bytes=shard_bytes,
                                  page_bytes=PAGE_BYTES, workers=workers, stream=io.StringIO())
                if name == "large":
                    rates[workers] = summary.input_bytes / summary.seconds / 1e6 / workers
            progress.step(f"uploading the {name} corpus and its shards to moto")
            _upload(client, "corpus", work / f"{name}-shards-1", f"{name}/shards/")
            if name == "small":
                _upload(client, "corpus", folder, "small/text/")
            sources[name] = {"s3": f"shards:s3://corpus/{name}/shards/", "local": f"shards:{work}/{name}-shards-1",
                             "text": f"text:{folder}", "text_s3": f"text:s3://corpus/{name}/text/"}
            for extra in (2,) if name == "large" else ():
                shutil.rmtree(work / f"{name}-shards-{extra}")

        cache = work / "node-cache"
        trials: dict[str, list[float]] = {"small": [], "large": []}
        for _ in range(FIRST_STEP_TRIALS):  # alternated, so a drift of the machine hits both alike
            for name in ("small", "large"):
                trials[name].append(_first_step_s(sources[name]["s3"], cache, cache_bytes))
        first = {name: statistics.median(values) for name, values in trials.items()}
        progress.step(f"first step from S3: small {first['small']:.3f} s, large {first['large']:.3f} s")
        progress.step("first step of the small corpus as a full copy (mirror + tokenize), the baseline")
        full_copy = _first_step_s(sources["small"]["text_s3"], cache, 1 << 40)

        speeds: dict[str, list[float]] = {"local": [], "s3": []}
        peaks = []
        for round_ in range(STEADY_ROUNDS):  # alternated, so a drift of the machine hits both alike
            for where in ("local", "s3"):
                progress.step(f"round {round_ + 1}: training {warm} + {measured} steps on the large corpus "
                              f"from {where}")
                speeds[where].append(_steady_steps_per_s(sources["large"][where], cache, warm, measured, cache_bytes))
                if where == "s3":
                    peaks.append(PageCache(cache / "pages", cache_bytes).totals()["peak"])
        ratios = [s3 / local for s3, local in zip(speeds["s3"], speeds["local"], strict=True)]
        steady = {where: statistics.median(values) for where, values in speeds.items()}

        progress.step("losses: the small corpus streamed from S3 against its text read whole")
        _fresh_cache(cache)
        on_text = reference_run(_config(sources["small"]["text"], steps=warm + 4, cache_bytes=1 << 40, val_every=3))
        _fresh_cache(cache)
        on_s3 = reference_run(_config(sources["small"]["s3"], steps=warm + 4, cache_bytes=cache_bytes, val_every=3))
        peaks.append(PageCache(cache / "pages", cache_bytes).totals()["peak"])
        equal = on_text.losses == on_s3.losses and on_text.val_losses == on_s3.val_losses
    finally:
        server.kill()
        server.wait()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(work, ignore_errors=True)

    figures = {
        "prepare_mb_per_s": round(rates[1], 1),
        "prepare_mb_per_s_two_workers_each": round(rates[2], 1),
        "first_step_s": {"small": round(first["small"], 3), "large": round(first["large"], 3),
                         "ratio": round(first["large"] / first["small"], 3)},
        "full_copy_first_step_s_small": round(full_copy, 3),
        "steady_steps_per_s": {"local": round(steady["local"], 2), "s3": round(steady["s3"], 2)},
        "steady_ratio_vs_local": round(statistics.median(ratios), 3),
        "steady_ratio_vs_local_each_round": [round(r, 3) for r in ratios],
        "cache_peak_bytes": max(peaks),
        "cache_bytes": cache_bytes,
        "losses_equal_local": equal,
        "corpus_bytes": {"small": small_bytes, "large": large_bytes},
        "shard_bytes": shard_bytes,
        "page_bytes": PAGE_BYTES,
    }
    print_table("data at fleet scale", ["figure", "value", "baseline", "goal"], [
        ["prepare MB/s per worker", figures["prepare_mb_per_s"], f"{rates[2]:.1f} each with 2", "-"],
        ["first step s (small)", first["small"], f"{full_copy:.2f} full copy", "-"],
        ["first step s (large, 10x)", first["large"], f"ratio {figures['first_step_s']['ratio']}", "ratio <= 1.2"],
        ["steps/s streamed from S3", steady["s3"], f"{steady['local']:.2f} local",
         f"ratio {figures['steady_ratio_vs_local']} >= 0.95"],
        ["page cache peak bytes", figures["cache_peak_bytes"], f"limit {cache_bytes}", "<= limit"],
        ["losses equal the text source", str(equal), "-", "True"],
    ])
    return figures
