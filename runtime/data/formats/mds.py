"""`mds:` MDS shards of text as MosaicML `streaming` writes them (`MDSWriter`), the column
`?field=NAME` (default `text`, encoded `str`) one document per sample. LOCATION is the writer's
`out`: a folder (or an S3 prefix, mirrored as for `text:`) holding `index.json` and the shards it
lists, read in the index's order, samples in shard order.

Read by spotpipe's own reader of the format (version 2), not the library: `mosaicml-streaming` pins
numpy<2.2, below spotpipe's. A shard is `uint32 n`, `n + 1` uint32 offsets from the file's start,
then the samples; a sample is one uint32 size per column of variable size (`column_sizes` null), in
column order, then the columns' bytes. Shards compressed by the writer (`compression`) are read
when the codec is at hand: gz and bz2 (the standard library), zstd (`zstandard`). The fixtures in
tests/runtime/data/fixtures/mds are written, and read back, by the library itself
(`tests/runtime/data/test_mds.py`).

Documents are joined with the tokenizer's separator and tokenized once per node (or prepared with
`spotpipe data prepare`); the validation split is the tail `val_fraction` of the tokens. No
index.json, a version or format other than MDS 2, a column that is not there or not text, a codec
not at hand, or a shard whose size or offsets do not match its index is a `DataError` naming the
shard and what was expected.
"""

from __future__ import annotations

import bz2
import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from runtime.config import DataSpec, ModelSpec, SourceURI
from runtime.data.cache import Documents, open_tokenized
from runtime.data.errors import DataError
from runtime.data.files import local_root

if TYPE_CHECKING:  # torch: not imported by `spotpipe data prepare`'s workers
    from runtime.data.dataset import Dataset

INDEX = "index.json"
FILE_SUFFIXES = (".mds", ".mds.gz", ".mds.bz2", ".mds.zstd")
LISTABLE = False
"""`spotpipe data prepare` mirrors an S3 MDS source rather than handing each unit one object: a
shard is decoded with its index's column layout."""


def _zstd(data: bytes) -> bytes:
    try:
        import zstandard
    except ImportError:
        raise DataError("zstd-compressed MDS shards need the zstandard package (pip install zstandard)") from None
    return zstandard.ZstdDecompressor().decompressobj().decompress(data)


CODECS = {"gz": gzip.decompress, "bz2": bz2.decompress, "zstd": _zstd}
"""Codec name (the writer's `compression`, before any `:level`) -> decompression."""


def read_index(root: Path) -> list[dict[str, Any]]:
    """The shards of an MDS folder's `index.json`, each checked to be one this reader reads."""
    path = root / INDEX
    try:
        index = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"{root}: no {INDEX}; expected an MDS folder (the `out` of MosaicML's MDSWriter)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"{path} is not JSON ({exc}); expected an MDS index") from None
    shards = index.get("shards") if isinstance(index, dict) else None
    if not isinstance(shards, list) or not shards:
        raise DataError(f"{path} lists no shards; expected MDS's {{\"shards\": [...], \"version\": 2}}")
    for number, shard in enumerate(shards):
        where = f"{path}: shard {number}"
        if not isinstance(shard, dict) or shard.get("format") != "mds" or shard.get("version") != 2:
            got = {k: shard.get(k) for k in ("format", "version")} if isinstance(shard, dict) else shard
            raise DataError(f"{where} is {got}; expected format 'mds', version 2")
        codec = str(shard.get("compression") or "").partition(":")[0]
        if codec and codec not in CODECS:
            raise DataError(f"{where} is compressed with {shard['compression']!r}; expected none or one of "
                            f"{sorted(CODECS)}")
    return shards


def _file_of(shard: dict[str, Any]) -> str:
    """The shard's file as written: its compressed file when it has one."""
    return (shard.get("zip_data") or shard["raw_data"])["basename"]


