"""The node data caches stay within `data.cache_bytes`: least recently used corpora are evicted (never
this process's own, never one another process is building), a job whose own data is too large fails
naming the limit, the page cache never holds more than its limit (a full disk included), and
`spotpipe data cache` lists and clears the entries."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import pathlib
import re
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from runtime.config import DataSpec
from runtime.data import hygiene
from runtime.data.dataset import Batches, DataError, open_dataset
from runtime.data.pagecache import LOCK_STRIPES, PageCache
from runtime.data.prepare import prepare
from spotpipe.data import run_cache

from .conftest import corpus, make_config

MODEL = make_config("text:x").model
TEXT_CHARS = 100_000
"""ASCII characters of a test source: 100,000 byte tokens, stored as uint16, a ~200 KB cache entry."""
TWO_FIT = 500_000
"""A `data.cache_bytes` two such entries fit in, three do not."""


@pytest.fixture(autouse=True)
def opened(monkeypatch):
    """A fresh record of the corpora this process opened: the other tests' entries are not this test's."""
    fresh: set[Path] = set()
    monkeypatch.setattr(hygiene, "_opened", fresh)
    return fresh


def text_source(parent: Path, name: str, seed: int, chars: int = TEXT_CHARS) -> str:
    """A text source: a folder holding one ASCII file of `chars` bytes (so its token count is exact)."""
    folder = parent / name
    folder.mkdir(parents=True)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz .,\n", dtype=np.uint8)
    (folder / "doc.txt").write_bytes(letters[np.random.default_rng(seed).integers(0, len(letters), chars)].tobytes())
    return f"text:{folder}"


def open_text(source: str, cache_bytes: int = DataSpec().cache_bytes) -> Path:
    """Open `source` through the node cache; its entry's folder."""
    dataset = open_dataset(DataSpec(source=source, cache_bytes=cache_bytes), MODEL)
    return Path(dataset.description["cache"])


def last_used(folder: Path, seconds_ago: float) -> None:
    """Stamp the entry as last used `seconds_ago` (the LRU order, set explicitly instead of waiting)."""
    stamp = time.time() - seconds_ago
    os.utime(folder / ".used", (stamp, stamp))


def corpus_folders(root: Path) -> set[Path]:
    return {entry.path for entry in hygiene.corpus_entries(root)}


def test_the_least_recently_used_corpus_is_evicted_never_one_this_process_opened(tmp_path, cache, opened):
    a = open_text(text_source(tmp_path, "a", 1), TWO_FIT)
    b = open_text(text_source(tmp_path, "b", 2), TWO_FIT)
    sizes = {folder: hygiene.folder_bytes(folder) for folder in (a, b)}
    assert 2 * max(sizes.values()) <= TWO_FIT < 3 * min(sizes.values()), sizes  # the premise: two fit, three do not
    assert corpus_folders(cache) == {a, b}

    # `_opened` lists the entries this process opened, which it never evicts: forget a and b, as if
    # an earlier run had opened them, so that they become candidates for eviction.
    opened.clear()
    last_used(a, 100)
    last_used(b, 200)  # b, opened after a, is nevertheless the least recently used
    c = open_text(text_source(tmp_path, "c", 3), TWO_FIT)
    assert not b.exists() and a.is_dir() and c.is_dir()
    assert corpus_folders(cache) == {a, c}
    assert sum(e.bytes for e in hygiene.corpus_entries(cache)) <= TWO_FIT

    # c is now the oldest but this process opened it: b, opened again (tokenized again), pushes a out instead
    last_used(c, 1000)
    last_used(a, 10)
    assert open_text(text_source(tmp_path / "again", "b", 2), TWO_FIT) == b  # same content, same entry
    assert corpus_folders(cache) == {b, c}
    assert hygiene.evict_corpora(cache, TWO_FIT) == []  # within the limit: nothing more to delete
    train = open_dataset(DataSpec(source=f"text:{tmp_path / 'c'}", cache_bytes=TWO_FIT), MODEL).train
    assert len(train) > 0 and train.take(np.array([0, len(train) - 1]))[0].shape == (2, MODEL.seq_len)


def test_the_jobs_own_data_beyond_cache_bytes_is_an_error_naming_the_limit(tmp_path, cache):
    source = text_source(tmp_path, "big", 7, chars=200_000)
    with pytest.raises(DataError) as caught:
        open_dataset(DataSpec(source=source, cache_bytes=64 << 10), MODEL)
    message = str(caught.value)
    assert "data.cache_bytes=65,536" in message
    assert "spotpipe data prepare" in message and "shards:" in message
    (entry,) = hygiene.corpus_entries(cache)  # the entry it names is the one this job built
    assert str(entry.path) in message and f"{entry.bytes:,} bytes" in message


