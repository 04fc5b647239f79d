"""`spotpipe data prepare`: tokenize a text, jsonl, hf, wds or mds source once into a prepared corpus
(`runtime.data.prepared`), locally or on S3, so no node tokenizes or downloads the whole corpus.

Work is cut into units, one per input file (per stream); each unit tokenizes its file's documents,
each preceded by the separator, into shards of at most `shard_bytes`, and writes its manifest last.
Units run in parallel over `workers` local processes; whatever their number, the shards' tokens
concatenate (the index dropping the stream's first separator) into the token stream the source's
own reader makes. A killed prepare is resumed by running it again: a unit whose manifest is there,
for an input file of the same content, with all its shards, is not done again. The index is
written last, so a location without one is never read as a corpus.

Across machines: with `share=(k, n)` a machine does only its share of the units (`share_units`:
every machine lists the same units and cuts them the same way, balanced by bytes), and whichever
share finds every unit's manifest in place when it ends writes the index (the same index whoever
writes it); a share that crashed is resumed by running that share again.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import IO, Any

import numpy as np

from runtime.config import PREPARABLE_FORMATS, LayoutError, SourceURI, check_tokenizer, parse_source
from runtime.data.cache import content_key, file_digest, token_dtype
from runtime.data.errors import DataError
from runtime.data.hygiene import cache_root
from runtime.data.location import Location, Missing, open_location
from runtime.data.prepared import INDEX_NAME, PreparedIndex, Shard, pack_pages

DEFAULT_SHARD_BYTES = 64 << 20
DEFAULT_PAGE_BYTES = 64 << 10
STARTED = "units/.started"


@dataclass(frozen=True, slots=True)
class Unit:
    stream: str
    number: int
    path: str
    """The input file: a local path, or `s3://bucket/key`, downloaded by the unit's worker alone."""
    size: int

    @property
    def manifest(self) -> str:
        return f"units/{self.stream}-{self.number:06d}.json"


@dataclass(kw_only=True, slots=True)
class UnitResult:
    stream: str
    number: int
    digest: str
    """sha256 of the input file."""
    documents: int
    lead: int
    """Tokens of the separator the unit wrote before its first document (0 without documents)."""
    max_id: int
    input_bytes: int
    parts: list[dict[str, Any]] = field(default_factory=list)
    skipped: bool = False
    """Found done by an earlier, interrupted prepare."""


@dataclass(frozen=True, slots=True)
class PrepareJob:
    source: str
    tokenizer: str
    out: str
    shard_bytes: int
    page_bytes: int
    cache_dir: str


def _documents(uri: SourceURI, path: Path):
    module = importlib.import_module(f"runtime.data.formats.{uri.format}")
    return module.documents_of(uri, [path])


def recorded_unit(job: PrepareJob, unit: Unit, location: Location, digest: str | None = None) -> UnitResult | None:
    """The unit as its manifest records it, when the manifest is there for this job's page and shard
    sizes, for an input of the unit's size (and, given `digest`, of that content), with all its shards
    at their sizes; else None (not done, or done for other settings or another input)."""
    try:
        recorded = json.loads(location.read(unit.manifest))
    except (Missing, ValueError):
        return None
    if (digest is not None and recorded.get("digest") != digest) or recorded.get("page_bytes") != job.page_bytes \
            or recorded.get("shard_bytes") != job.shard_bytes or recorded.get("input_bytes") != unit.size:
        return None
    for part in recorded["parts"]:
        if location.size(part["name"]) != part["bytes"]:
            return None
    fields = {k: recorded[k] for k in ("stream", "number", "digest", "documents", "lead", "max_id",
                                       "input_bytes", "parts")}
    return UnitResult(**fields, skipped=True)


