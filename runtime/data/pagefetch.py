"""Fetching a prepared corpus's pages (`runtime.data.prepared`) into the node's page cache.

`download_page` reads one page by byte range and checks its size and digest; `cached_page` goes
through the page cache. A rank's prefetches run in a process of their own (`Prefetcher`: `python
-m runtime.data.pagefetch`), fed page requests on its stdin: its HTTP requests, digests and cache
writes then never take the rank's GIL from the training step (measured: on threads of the rank
they slowed a step by about 2.8 ms per page). It ends when the rank does (its stdin closes). A
prefetch that fails is dropped: the step that needs the page fetches it again and reports the error.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import weakref
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from runtime.data.errors import DataError
from runtime.data.location import Location, Missing, open_location
from runtime.data.pagecache import PageCache
from runtime.data.prepared import Shard, unpack_page

FETCH_THREADS = 16
"""Page downloads in flight in a rank, for the pages a step needs and no prefetch brought."""
PREFETCH_THREADS = 2
"""Page downloads in flight in a prefetch process: more threads of one process cost more CPU per
page than they save in waiting (measured against moto on 2 cores: 16 threads 8.7 ms of CPU a
page, 4 threads 3.8 ms, 2 threads 2.8 ms). At S3's tens of milliseconds a range, 2 threads bring
about 40-100 pages a second; a step's page that has not come is fetched by the rank itself."""
REMEMBERED_REQUESTS = 8192
"""Pages a rank remembers asking its prefetcher for, so the next steps' overlap is not asked twice."""


def download_page(location: Location, shard: Shard, page: int, page_bytes: int) -> bytes:
    """Page `page` of `shard`: its token bytes, after its size and digest are checked."""
    expected = min(page_bytes, shard.bytes - page * page_bytes)
    where = f"{location.url.rstrip('/')}/{shard.name}"
    try:
        data, total = location.read_range(shard.name, page * page_bytes, page_bytes)
    except Missing:
        raise DataError(f"{where} is missing: the shard the index lists went away while the job ran; "
                        "prepare the corpus again or restore the shard") from None
    if total != shard.bytes or len(data) != expected:
        raise DataError(f"{where} has {total} bytes; the index expects {shard.bytes}: the shard is not the one "
                        "prepared (prepare the corpus again)")
    body = unpack_page(data)
    if body is None:
        raise DataError(f"{where}: page {page} (bytes {page * page_bytes}..{page * page_bytes + len(data)}) does not "
                        "match its digest: the shard's content is not the one prepared (prepare the corpus again)")
    return body


def cached_page(cache: PageCache, location: Location, shard: Shard, page: int, page_bytes: int) -> bytes:
    return cache.get(PageCache.key(shard.sha256, page), lambda: download_page(location, shard, page, page_bytes))


class Prefetcher:
    """A rank's prefetch process: `ask` queues pages, never waiting for them."""

    def __init__(self, url: str, page_bytes: int, cache: PageCache) -> None:
        self.args = [sys.executable, "-m", "runtime.data.pagefetch", url, str(page_bytes), str(cache.root),
                     str(cache.limit_bytes)]
        self.process: subprocess.Popen | None = None
        self.asked: OrderedDict[tuple[str, int], None] = OrderedDict()
        self.broken = False

    def ask(self, pages: list[tuple[Shard, int]]) -> None:
        lines = []
        for shard, page in pages:
            if (shard.name, page) in self.asked:
                continue
            self.asked[(shard.name, page)] = None
            if len(self.asked) > REMEMBERED_REQUESTS:
                self.asked.popitem(last=False)
            lines.append(f"{shard.name} {shard.bytes} {shard.sha256} {page}\n")
        if not lines or self.broken:
            return
        try:
            if self.process is None:
                self.process = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                                text=True, bufsize=1)
                # A Popen dropped while its child runs is kept by `subprocess` (to reap it later),
                # stdin open: close stdin when this object goes, so the process ends then too.
                weakref.finalize(self, _close_quietly, self.process.stdin)
            self.process.stdin.write("".join(lines))
            self.process.stdin.flush()
        except OSError:  # it died: the steps fetch their own pages
            self.broken = True

    def close(self) -> None:
        if self.process is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None


def _close_quietly(stream) -> None:
    with contextlib.suppress(OSError):
        stream.close()


def serve(url: str, page_bytes: int, cache_root: Path, limit_bytes: int) -> None:
    """The prefetch process: fetch each requested page into the cache until stdin closes."""
    # A terminal's Ctrl-C reaches the whole process group: the rank's launcher answers it, and
    # this process ends with its rank (stdin closes), quietly.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    location = open_location(url)
    cache = PageCache(cache_root, limit_bytes)

    def one(line: str) -> None:
        name, size, sha256, page = line.split()
        shard = Shard(name=name, tokens=0, bytes=int(size), sha256=sha256)
        with contextlib.suppress(DataError, OSError):
            cached_page(cache, location, shard, int(page), page_bytes)

    with ThreadPoolExecutor(max_workers=PREFETCH_THREADS) as pool:
        for line in sys.stdin:
            if line.strip():
                pool.submit(one, line)
        pool.shutdown(wait=False, cancel_futures=True)  # the rank is gone: what it asked for is not needed
    cache.flush_touches()


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))