def test_an_entry_another_process_holds_is_neither_evicted_nor_cleared(tmp_path, cache, opened):
    a = open_text(text_source(tmp_path, "a", 1))
    opened.clear()  # as if an earlier run had opened a: a candidate for eviction
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys\n"
         "handle = open(sys.argv[1], 'a')\n"
         "fcntl.flock(handle, fcntl.LOCK_EX)\n"
         "print('locked', flush=True)\n"
         "sys.stdin.read()\n",
         str(a.with_name(a.name + ".lock"))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        b = open_text(text_source(tmp_path, "b", 2), cache_bytes=300_000)  # only one of a and b fits
        assert a.is_dir() and b.is_dir(), "a is being built by another process: kept"
        assert hygiene.evict_corpora(cache, 300_000) == []
        b_bytes = hygiene.folder_bytes(b)
        assert hygiene.clear(cache) == b_bytes
        assert corpus_folders(cache) == {a} and (a / "meta.json").is_file()
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    a_bytes = hygiene.folder_bytes(a)
    assert hygiene.clear(cache) == a_bytes  # the lock released: a goes too
    assert not a.exists() and corpus_folders(cache) == set()


def test_data_cache_lists_tokens_and_pages_and_clears_them(tmp_path, cache):
    text = text_source(tmp_path, "text", 1)
    open_text(text)
    listing = io.StringIO()
    assert run_cache(clear=False, stream=listing) == 0
    lines = listing.getvalue().splitlines()
    assert any(line.startswith("tokens") and text in line for line in lines)
    assert not any(line.startswith("pages") for line in lines)

    prepared_from = tmp_path / "small"
    prepared_from.mkdir()
    for i in range(4):
        (prepared_from / f"doc{i}.txt").write_text(corpus(20 + i, 900))
    prepare(f"text:{prepared_from}", tokenizer="byte", out=str(tmp_path / "prepared"), shard_bytes=1024,
            page_bytes=128, workers=1, stream=io.StringIO())
    batches = Batches(make_config(f"shards:{tmp_path / 'prepared'}"))
    for step in range(3):
        batches.train(step=step, index=0, size=2)
    batches.dataset.train.stream.pool.shutdown(wait=True)  # the background prefetches done: nothing lands later
    pages = PageCache(cache / "pages", DataSpec().cache_bytes)
    held = pages.totals()["held"]
    assert held > 0 and hygiene.page_entries(cache)

    listing = io.StringIO()
    assert run_cache(clear=False, stream=listing) == 0
    lines = listing.getvalue().splitlines()
    assert any(line.startswith("tokens") and text in line for line in lines)
    assert any(line.startswith("pages") and "pages of shard" in line for line in lines)
    corpus_bytes = sum(e.bytes for e in hygiene.corpus_entries(cache))
    entries = len(hygiene.corpus_entries(cache)) + len(hygiene.page_entries(cache))
    assert f"MB in {entries} entries" in lines[-1]

    cleared = io.StringIO()
    assert run_cache(clear=True, stream=cleared) == 0
    assert cleared.getvalue().strip() == f"cleared {cache}: {corpus_bytes + held:,} bytes freed"
    assert re.search(r"[1-9]", cleared.getvalue().split(":")[-1])  # a non-zero amount
    assert pages.totals()["held"] == 0 and pages.totals()["pages"] == 0
    assert hygiene.corpus_entries(cache) == []
    assert hygiene.page_entries(cache) == []

    after = io.StringIO()
    assert run_cache(clear=False, stream=after) == 0
    assert after.getvalue().strip() == f"{cache}: empty"


def test_the_listing_after_clear_says_empty(cache):
    pages = PageCache(cache / "pages", DataSpec().cache_bytes)
    for page in range(3):
        pages.get(PageCache.key("cd" * 32, page), lambda: b"p" * 1000)
    cleared = io.StringIO()
    assert run_cache(clear=True, stream=cleared) == 0
    assert cleared.getvalue().strip() == f"cleared {cache}: 3,000 bytes freed"
    after = io.StringIO()
    assert run_cache(clear=False, stream=after) == 0
    assert after.getvalue().strip() == f"{cache}: empty"