def share_units(units: list[Unit], share: tuple[int, int]) -> list[Unit]:
    """Share `k` of `n` of the units: each unit, largest first, goes to the share with the fewest bytes
    so far (the lowest-numbered on a tie), so every machine that lists the same units cuts them the
    same way and the shares' bytes differ by at most one file."""
    k, n = share
    loads = [0] * n
    mine = []
    for unit in sorted(units, key=lambda u: (-u.size, u.stream, u.number)):
        least = min(range(n), key=lambda i: (loads[i], i))
        loads[least] += unit.size
        if least == k:
            mine.append(unit)
    return sorted(mine, key=lambda u: (u.stream, u.number))


def run_unit(job: PrepareJob, unit: Unit) -> UnitResult:
    """Tokenize one input file into its shards and manifest (or find them done)."""
    if not unit.path.startswith("s3://"):
        return _run_unit(job, unit, Path(unit.path))
    from runtime.data.s3 import _client as s3_client

    downloaded = Path(job.cache_dir) / "prepare" / f"{os.getpid()}-{unit.stream}-{unit.number}"
    downloaded.parent.mkdir(parents=True, exist_ok=True)
    bucket, _, key = unit.path.removeprefix("s3://").partition("/")
    try:
        s3_client().download_file(bucket, key, str(downloaded))
        return _run_unit(job, unit, downloaded)
    finally:
        downloaded.unlink(missing_ok=True)


