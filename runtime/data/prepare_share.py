"""`python -m runtime.data.prepare_share`: one node's share of a job's prepare step (`data.prepare`),
run by the agent in the job's environment. It prepares share K of N of the job's source at the
job's location (`runtime.data.prepare`, resumable unit by unit) and prints its progress on stderr and
one JSON line on stdout: what it did, or `{"error": ...}` with exit status 2 when the data cannot be
prepared (the job fails with that message: running it again cannot help).

A location that already holds a corpus prepared from the same source with the same tokenizer (a
resumed or resubmitted job) is taken as it is; one prepared from anything else is an error, never
overwritten."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from runtime.data.errors import DataError
from runtime.data.location import open_location
from runtime.data.prepare import parse_share, prepare
from runtime.data.prepared import INDEX_NAME, read_index


def prepared_before(source: str, tokenizer: str, out: str) -> bool:
    """True when `out` holds a corpus of `source` prepared with `tokenizer`; False when it holds none.
    Raises `DataError` when it holds a corpus of another source or tokenizer."""
    location = open_location(out)
    if not location.exists(INDEX_NAME):
        return False
    index = read_index(location)
    if (index.source, index.tokenizer) != (source, tokenizer):
        raise DataError(f"{out} already holds a corpus prepared from {index.source!r} with tokenizer "
                        f"{index.tokenizer!r}, not from {source!r} with {tokenizer!r}: choose another data.prepare "
                        "location or remove that one")
    return True


def run_share(*, source: str, tokenizer: str, out: str, share: tuple[int, int], workers: int) -> dict[str, Any]:
    """Prepare `share` of `source` at `out`; what the agent reports (`index_written`: this share
    found every other share's files done and wrote the index)."""
    k, n = share
    if prepared_before(source, tokenizer, out):
        return {"share": k, "of": n, "index_written": True, "prepared_before": True, "files": 0, "skipped": 0,
                "input_bytes": 0, "seconds": 0.0, "waiting": 0}
    summary = prepare(source, tokenizer=tokenizer, out=out, workers=workers, share=share, stream=sys.stderr)
    return {"share": k, "of": n, "index_written": summary.index is not None, "prepared_before": False,
            "files": summary.files, "skipped": summary.skipped, "input_bytes": summary.input_bytes,
            "seconds": round(summary.seconds, 3), "waiting": summary.waiting}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.data.prepare_share", description=__doc__)
    parser.add_argument("--source", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--share", required=True, metavar="K/N")
    parser.add_argument("--workers", type=int, default=0, help="local processes (default: this node's CPUs)")
    args = parser.parse_args(argv)
    try:
        result = run_share(source=args.source, tokenizer=args.tokenizer, out=args.out, share=parse_share(args.share),
                           workers=args.workers or os.cpu_count() or 1)
    except DataError as exc:
        print(json.dumps({"error": str(exc)[:1000]}), flush=True)
        return 2
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