def test_a_full_disk_leaves_no_page_and_no_record(tmp_path, monkeypatch):
    write_bytes = pathlib.Path.write_bytes

    def full_disk(self, data):
        if ".part-" in self.name:  # the page's temporary file: the disk is full
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return write_bytes(self, data)

    monkeypatch.setattr(pathlib.Path, "write_bytes", full_disk)
    cache = PageCache(tmp_path / "pages", 64 << 10)
    fetches = []

    def fetch() -> bytes:
        fetches.append(1)
        return b"page-bytes" * 100

    key = PageCache.key("ab" * 32, 3)
    assert cache.get(key, fetch) == b"page-bytes" * 100
    assert not (tmp_path / "pages" / key).exists()
    assert [p.name for p in (tmp_path / "pages" / key).parent.iterdir()] == []  # no temporary left either
    assert cache.totals()["held"] == 0 and cache.totals()["pages"] == 0
    assert cache.get(key, fetch) == b"page-bytes" * 100
    assert len(fetches) == 2, "a page that could not be written is a miss: fetched again"

    monkeypatch.setattr(pathlib.Path, "write_bytes", write_bytes)  # space again: kept
    assert cache.get(key, fetch) == b"page-bytes" * 100 and cache.get(key, fetch) == b"page-bytes" * 100
    assert len(fetches) == 3 and (tmp_path / "pages" / key).is_file()
    assert cache.totals()["held"] == 1000 and cache.totals()["pages"] == 1


def page_files(root: Path) -> dict[str, int]:
    """The page files under a page cache's folder (key -> bytes), temporaries included."""
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*")
            if p.is_file() and p.parent.name != "locks" and not p.name.startswith("pages.sqlite3")}


def recorded(root: Path) -> dict[str, int]:
    with sqlite3.connect(root / "pages.sqlite3") as db:
        return dict(db.execute("SELECT key, bytes FROM pages").fetchall())


def test_the_page_cache_never_holds_more_than_its_limit(tmp_path):
    limit, size = 16 << 10, 4 << 10
    root = tmp_path / "pages"
    cache = PageCache(root, limit)
    errors: list[BaseException] = []

    def store(pages: range) -> None:
        try:
            for page in pages:
                data = bytes([page]) * size
                assert cache.get(PageCache.key(f"{page % 5:02x}" * 32, page), lambda data=data: data) == data
        except BaseException as exc:  # surfaced by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=store, args=(range(start, 50, 2),)) for start in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    totals = cache.totals()
    assert totals["fetched"] == 50 * size, "every page was fetched and stored once"
    assert totals["peak"] <= limit and totals["held"] == limit and totals["pages"] == limit // size
    held = recorded(root)
    assert sum(held.values()) == totals["held"]
    files = page_files(root)
    assert not [name for name in files if Path(name).name.startswith(".")], "no temporary file left"
    assert all(files.get(key) == size for key in held), "every recorded page is on disk"
    assert sum(files.values()) <= limit, "the disk holds no page beyond the limit"


def other_stripe_keys(victim: str, count: int) -> list[str]:
    """Keys whose lock stripe differs from `victim`'s: another thread can store them while `victim`'s is held."""
    def stripe(key: str) -> int:
        return int(hashlib.blake2b(key.encode(), digest_size=2).hexdigest(), 16) % LOCK_STRIPES

    return [key for key in (PageCache.key("ef" * 32, n) for n in range(100)) if stripe(key) != stripe(victim)][:count]


def store_while_writing(monkeypatch, victim: str, keys: list[str], cache: PageCache, data: bytes, *,
                        disk_full: bool) -> None:
    """While `victim`'s page file is being written, another thread (another rank) stores `keys`,
    evicting it; then the write goes on (or fails: a full disk)."""
    write_bytes = pathlib.Path.write_bytes

    def interleaved(self, payload):
        if self.parent.name == Path(victim).parent.name and self.name.startswith(f".{Path(victim).name}.part-"):
            other = threading.Thread(target=lambda: [cache.get(key, lambda: data) for key in keys])
            other.start()
            other.join(timeout=60)
            assert not other.is_alive()
            if disk_full:
                raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return write_bytes(self, payload)

    monkeypatch.setattr(pathlib.Path, "write_bytes", interleaved)


@pytest.mark.parametrize("disk_full", [False, True], ids=["written", "disk-full"])
def test_a_page_evicted_while_being_written_leaves_no_file_and_keeps_the_count(tmp_path, monkeypatch, disk_full):
    # Written: the rename is skipped, so no page stays on disk unrecorded (beyond the limit, out of
    # clear's reach). Disk full: its size is not taken off `held` a second time.
    limit, size = 16 << 10, 4 << 10
    root = tmp_path / "pages"
    cache = PageCache(root, limit)
    page = b"x" * size
    for n in range(3):
        cache.get(PageCache.key("ab" * 32, n), lambda: page)
    victim = PageCache.key("cd" * 32, 0)
    store_while_writing(monkeypatch, victim, other_stripe_keys(victim, 4), cache, page, disk_full=disk_full)
    assert cache.get(victim, lambda: page) == page
    assert cache.totals()["held"] == sum(recorded(root).values()) == sum(page_files(root).values()) == limit
    assert page_files(root) == recorded(root), "the disk holds what the records say"
    cache.clear()
    assert page_files(root) == {}
