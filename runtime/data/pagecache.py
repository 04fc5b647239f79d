"""The node's cache of shard pages: bounded, least recently used pages evicted, shared by the ranks
of a node.

Where: `<cache_root()>/pages/`: one file per page, `<shard sha256[:24]>/<page number>`, and
`pages.sqlite3`, which records each page's size and last use (the eviction order) and the bytes
held. Keyed by the shard's content hash, not its location: a corpus copied elsewhere is reused.

Bounded: before a page is written, least recently used pages are evicted until the pages held
plus the new one fit in `limit_bytes`; the record of the new page and the evictions commit in one
SQLite transaction, so the ranks of a node (separate processes) never overshoot together. A
page is written to a temporary file and renamed into place, after its record: a crash or a full
disk leaves a record without a file (a miss, refetched) and never a file a reader trusts but
should not; the pages themselves were checked against their digests before they were written.
Two ranks missing the same page wait for one download (a lock stripe per page).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

from runtime.data.s3 import exclusive

LOCK_STRIPES = 256
TOUCH_FLUSH_S = 2.0
"""Last-use stamps are written at most this often per process (a write per read would contend)."""


class PageCache:
    def __init__(self, root: Path, limit_bytes: int) -> None:
        self.root = root
        self.limit_bytes = limit_bytes
        root.mkdir(parents=True, exist_ok=True)
        self._db_path = root / "pages.sqlite3"
        self._local = threading.local()
        self._touched: dict[str, float] = {}
        self._touch_lock = threading.Lock()
        self._flushed = time.monotonic()
        self._folders: set[Path] = set()
        with self._db() as db:
            db.execute("CREATE TABLE IF NOT EXISTS pages (key TEXT PRIMARY KEY, bytes INTEGER NOT NULL, "
                       "used REAL NOT NULL)")
            db.execute("CREATE INDEX IF NOT EXISTS pages_used ON pages (used)")
            db.execute("CREATE TABLE IF NOT EXISTS totals (name TEXT PRIMARY KEY, value INTEGER NOT NULL)")
            db.execute("INSERT OR IGNORE INTO totals VALUES ('held', 0), ('peak', 0), ('fetched', 0)")

    def _db(self) -> _Transaction:
        """This thread's connection (sqlite3 connections are not shared across threads)."""
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self._db_path, timeout=60, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            self._local.db = db
        return _Transaction(db)

    @staticmethod
    def key(shard_sha256: str, page: int) -> str:
        return f"{shard_sha256[:24]}/{page}"

    def _path(self, key: str) -> Path:
        return self.root / key

    def get(self, key: str, fetch: Callable[[], bytes]) -> bytes:
        """The page `key`: from the cache, else `fetch()` (which checks it) stored and returned."""
        found = self.peek(key)
        if found is not None:
            return found
        stripe = int(hashlib.blake2b(key.encode(), digest_size=2).hexdigest(), 16) % LOCK_STRIPES
        with exclusive(self.root / "locks" / f"{stripe}.lock"):
            found = self.peek(key)  # another rank (or the prefetcher) fetched it while this one waited
            if found is not None:
                return found
            data = fetch()
            self._store(key, data)
        return data

    def peek(self, key: str) -> bytes | None:
        """The page `key` if the cache holds it (stamped as used), else None."""
        try:
            data = self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        with self._touch_lock:
            self._touched[key] = time.time()
            due = time.monotonic() - self._flushed > TOUCH_FLUSH_S
        if due:
            self.flush_touches()
        return data

    def flush_touches(self) -> None:
        with self._touch_lock:
            touched, self._touched, self._flushed = self._touched, {}, time.monotonic()
        if touched:
            with self._db() as db:
                db.executemany("UPDATE pages SET used = ? WHERE key = ?", [(t, k) for k, t in touched.items()])

    def _store(self, key: str, data: bytes) -> None:
        size = len(data)
        if size > self.limit_bytes:
            return  # never kept: the caller uses it once
        doomed: list[str] = []
        with self._db() as db:
            held = db.execute("SELECT value FROM totals WHERE name = 'held'").fetchone()[0]
            if (old := db.execute("SELECT bytes FROM pages WHERE key = ?", (key,)).fetchone()) is not None:
                held -= old[0]  # a record whose file was lost: replaced
                db.execute("DELETE FROM pages WHERE key = ?", (key,))
            if held + size > self.limit_bytes:
                for old_key, old_bytes in db.execute("SELECT key, bytes FROM pages ORDER BY used"):
                    doomed.append(old_key)
                    held -= old_bytes
                    if held + size <= self.limit_bytes:
                        break
                db.executemany("DELETE FROM pages WHERE key = ?", [(k,) for k in doomed])
            held += size
            db.execute("INSERT INTO pages VALUES (?, ?, ?)", (key, size, time.time()))
            db.execute("UPDATE totals SET value = ? WHERE name = 'held'", (held,))
            db.execute("UPDATE totals SET value = MAX(value, ?) WHERE name = 'peak'", (held,))
            db.execute("UPDATE totals SET value = value + ? WHERE name = 'fetched'", (size,))
            # The evicted files go before the transaction ends, so the disk never holds more than
            # the records say (other ranks may still read a page they hold in memory: a copy).
            for old_key in doomed:
                with contextlib.suppress(FileNotFoundError):
                    self._path(old_key).unlink()
        path = self._path(key)
        if path.parent not in self._folders:  # one mkdir per shard folder and process, not per page
            path.parent.mkdir(parents=True, exist_ok=True)
            self._folders.add(path.parent)
        temporary = path.with_name(f".{path.name}.part-{os.getpid()}-{threading.get_ident()}")
        try:
            temporary.write_bytes(data)
            # Evictions unlink inside their transaction, so none runs between this check and the
            # rename: a page evicted while it was written is never left on disk without its record.
            with self._db() as db:
                if db.execute("SELECT 1 FROM pages WHERE key = ?", (key,)).fetchone() is not None:
                    os.replace(temporary, path)
        except OSError:  # a full disk: no file, so the record is a miss; drop it (unless evicted already)
            with self._db() as db:
                if db.execute("DELETE FROM pages WHERE key = ?", (key,)).rowcount:
                    db.execute("UPDATE totals SET value = value - ? WHERE name = 'held'", (size,))
        finally:
            temporary.unlink(missing_ok=True)

    def clear(self) -> int:
        """Delete every page; returns the bytes freed."""
        with self._db() as db:
            keys = [k for (k,) in db.execute("SELECT key FROM pages")]
            freed = db.execute("SELECT value FROM totals WHERE name = 'held'").fetchone()[0]
            db.execute("DELETE FROM pages")
            db.execute("UPDATE totals SET value = 0 WHERE name = 'held'")
            for key in keys:
                with contextlib.suppress(FileNotFoundError):
                    self._path(key).unlink()
        return freed

    def totals(self) -> dict[str, int]:
        """`held` (bytes of pages now), `peak` (the most ever held), `fetched` (bytes stored), `pages`."""
        with self._db() as db:
            values = dict(db.execute("SELECT name, value FROM totals").fetchall())
            values["pages"] = db.execute("SELECT COUNT(*) FROM pages").fetchone()[0]
        return values


class _Transaction:
    """`with` a connection: BEGIN IMMEDIATE (the write lock up front, so two ranks' evictions never
    interleave), COMMIT on success, ROLLBACK on an error."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, kind, value, traceback) -> None:
        self.db.execute("COMMIT" if kind is None else "ROLLBACK")
