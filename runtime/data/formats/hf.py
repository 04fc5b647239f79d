"""`hf:` Hugging Face data on disk, read with pyarrow alone (no `datasets` package; pyarrow is the
`hf` extra): `Dataset.save_to_disk` folders (Arrow IPC stream files + state.json), their
`DatasetDict` form (`dataset_dict.json` + one subfolder per split), Parquet files and folders (also
the Hub's `data/<split>-00000-of-00001.parquet` naming), a glob of .arrow/.parquet files, or any of
them on S3 (mirrored into the node cache).

Options: `column` (default `text`), a string column whose every row is one document, and `split`
(default `train`): the subfolder (or Parquet file name prefix) trained on when the folder holds
several splits. Validation: the folder's first split named validation, valid, val or test (other
than `split`), else the tail `val_fraction` of the tokens. Tokenized once per node into the node
cache, documents joined with the tokenizer's separator.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from runtime.config import DataSpec, ModelSpec, SourceURI
from runtime.data.cache import Documents, open_tokenized
from runtime.data.errors import DataError
from runtime.data.files import folder_files, is_glob, local_root, source_files

if TYPE_CHECKING:  # torch: not imported by `spotpipe data prepare`'s workers
    from runtime.data.dataset import Dataset

DATA_SUFFIXES = (".arrow", ".parquet")
LISTABLE = False
"""`spotpipe data prepare` mirrors an S3 hf source (its splits are found in the folder) rather than
handing each unit one object."""
VAL_SPLITS = ("validation", "valid", "val", "test")


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError:
        raise DataError("hf: sources need pyarrow on every node; install it with pip install 'spotpipe[hf]'") from None
    return pyarrow


def data_files(folder: Path) -> list[Path]:
    """A split folder's data files: in state.json's order when `save_to_disk` wrote one, else sorted."""
    state = folder / "state.json"
    if state.is_file():
        try:
            names = [entry["filename"] for entry in json.loads(state.read_text())["_data_files"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{state} is not a datasets state.json ({exc!r}); expected _data_files") from None
        return [folder / name for name in names]
    return folder_files(folder, DATA_SUFFIXES)


def split_files(root: Path, name: str) -> list[Path] | None:
    """The files of split `name`: subfolder `name/`, or Parquet files named `name-*` / `name.parquet`."""
    if (root / name).is_dir():
        return data_files(root / name) or None
    named = [p for p in folder_files(root, (".parquet",))
             if p.name == f"{name}.parquet" or p.name.startswith(f"{name}-")]
    return named or None


def stream_files(uri: SourceURI, cache_dir: Path) -> dict[str, list[Path]]:
    """{"train": ..., "val": ...} when the location has a validation split, else {"all": ...}."""
    if not uri.is_s3 and is_glob(uri.location):
        return {"all": source_files(uri, cache_dir, DATA_SUFFIXES)}
    root = local_root(uri, cache_dir)
    if root.is_file():
        return {"all": [root]}
    if not root.is_dir():
        raise DataError(f"{uri}: {root} does not exist on this node; expected a datasets folder, a Parquet "
                        "file or folder, or a glob")
    split = uri.options["split"]
    train = split_files(root, split)
    if train is None:
        listed = root / "dataset_dict.json"
        if listed.is_file() or split != "train":
            splits = json.loads(listed.read_text()).get("splits") if listed.is_file() else "none"
            raise DataError(f"{uri}: {root} has no split {split!r} (splits: {splits}); expected a subfolder "
                            f"{split}/ or Parquet files named {split}-*.parquet (set it with ?split=NAME)")
        train = data_files(root)
        if not train:
            raise DataError(f"{uri}: the folder {root} holds no .arrow or .parquet file")
        return {"all": train}
    for name in VAL_SPLITS:
        if name != split and (val := split_files(root, name)):
            return {"train": train, "val": val}
    return {"all": train}


def read_column(path: Path, column: str) -> Iterator[str]:
    """The strings of `column`, batch by batch (Arrow IPC stream or file, or Parquet)."""
    pa = _pyarrow()
    try:
        if path.suffix == ".parquet":
            reader = pa.parquet.ParquetFile(path)
            schema = reader.schema_arrow
            batches = reader.iter_batches(columns=[column]) if column in schema.names else iter(())
        else:
            source = pa.memory_map(str(path))
            try:
                reader = pa.ipc.open_stream(source)  # what save_to_disk writes
                batches = reader
            except pa.ArrowInvalid:  # the random-access file format
                reader = pa.ipc.open_file(source)
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            schema = reader.schema
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"{path} is not an Arrow or Parquet file ({exc}); expected Hugging Face data") from None
    if column not in schema.names:
        raise DataError(f"{path} has no column {column!r} (columns: {schema.names}); set it with ?column=NAME")
    if not (pa.types.is_string(schema.field(column).type) or pa.types.is_large_string(schema.field(column).type)):
        raise DataError(f"{path}: column {column!r} is {schema.field(column).type}, expected strings")
    row = 0
    for batch in batches:
        values = batch.column(batch.schema.get_field_index(column))
        if values.null_count:
            first = row + values.is_null().to_pylist().index(True)
            raise DataError(f"{path}: row {first} of column {column!r} is null; expected a string in every row")
        yield from values.to_pylist()
        row += len(values)


def documents_of(uri: SourceURI, paths: list[Path]) -> Documents:
    """The documents of `paths` in order: each row's `column` string."""
    return ([text] for path in paths for text in read_column(path, uri.options["column"]))


def open_source(uri: SourceURI, spec: DataSpec, model: ModelSpec, cache_dir: Path) -> Dataset:
    _pyarrow()
    return open_tokenized(uri, spec, model, cache_dir, files=stream_files(uri, cache_dir),
                          documents=lambda paths: documents_of(uri, paths))
