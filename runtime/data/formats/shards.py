"""`shards:` a corpus prepared once by `spotpipe data prepare` (`runtime.data.prepared`), in a local
folder or under `s3://bucket/prefix/`, read by random access on the global sample index.

A node reads only the pages (`index.page_bytes`, fetched by byte range and checked against their
digests) holding the windows its micro-batches need, through the node's page cache
(`runtime.data.pagecache`, bounded by `data.cache_bytes`, shared by the node's ranks), and fetches
the pages of its next steps in the background (`Batches` calls `prefetch`). The samples are those
of the source it was prepared from read whole: same token stream, same windows, same held-out tail,
same sampler order. A shard that cannot be read while the job runs is a `DataError` naming it,
which fails the job once.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from runtime.config import DataSpec, ModelSpec
from runtime.data.dataset import DataError, Dataset
from runtime.data.location import Location, Missing, open_location
from runtime.data.pagecache import PageCache
from runtime.data.prepared import PreparedIndex, Shard, payload_bytes, read_index, unpack_page
from runtime.data.uri import SourceURI

FETCH_THREADS = 16
"""Page downloads in flight per process (S3 answers each range in tens of milliseconds)."""
MAX_PREFETCH_PAGES = 512
"""Background fetches queued at most per process: prefetching never runs ahead unbounded."""
KEPT_PREFETCH_BYTES = 64 << 20
"""Prefetched pages kept in memory until their step reads them, at most (per process; a page a step
read while its prefetch was still running may stay until pushed out: the bound holds)."""


class ShardedStream:
    """One stream of a prepared corpus: token ranges read through the page cache."""

    def __init__(self, name: str, shards: list[Shard], index: PreparedIndex, location: Location,
                 cache: PageCache, pool: ThreadPoolExecutor) -> None:
        self.name = name
        self.shards = shards
        self.index = index
        self.location = location
        self.cache = cache
        self.pool = pool
        self.width = np.dtype(index.dtype).itemsize
        self.starts = np.cumsum([0] + [s.tokens - s.skip for s in shards]).tolist()
        self._inflight: dict[tuple[int, int], Future] = {}
        self._ready: OrderedDict[tuple[int, int], bytes] = OrderedDict()  # prefetched, not yet read
        self._ready_bytes = 0
        self._inflight_lock = threading.RLock()  # a future already done runs its callback at once, inside

    def __len__(self) -> int:
        return self.starts[-1]

    # -- which pages a token range needs ------------------------------------------------------
    def pieces(self, first: int, stop: int) -> list[tuple[int, int, int]]:
        """(shard number, first byte, end byte) of stream tokens [first, stop)."""
        out = []
        number = bisect.bisect_right(self.starts, first) - 1
        while first < stop:
            shard = self.shards[number]
            within = first - self.starts[number] + shard.skip
            take = min(stop - first, self.starts[number + 1] - first)
            out.append((number, within * self.width, (within + take) * self.width))
            first += take
            number += 1
        return out

    def pages(self, first: int, stop: int) -> list[tuple[int, int]]:
        size = payload_bytes(self.index.page_bytes)
        return [(number, page) for number, lo, hi in self.pieces(first, stop)
                for page in range(lo // size, (hi - 1) // size + 1)]

    # -- reading ------------------------------------------------------------------------------
    def read(self, first: int, stop: int, pages: dict[tuple[int, int], bytes]) -> np.ndarray:
        """Tokens [first, stop) from `pages` (every page `pages(first, stop)` names, fetched: their
        token bytes, digests checked and removed)."""
        size = payload_bytes(self.index.page_bytes)
        parts = []
        for number, lo, hi in self.pieces(first, stop):
            blob = b"".join(pages[(number, page)] for page in range(lo // size, (hi - 1) // size + 1))
            base = (lo // size) * size
            parts.append(np.frombuffer(blob[lo - base : hi - base], dtype=self.index.dtype))
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def fetch(self, wanted: list[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        """The pages `wanted`: those a prefetch brought from memory, the others fetched concurrently
        (a page a prefetch is still fetching is awaited, not fetched twice)."""
        found, futures = {}, {}
        with self._inflight_lock:
            for page in dict.fromkeys(wanted):
                data = self._ready.pop(page, None)
                if data is not None:
                    self._ready_bytes -= len(data)
                    found[page] = data
        for page in dict.fromkeys(wanted):
            if page not in found:
                futures[page] = self._submit(page)
        found.update({page: future.result() for page, future in futures.items()})
        return found

    def prefetch(self, wanted: list[tuple[int, int]]) -> None:
        """Fetch `wanted` in the background and keep the pages in memory for the `fetch` that needs
        them (a bounded number: the oldest kept pages are dropped, the page cache still has them)."""
        with self._inflight_lock:
            fresh = [p for p in dict.fromkeys(wanted) if p not in self._ready and p not in self._inflight]
            fresh = fresh[: max(0, MAX_PREFETCH_PAGES - len(self._inflight))]
        for page in fresh:
            self._submit(page).add_done_callback(lambda future, page=page: self._keep(page, future))

    def _keep(self, page: tuple[int, int], future: Future) -> None:
        if future.exception() is not None:
            return  # the step that needs it fetches it again and fails with the error
        data = future.result()
        with self._inflight_lock:
            if page in self._ready:
                return
            self._ready[page] = data
            self._ready_bytes += len(data)
            while self._ready_bytes > KEPT_PREFETCH_BYTES and self._ready:
                _, dropped = self._ready.popitem(last=False)
                self._ready_bytes -= len(dropped)

    def _submit(self, page: tuple[int, int]) -> Future:
        with self._inflight_lock:
            future = self._inflight.get(page)
            if future is None:
                future = self.pool.submit(self._page, *page)
                self._inflight[page] = future
                future.add_done_callback(lambda _, page=page: self._done(page))
            return future

    def _done(self, page: tuple[int, int]) -> None:
        with self._inflight_lock:
            self._inflight.pop(page, None)

    def _page(self, number: int, page: int) -> bytes:
        shard = self.shards[number]
        return self.cache.get(PageCache.key(shard.sha256, page), lambda: self._download(shard, page))

    def _download(self, shard: Shard, page: int) -> bytes:
        """Page `page` of `shard`: its token bytes, after its size and digest are checked."""
        size = self.index.page_bytes
        expected = min(size, shard.bytes - page * size)
        where = f"{self.location.url.rstrip('/')}/{shard.name}"
        try:
            data, total = self.location.read_range(shard.name, page * size, size)
        except Missing:
            raise DataError(f"{where} is missing: the shard the index lists went away while the job ran; "
                            "prepare the corpus again or restore the shard") from None
        if total != shard.bytes or len(data) != expected:
            raise DataError(f"{where} has {total} bytes; the index expects {shard.bytes}: the shard is not the one "
                            "prepared (prepare the corpus again)")
        body = unpack_page(data)
        if body is None:
            raise DataError(f"{where}: page {page} (bytes {page * size}..{page * size + len(data)}) does not match "
                            "its digest: the shard's content is not the one prepared (prepare the corpus again)")
        return body


class ShardedWindows:
    """Non-overlapping windows of seq_len + 1 tokens over stream tokens [lo, hi), as `TokenWindows`
    cuts a token array, read through the stream's pages."""

    def __init__(self, stream: ShardedStream, lo: int, hi: int, seq_len: int) -> None:
        self.stream, self.lo, self.seq_len = stream, lo, seq_len
        self.count = max(0, (hi - lo - 1) // seq_len)

    def __len__(self) -> int:
        return self.count

    def _range(self, item: int) -> tuple[int, int]:
        first = self.lo + int(item) * self.seq_len
        return first, first + self.seq_len + 1

    def take(self, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        ranges = [self._range(i) for i in ids]
        pages = self.stream.fetch([p for first, stop in ranges for p in self.stream.pages(first, stop)])
        rows = np.stack([self.stream.read(first, stop, pages) for first, stop in ranges]).astype(np.int64)
        rows = torch.from_numpy(rows)
        return rows[:, :-1], rows[:, 1:]

    def prefetch(self, ids: np.ndarray) -> None:
        """Start fetching the pages of windows `ids` (the next steps'), not waiting."""
        self.stream.prefetch([p for i in ids for p in self.stream.pages(*self._range(i))])

    def close(self) -> None:
        self.stream.pool.shutdown(wait=True, cancel_futures=True)


def check_tokenizer_matches(uri: SourceURI, index: PreparedIndex, spec: DataSpec, model: ModelSpec,
                            cache_dir: Path) -> None:
    """The job's tokenizer is the one the shards were prepared with, and the model embeds its ids."""
    from runtime.data.tokenizer import check_model_vocabulary, load_tokenizer

    tokenizer = load_tokenizer(spec.tokenizer, cache_dir)
    if tokenizer.identity != index.tokenizer_identity:
        raise DataError(f"{uri} was prepared with tokenizer {index.tokenizer!r} ({index.tokenizer_identity}); the "
                        f"job's data.tokenizer {spec.tokenizer!r} is {tokenizer.identity}: expected the same "
                        "tokenizer (set data.tokenizer to it, or prepare the corpus again with this one)")
    check_model_vocabulary(tokenizer, model, spec.tokenizer)
    if index.max_id >= model.vocab_size:
        raise DataError(f"{uri} holds token id {index.max_id}, beyond the model's vocabulary "
                        f"(model.vocab_size={model.vocab_size})")


def open_source(uri: SourceURI, spec: DataSpec, model: ModelSpec, cache_dir: Path) -> Dataset:
    from runtime.data.formats.tokens import hold_out_tail_cut

    location = open_location(uri.location)
    index = read_index(location)
    check_tokenizer_matches(uri, index, spec, model, cache_dir)
    cache = PageCache(cache_dir / "pages", spec.cache_bytes)
    pool = ThreadPoolExecutor(max_workers=FETCH_THREADS, thread_name_prefix="shard-fetch")
    streams = {name: ShardedStream(name, shards, index, location, cache, pool)
               for name, shards in index.streams.items()}
    if "val" in streams:
        train, val = streams["train"], streams["val"]
        train_split = ShardedWindows(train, 0, len(train), model.seq_len)
        val_split = ShardedWindows(val, 0, len(val), model.seq_len)
        train_tokens, val_tokens = len(train), len(val)
    else:
        whole = streams["all"]
        cut = hold_out_tail_cut(len(whole), spec, model, f"{uri} ({len(whole)} tokens)")
        train_split = ShardedWindows(whole, 0, cut, model.seq_len)
        val_split = ShardedWindows(whole, cut, len(whole), model.seq_len)
        train_tokens, val_tokens = cut, len(whole) - cut
    description = {"source": str(uri), "format": "shards", "tokenizer": spec.tokenizer,
                   "content_hash": index.content_hash, "prepared_from": index.source,
                   "shards": sum(len(s) for s in index.streams.values()), "cache": str(cache.root),
                   "tokens_dtype": index.dtype, "train_tokens": train_tokens, "val_tokens": val_tokens}
    return Dataset(train=train_split, val=val_split, description=description)
