"""Sizes, limits and clearing of the node's data caches (`cache_root()`):

- corpora: `tokens/<key>/` (tokenized text, jsonl, hf, wds, mds sources: `runtime.data.cache`) and
  `s3/<hash>/` (mirrors of S3 locations: `runtime.data.s3`). After a source is opened, least
  recently used entries are deleted until the corpora fit in `data.cache_bytes`; the entries this
  process opened are kept, and if they alone exceed the limit the open fails, naming both sizes
  (prepare the corpus once and stream it with `shards:` instead, or raise the limit). An entry
  another process is building (its lock held) is never deleted.
- pages: `pages/`, bounded by `runtime.data.pagecache.PageCache` itself.

Last use is the mtime of an entry's `.used` stamp, touched each time a process opens it.
"""

from __future__ import annotations

import contextlib
import fcntl
import shutil
from dataclasses import dataclass
from pathlib import Path

from runtime.data.errors import DataError

CORPUS_KINDS = ("tokens", "s3")
_opened: set[Path] = set()
"""Corpus entries this process opened: never evicted by it."""


@dataclass(frozen=True, slots=True)
class CacheEntry:
    kind: str
    """tokens, s3 or pages."""
    path: Path
    bytes: int
    last_used: float
    describe: str
    """What it holds (the source, the S3 location), for `spotpipe data cache`."""


def cache_root(explicit: Path | None = None) -> Path:
    """The node's data cache: `explicit`, else $SPOTPIPE_DATA_CACHE, else ~/.cache/spotpipe/data."""
    import os

    if explicit is not None:
        return explicit
    return Path(os.environ.get("SPOTPIPE_DATA_CACHE") or Path.home() / ".cache" / "spotpipe" / "data")


def folder_bytes(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file():
                total += path.stat().st_size
    return total


def touch(folder: Path) -> None:
    """Stamp `folder` as used now, and as opened by this process."""
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / ".used").touch()
    _opened.add(folder.resolve())


def _describe(kind: str, folder: Path) -> str:
    import json

    with contextlib.suppress(OSError, ValueError):
        if kind == "tokens":
            return json.loads((folder / "meta.json").read_text()).get("source", "")
        return (folder / ".location").read_text().strip()
    return "(incomplete)"


def corpus_entries(root: Path) -> list[CacheEntry]:
    found = []
    for kind in CORPUS_KINDS:
        base = root / kind
        if not base.is_dir():
            continue
        for folder in sorted(p for p in base.iterdir() if p.is_dir()):
            stamp = folder / ".used"
            used = stamp.stat().st_mtime if stamp.exists() else folder.stat().st_mtime
            found.append(CacheEntry(kind, folder, folder_bytes(folder), used, _describe(kind, folder)))
    return found


def _lock_of(entry: CacheEntry) -> Path:
    return entry.path.with_name(entry.path.name + ".lock")


def _delete_unless_busy(entry: CacheEntry) -> bool:
    """Delete the entry unless a process holds its lock (building or syncing it)."""
    try:
        handle = open(_lock_of(entry), "a")  # noqa: SIM115 (closed by the with below)
    except OSError:
        return False
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        shutil.rmtree(entry.path, ignore_errors=True)
        fcntl.flock(handle, fcntl.LOCK_UN)
    return True


def evict_corpora(root: Path, limit_bytes: int) -> list[CacheEntry]:
    """Delete least recently used corpus entries, not opened by this process, until the corpora fit
    in `limit_bytes`; returns what was deleted. `DataError` when this process's own entries exceed it."""
    entries = corpus_entries(root)
    total = sum(e.bytes for e in entries)
    if total <= limit_bytes:
        return []
    mine = [e for e in entries if e.path.resolve() in _opened]
    if (own := sum(e.bytes for e in mine)) > limit_bytes:
        held = ", ".join(str(e.path) for e in mine)
        raise DataError(f"the job's data takes {own:,} bytes in the node cache ({held}), "
                        f"more than data.cache_bytes={limit_bytes:,}; prepare it once with `spotpipe data prepare` and "
                        "stream it with a shards: source, or raise data.cache_bytes")
    deleted = []
    for entry in sorted((e for e in entries if e not in mine), key=lambda e: e.last_used):
        if total <= limit_bytes:
            break
        if _delete_unless_busy(entry):
            total -= entry.bytes
            deleted.append(entry)
    return deleted


def page_entries(root: Path) -> list[CacheEntry]:
    """The page cache as one entry per shard (pages of one shard grouped)."""
    base = root / "pages"
    if not base.is_dir():
        return []
    found = []
    for folder in sorted(p for p in base.iterdir() if p.is_dir() and p.name != "locks"):  # <sha256[:24]>/
        files = [p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")]
        if not files:  # emptied by eviction or --clear
            continue
        size = sum(p.stat().st_size for p in files)
        used = max((p.stat().st_mtime for p in files), default=folder.stat().st_mtime)
        found.append(CacheEntry("pages", folder, size, used, f"{len(files)} pages of shard {folder.name}"))
    return found


def clear(root: Path) -> int:
    """Delete every cache entry no process is building; returns the bytes freed."""
    freed = 0
    for entry in corpus_entries(root):
        if _delete_unless_busy(entry):
            freed += entry.bytes
    if (root / "pages" / "pages.sqlite3").is_file():
        from runtime.config import DataSpec
        from runtime.data.pagecache import PageCache

        freed += PageCache(root / "pages", DataSpec().cache_bytes).clear()
    return freed