def _run_unit(job: PrepareJob, unit: Unit, path: Path) -> UnitResult:
    from runtime.data.tokenizer import load_tokenizer

    uri = parse_source(job.source)
    location = open_location(job.out)
    digest = file_digest(path)
    if (found := recorded_unit(job, unit, location, digest)) is not None:
        return found
    tokenizer = load_tokenizer(job.tokenizer, Path(job.cache_dir))
    dtype = np.dtype(token_dtype(tokenizer.vocab_size))
    shard_tokens = max(1, job.shard_bytes // dtype.itemsize)
    result = UnitResult(stream=unit.stream, number=unit.number, digest=digest, documents=0, lead=0, max_id=-1,
                        input_bytes=unit.size)
    pending: list[np.ndarray] = []
    buffered = 0

    def flush(count: int) -> None:
        nonlocal pending, buffered
        tokens = np.concatenate(pending) if len(pending) > 1 else pending[0]
        data, rest = pack_pages(tokens[:count].tobytes(), job.page_bytes), tokens[count:]
        name = f"shards/{unit.stream}-{unit.number:06d}-{len(result.parts):04d}.bin"
        location.write(name, data)
        result.parts.append({"name": name, "tokens": count, "bytes": len(data),
                             "sha256": hashlib.sha256(data).hexdigest()})
        pending, buffered = ([rest] if len(rest) else []), len(rest)

    for document in _documents(uri, path):
        if not result.documents:
            result.lead = len(tokenizer.separator)
        result.documents += 1
        for ids in (tokenizer.separator, *(tokenizer.encode(piece) for piece in document)):
            if not len(ids):
                continue
            result.max_id = max(result.max_id, int(ids.max()))
            pending.append(ids.astype(dtype))  # stored narrow: a shard's worth in memory, not 4x it
            buffered += len(ids)
            while buffered >= shard_tokens:
                flush(shard_tokens)
    if buffered:
        flush(buffered)
    manifest = {**asdict(result), "page_bytes": job.page_bytes, "shard_bytes": job.shard_bytes}
    manifest.pop("skipped")
    location.write(unit.manifest, json.dumps(manifest, sort_keys=True).encode())
    return result


def plan_units(uri: SourceURI, cache_dir: Path) -> list[Unit]:
    """One unit per input file, streams in order (all; or train then val). The objects of an S3
    text, jsonl or wds source are listed, not mirrored: each unit downloads its own object, so the
    preparing machine never holds the whole corpus (a format with `LISTABLE = False` is mirrored:
    an hf source's splits, an mds source's index, are found in the mirror)."""
    module = importlib.import_module(f"runtime.data.formats.{uri.format}")
    if uri.is_s3 and getattr(module, "LISTABLE", True):
        return [Unit("all", number, url, size) for number, (url, size) in enumerate(_s3_files(uri, module))]
    units = []
    for stream, paths in module.stream_files(uri, cache_dir).items():
        units.extend(Unit(stream, number, str(path), path.stat().st_size) for number, path in enumerate(paths))
    return units


def _s3_files(uri: SourceURI, module) -> list[tuple[str, int]]:
    """(s3:// URL, size) of each object the source's mirror would hold, in its order: one object, or
    every object under the prefix without a hidden part and with the format's suffix (as
    `runtime.data.files.folder_files` picks a folder's files)."""
    from runtime.data.s3 import list_objects

    prefix, objects = list_objects(uri.location)
    if len(objects) == 1 and objects[0]["Key"] == uri.key_prefix:
        return [(f"s3://{uri.bucket}/{objects[0]['Key']}", objects[0]["Size"])]
    suffixes = getattr(module, "FILE_SUFFIXES", ())
    chosen = []
    for obj in objects:
        relative = obj["Key"][len(prefix):]
        if any(part.startswith(".") for part in relative.split("/")):
            continue
        if not suffixes or relative.endswith(suffixes):
            chosen.append((f"s3://{uri.bucket}/{obj['Key']}", obj["Size"]))
    if not chosen:
        raise DataError(f"{uri}: no input files under s3://{uri.bucket}/{prefix}")
    return sorted(chosen)


def assemble(job: PrepareJob, uri: SourceURI, results: list[UnitResult]) -> PreparedIndex:
    """The index of finished units: each stream's shards in unit order, its first separator skipped."""
    from runtime.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(job.tokenizer, Path(job.cache_dir))
    streams: dict[str, list[Shard]] = {}
    digests: dict[str, list[str]] = {}
    for result in sorted(results, key=lambda r: (r.stream != "all", r.stream != "train", r.number)):
        shards = streams.setdefault(result.stream, [])
        digests.setdefault(result.stream, []).append(result.digest)
        first = not any(s.tokens for s in shards)
        for number, part in enumerate(result.parts):
            skip = result.lead if first and number == 0 else 0
            shards.append(Shard(**part, skip=skip))
    max_id = max((r.max_id for r in results), default=-1)
    if max_id >= tokenizer.vocab_size:
        raise DataError(f"{job.source}: tokenizer {job.tokenizer!r} produced id {max_id}, beyond its own "
                        f"vocabulary of {tokenizer.vocab_size}")
    key = content_key(fmt=uri.format, options=uri.options, tokenizer=tokenizer.identity, digests=digests)
    return PreparedIndex(source=job.source, source_format=uri.format, tokenizer=job.tokenizer,
                         tokenizer_identity=tokenizer.identity, vocab_size=tokenizer.vocab_size,
                         dtype=token_dtype(tokenizer.vocab_size), page_bytes=job.page_bytes, max_id=max_id,
                         content_hash=key, streams=streams)


class Progress:
    """One line per finished unit: files, input bytes, rate, time left."""

    def __init__(self, units: list[Unit], out: IO[str]) -> None:
        self.total_files = len(units)
        self.total_bytes = sum(u.size for u in units) or 1
        self.out = out
        self.started = time.perf_counter()
        self.done_files = self.done_bytes = self.worked_bytes = self.skipped = 0

    def unit_done(self, result: UnitResult) -> None:
        self.done_files += 1
        self.done_bytes += result.input_bytes
        if result.skipped:
            self.skipped += 1
        else:
            self.worked_bytes += result.input_bytes
        elapsed = time.perf_counter() - self.started
        rate = self.worked_bytes / elapsed if elapsed > 0 else 0.0
        left = (self.total_bytes - self.done_bytes) / rate if rate else 0.0
        print(f"prepare: {self.done_files}/{self.total_files} files, {self.done_bytes / 1e6:,.1f} of "
              f"{self.total_bytes / 1e6:,.1f} MB, {rate / 1e6:.1f} MB/s, {left:.0f} s left"
              + (f" ({self.skipped} done before)" if self.skipped else ""), file=self.out, flush=True)


@dataclass(kw_only=True, slots=True)
class PrepareSummary:
    index: PreparedIndex | None
    """None: a share that ended before the others (the last one writes the index)."""
    files: int
    skipped: int
    input_bytes: int
    seconds: float
    workers: int
    share: tuple[int, int] | None = None
    waiting: int = 0
    """Units of other shares not done yet when this share ended."""


def parse_share(text: str) -> tuple[int, int]:
    """`K/N` (share K of N, counted from 0) as (K, N); `DataError` naming the value otherwise."""
    k, slash, n = text.partition("/")
    if not (slash and k.isdigit() and n.isdigit() and 0 <= int(k) < int(n)):
        raise DataError(f"--share {text!r} must be K/N with 0 <= K < N (share K of N, counted from 0)")
    return int(k), int(n)


def prepare(source: str, *, tokenizer: str, out: str, shard_bytes: int = DEFAULT_SHARD_BYTES,
            page_bytes: int = DEFAULT_PAGE_BYTES, workers: int = 1, cache_dir: Path | None = None,
            stream: IO[str] | None = None, share: tuple[int, int] | None = None) -> PrepareSummary:
    """Prepare `source` at `out` (a folder or s3://bucket/prefix/), or with `share=(k, n)` its share
    of the units (the module docstring); `DataError` naming what is wrong."""
    stream = stream if stream is not None else sys.stdout
    try:
        uri = parse_source(source, field="SOURCE")
        check_tokenizer(tokenizer, field="--tokenizer")
    except LayoutError as exc:
        raise DataError(str(exc)) from None
    if uri.format not in PREPARABLE_FORMATS:
        raise DataError(f"SOURCE {source!r}: only {', '.join(PREPARABLE_FORMATS)} sources are prepared (tokens: and "
                        "py: sources are read as they are)")
    if page_bytes < 64 or page_bytes % 4 or shard_bytes < page_bytes:
        raise DataError(f"--page-bytes {page_bytes} must be a multiple of 4 of at least 64 (8 of them the page's "
                        f"digest), and --shard-bytes {shard_bytes} at least --page-bytes")
    if workers < 1:
        raise DataError(f"--workers {workers} must be at least 1")
    root = cache_root(cache_dir)
    job = PrepareJob(source=source, tokenizer=tokenizer, out=out, shard_bytes=shard_bytes, page_bytes=page_bytes,
                     cache_dir=str(root))
    location = open_location(out)
    if location.exists(INDEX_NAME):
        raise DataError(f"{out} already holds a prepared corpus ({INDEX_NAME}); choose another --out or remove it")
    units = plan_units(uri, root)
    mine = share_units(units, share) if share is not None else units
    location.write(STARTED, b"")
    progress = Progress(mine, stream)
    began = time.perf_counter()
    results = _run_units(job, mine, workers=workers, progress=progress)
    others = [recorded_unit(job, unit, location) for unit in units if unit not in set(mine)]
    waiting = sum(found is None for found in others)
    index = None
    if not waiting:  # every unit is in place: this share (or the whole prepare) writes the index
        index = assemble(job, uri, [*results, *(found for found in others if found is not None)])
        location.write(INDEX_NAME, index.to_json().encode())
    return PrepareSummary(index=index, files=len(mine), skipped=progress.skipped,
                          input_bytes=sum(r.input_bytes for r in results), seconds=time.perf_counter() - began,
                          workers=workers, share=share, waiting=waiting)


def _run_units(job: PrepareJob, units: list[Unit], *, workers: int, progress: Progress) -> list[UnitResult]:
    results: list[UnitResult] = []
    if workers == 1:
        for unit in units:
            results.append(run_unit(job, unit))
            progress.unit_done(results[-1])
        return results
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(run_unit, job, unit) for unit in units]
        for future in as_completed(futures):
            results.append(future.result())
            progress.unit_done(results[-1])
    return results