def read_samples(root: Path, shard: dict[str, Any], field: str) -> Iterator[str]:
    """The `field` text of each sample of one shard of the MDS folder `root`, in order."""
    path = root / _file_of(shard)
    names, encodings, sizes = shard["column_names"], shard["column_encodings"], shard["column_sizes"]
    if field not in names:
        raise DataError(f"{path}: no column {field!r} (its columns: {names}); expected a text column (set it with "
                        "?field=NAME)")
    column = names.index(field)
    if encodings[column] != "str":
        raise DataError(f"{path}: column {field!r} is encoded {encodings[column]!r}; expected text ('str')")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{root}: shard {_file_of(shard)} is listed in {INDEX} but missing") from None
    codec = str(shard.get("compression") or "").partition(":")[0]
    if shard.get("zip_data"):
        try:
            data = CODECS[codec](data)
        except DataError:
            raise
        except (OSError, EOFError, ValueError) as exc:
            raise DataError(f"{path}: not {codec} data ({exc}); expected the shard its index lists") from None
    expected = shard["raw_data"].get("bytes")
    count = int(shard.get("samples", -1))
    if (expected is not None and len(data) != expected) or len(data) < 4 * (count + 2):
        raise DataError(f"{path}: {len(data)} bytes, expected {expected} holding {count} samples (its index's)")
    offsets = np.frombuffer(data, "<u4", count=count + 2)
    if offsets[0] != count or offsets[-1] != len(data) or np.any(np.diff(offsets[1:]) < 0):
        raise DataError(f"{path}: its header does not describe {count} samples in {len(data)} bytes; expected an "
                        "MDS shard as its index lists it")
    for number in range(count):
        sample = data[int(offsets[1 + number]):int(offsets[2 + number])]
        yield _decode(sample, sizes, column, where=f"{path}: sample {number}")


def _decode(sample: bytes, sizes: list[int | None], column: int, *, where: str) -> str:
    """Column `column` of one sample: the variable sizes first, then the columns' bytes."""
    variable = sum(1 for size in sizes if not size)
    lengths = iter(np.frombuffer(sample, "<u4", count=variable).tolist()) if variable else iter(())
    start = 4 * variable
    for number, size in enumerate(sizes):
        length = size or next(lengths)
        if number == column:
            try:
                return sample[start:start + length].decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{where}: its text is not UTF-8 (byte {exc.start}: {exc.reason})") from None
        start += length
    raise AssertionError("unreachable: the column is one of the sizes")


def documents_of(uri: SourceURI, paths: list[Path]) -> Documents:
    """The documents of the shard files `paths` (each in its folder's index, as `stream_files` gives them)."""
    field = uri.options["field"]
    indexes: dict[Path, dict[str, dict[str, Any]]] = {}  # each folder's index read once
    for path in paths:
        root = next((r for r, shards in indexes.items()
                     if path.is_relative_to(r) and path.relative_to(r).as_posix() in shards), None)
        if root is None:
            root = _root_of(path)
            indexes[root] = {_file_of(shard): shard for shard in read_index(root)}
        yield from ([text] for text in read_samples(root, indexes[root][path.relative_to(root).as_posix()], field))


def _root_of(path: Path) -> Path:
    """The MDS folder of a shard file: the nearest folder above it with an index listing it."""
    for folder in path.parents:
        if (folder / INDEX).is_file() and path.relative_to(folder).as_posix() in {
                _file_of(shard) for shard in read_index(folder)}:
            return folder
    raise DataError(f"{path}: no {INDEX} above it lists it; expected a shard of an MDS folder")


def stream_files(uri: SourceURI, cache_dir: Path) -> dict[str, list[Path]]:
    """The shard files in the index's order (the folder mirrored first when it is on S3)."""
    root = local_root(uri, cache_dir)
    if root.is_file():
        root = root.parent if root.name == INDEX else root
    files = [root / _file_of(shard) for shard in read_index(root)]
    missing = [path.relative_to(root).as_posix() for path in files if not path.is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise DataError(f"{root}: shard {missing[0]} is listed in {INDEX} but missing{more}")
    return {"all": files}


def open_source(uri: SourceURI, spec: DataSpec, model: ModelSpec, cache_dir: Path) -> Dataset:
    return open_tokenized(uri, spec, model, cache_dir, files=stream_files(uri, cache_dir),
                          documents=lambda paths: documents_of(uri, paths))
