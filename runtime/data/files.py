"""The files a source's location names, in a fixed order: one file, a folder (recursively), a glob,
or an S3 object/prefix (mirrored into the node cache first, see `runtime.data.s3`).

A folder means every regular file under it whose path has no hidden part (a name starting with
"."), sorted by path relative to the folder; a glob (`*`, `[...]`, `**` for any depth) its matching
regular files, sorted. Every node lists the same files in the same order, so the token stream (and
its content hash) is the same everywhere.
"""

from __future__ import annotations

import glob
from pathlib import Path

from runtime.config import SourceURI
from runtime.data.errors import DataError

GLOB_CHARS = "*["


def is_glob(location: str) -> bool:
    return any(c in location for c in GLOB_CHARS)


def folder_files(folder: Path, suffixes: tuple[str, ...] = ()) -> list[Path]:
    """Regular, non-hidden files under `folder` (ending in one of `suffixes` when given), sorted."""
    found = []
    for path in folder.rglob("*"):
        relative = path.relative_to(folder)
        if any(part.startswith(".") for part in relative.parts) or not path.is_file():
            continue
        if not suffixes or path.name.endswith(suffixes):
            found.append(path)
    return sorted(found, key=lambda p: p.relative_to(folder).as_posix())


def local_root(uri: SourceURI, cache_dir: Path) -> Path:
    """The local path of a location: itself, or the node cache's mirror of an S3 object/prefix."""
    if uri.is_s3:
        if is_glob(uri.location):
            raise DataError(f"{uri}: globs are for local paths; expected s3://bucket/key or s3://bucket/prefix/")
        from runtime.data.s3 import fetch

        return fetch(uri.location, cache_dir).path
    return Path(uri.location)


def source_files(uri: SourceURI, cache_dir: Path, suffixes: tuple[str, ...] = ()) -> list[Path]:
    """The files of `uri`'s location in stream order; `DataError` when it names none."""
    if not uri.is_s3 and is_glob(uri.location):
        matches = sorted(Path(p) for p in glob.glob(uri.location, recursive=True) if Path(p).is_file())
        if not matches:
            raise DataError(f"{uri}: the glob {uri.location!r} matches no file on this node")
        return matches
    root = local_root(uri, cache_dir)
    if root.is_file():
        return [root]
    if not root.exists():
        raise DataError(f"{uri}: {root} does not exist on this node; expected a file, a folder or a glob")
    files = folder_files(root, suffixes)
    if not files:
        kind = f"files ending in {', '.join(suffixes)}" if suffixes else "regular non-hidden files"
        raise DataError(f"{uri}: the folder {root} holds no {kind}")
    return files
