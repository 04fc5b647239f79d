"""`spotpipe data prepare` (tokenize a corpus once into shards, locally or on S3) and `spotpipe data
cache` (list or clear this machine's data caches); docs/data.md."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import IO

from spotpipe.tables import print_table


def run_prepare(source: str, *, tokenizer: str, out: str, shard_bytes: int | None = None,
                page_bytes: int | None = None, workers: int = 1, share: str | None = None,
                stream: IO[str] | None = None, errors: IO[str] | None = None) -> int:
    from runtime.data.errors import DataError
    from runtime.data.prepare import DEFAULT_PAGE_BYTES, DEFAULT_SHARD_BYTES, parse_share, prepare

    shard_bytes = shard_bytes or DEFAULT_SHARD_BYTES
    page_bytes = page_bytes or DEFAULT_PAGE_BYTES
    stream = stream if stream is not None else sys.stdout
    errors = errors if errors is not None else sys.stderr
    if "://" not in out and Path(out).exists() and not Path(out).is_dir():
        print(f"spotpipe data prepare: --out {out} is a file; expected a folder (new, or one this command prepared "
              "into) or s3://bucket/prefix/", file=errors)
        return 2
    try:
        summary = prepare(source, tokenizer=tokenizer, out=out, shard_bytes=shard_bytes, page_bytes=page_bytes,
                          workers=workers, stream=stream, share=parse_share(share) if share else None)
    except DataError as exc:
        print(f"spotpipe data prepare: {exc}", file=errors)
        return 2
    except OSError as exc:  # a file it cannot read or write (no permission, a file where a folder goes): one line
        print(f"spotpipe data prepare: {exc.filename or out}: {exc.strerror or exc}", file=errors)
        return 2
    index = summary.index
    if index is None:
        k, n = summary.share or (0, 1)
        print(f"share {k}/{n} of {out} done: {summary.files} files ({summary.skipped} done before) in "
              f"{summary.seconds:.1f} s; {summary.waiting} files of other shares are not done yet, and the share "
              "that finishes last writes the index", file=stream)
        return 0
    tokens = ", ".join(f"{name} {index.stream_tokens(name):,}" for name in index.streams)
    shards = sum(len(s) for s in index.streams.values())
    rate = summary.input_bytes / summary.seconds / 1e6 if summary.seconds else 0.0
    print(f"prepared {out}: {tokens} tokens ({index.dtype}) in {shards} shards, {index.total_bytes / 1e6:,.1f} MB, "
          f"from {summary.files} files ({summary.skipped} done before) in {summary.seconds:.1f} s "
          f"({rate:.1f} MB/s with {summary.workers} worker(s))", file=stream)
    print(f"train on it with data.source = \"shards:{out}\" and data.tokenizer = \"{tokenizer}\"", file=stream)
    return 0


def run_cache(*, clear: bool, root: Path | None = None, stream: IO[str] | None = None) -> int:
    from runtime.data.hygiene import cache_root, corpus_entries, page_entries
    from runtime.data.hygiene import clear as clear_all

    stream = stream if stream is not None else sys.stdout
    root = cache_root(root)
    if clear:
        freed = clear_all(root)
        print(f"cleared {root}: {freed:,} bytes freed", file=stream)
        return 0
    entries = [*corpus_entries(root), *page_entries(root)]
    if not entries:
        print(f"{root}: empty", file=stream)
        return 0
    now = time.time()
    rows = [[e.kind, e.bytes / 1e6, f"{(now - e.last_used) / 3600:.1f} h ago", e.describe, e.path.name]
            for e in sorted(entries, key=lambda e: -e.last_used)]
    print_table(f"data caches in {root}", ["cache", "MB", "last used", "holds", "entry"], rows, out=stream)
    print(f"{root}: {sum(e.bytes for e in entries) / 1e6:,.1f} MB in {len(entries)} entries "
          "(spotpipe data cache --clear deletes them)", file=stream)
    return 0
