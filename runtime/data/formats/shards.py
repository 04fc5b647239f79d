"""`shards:` a corpus prepared once by `spotpipe data prepare` (`runtime.data.prepared`), in a local
folder or under `s3://bucket/prefix/`, read by random access on the global sample index.

A node reads only the pages (`index.page_bytes`, fetched by byte range and checked against their
digests) holding the windows its micro-batches need, through the node's page cache
(`runtime.data.pagecache`, bounded by `data.cache_bytes`, shared by the node's ranks), and has its
prefetch process fetch the pages of its next steps (`Batches` calls `prefetch`;
`runtime.data.pagefetch`). The samples are those
of the source it was prepared from read whole: same token stream, same windows, same held-out tail,
same sampler order. A shard that cannot be read while the job runs is a `DataError` naming it,
which fails the job once.
"""

from __future__ import annotations

import bisect
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from runtime.config import DataSpec, ModelSpec, SourceURI
from runtime.data.dataset import DataError, Dataset
from runtime.data.location import Location, open_location
from runtime.data.pagecache import PageCache
from runtime.data.pagefetch import FETCH_THREADS, Prefetcher, cached_page
from runtime.data.prepared import PreparedIndex, Shard, payload_bytes, read_index


class ShardedStream:
    """One stream of a prepared corpus: token ranges read through the page cache."""

    def __init__(self, name: str, shards: list[Shard], index: PreparedIndex, location: Location,
                 cache: PageCache, pool: ThreadPoolExecutor, prefetcher: Prefetcher) -> None:
        self.name = name
        self.shards = shards
        self.index = index
        self.location = location
        self.cache = cache
        self.pool = pool
        self.prefetcher = prefetcher
        self.width = np.dtype(index.dtype).itemsize
        self.starts = np.cumsum([0] + [s.tokens - s.skip for s in shards]).tolist()

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
        """The pages `wanted`: those in the page cache (a prefetch brought them) read from it, the
        others fetched concurrently (one the prefetcher is fetching is awaited there, not fetched twice)."""
        found, missing = {}, []
        for number, page in dict.fromkeys(wanted):
            data = self.cache.peek(PageCache.key(self.shards[number].sha256, page))
            if data is None:
                missing.append((number, page))
            else:
                found[(number, page)] = data
        futures = {(number, page): self.pool.submit(cached_page, self.cache, self.location, self.shards[number],
                                                    page, self.index.page_bytes)
                   for number, page in missing}
        found.update({page: future.result() for page, future in futures.items()})
        return found

    def prefetch(self, wanted: list[tuple[int, int]]) -> None:
        """Ask the prefetch process for `wanted` (not waiting)."""
        self.prefetcher.ask([(self.shards[number], page) for number, page in dict.fromkeys(wanted)])


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
        self.stream.prefetcher.close()
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
    prefetcher = Prefetcher(location.url, index.page_bytes, cache)
    streams = {name: ShardedStream(name, shards, index, location, cache, pool, prefetcher)
               for name, shards in index.streams.items()}
    if "val" in streams:
        train, val = streams["train"], streams["val"]
        train_split = ShardedWindows(train, 0, len(train), model.seq_len)
        val_split = ShardedWindows(val, 0, len(val), model.seq_len)
        train_tokens, val_tokens = len(train), len(val)
    else:
        whole = streams["all"]
        cut = hold_out_tail_cut(len(whole), spec, model, str(uri))
        train_split = ShardedWindows(whole, 0, cut, model.seq_len)
        val_split = ShardedWindows(whole, cut, len(whole), model.seq_len)
        train_tokens, val_tokens = cut, len(whole) - cut
    description = {"source": str(uri), "format": "shards", "tokenizer": spec.tokenizer,
                   "content_hash": index.content_hash, "prepared_from": index.source,
                   "shards": sum(len(s) for s in index.streams.values()), "cache": str(cache.root),
                   "tokens_dtype": index.dtype, "train_tokens": train_tokens, "val_tokens": val_tokens}
    return Dataset(train=train_split, val=val_split, description=description)
