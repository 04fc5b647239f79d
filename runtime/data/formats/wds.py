"""`wds:` WebDataset tar shards of text (`?field=EXT`, default `txt`), read with the standard
library's `tarfile` (plain or compressed tars): one file, a folder (its `.tar`, `.tar.gz` and `.tgz`
files, sorted), a glob or an S3 object/prefix (files as for `text:`, `runtime.data.files`).

A sample is the run of consecutive members sharing a key (WebDataset's rule: the member's path up
to the first dot of its file name); its document is the member `KEY.EXT`, UTF-8 text. Documents
in tar order, tars in file order, joined with the tokenizer's separator, tokenized once per node
into the node cache (or prepared with `spotpipe data prepare`); the validation split is the tail
`val_fraction` of the tokens. A sample without the member, a member that is not UTF-8, or a file
that is not a tar is a `DataError` naming the tar and the sample.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from runtime.config import DataSpec, ModelSpec, SourceURI
from runtime.data.cache import Documents, open_tokenized
from runtime.data.errors import DataError
from runtime.data.files import source_files

if TYPE_CHECKING:  # torch: not imported by `spotpipe data prepare`'s workers
    from runtime.data.dataset import Dataset

FILE_SUFFIXES = (".tar", ".tar.gz", ".tgz")
"""A folder's files read as shards (others, a README say, are left out)."""


def split_key(name: str) -> tuple[str, str]:
    """(key, extension) of a member: `shard/0001.txt.gz` -> (`shard/0001`, `txt.gz`)."""
    folder, _, base = name.rpartition("/")
    stem, _, extension = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), extension


def read_samples(path: Path, field: str) -> Iterator[str]:
    """The `field` member's text of each sample of a tar, in tar order."""
    try:
        archive = tarfile.open(path, "r:*")  # noqa: SIM115 (closed by the with below)
    except (tarfile.TarError, OSError) as exc:
        raise DataError(f"{path} is not a tar file ({exc}); expected WebDataset tar shards") from None
    with archive:
        key, found, members = None, False, []
        for member in archive:
            if not member.isfile():
                continue
            member_key, extension = split_key(member.name)
            if member_key != key:
                if key is not None and not found:
                    raise _missing(path, key, field, members)
                key, found, members = member_key, False, []
            members.append(member.name)
            if extension == field:
                found = True
                data = archive.extractfile(member).read()
                try:
                    yield data.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise DataError(f"{path}: {member.name} is not UTF-8 text (byte {exc.start}: "
                                    f"{exc.reason})") from None
        if key is not None and not found:
            raise _missing(path, key, field, members)


def _missing(path: Path, key: str, field: str, members: list[str]) -> DataError:
    return DataError(f"{path}: sample {key!r} has no {field!r} member (it has {members}); expected each sample to "
                     f"hold its text as KEY.{field} (set the extension with ?field=EXT)")


def documents_of(uri: SourceURI, paths: list[Path]) -> Documents:
    """The documents of `paths` in order: each sample's `field` member."""
    return ([text] for path in paths for text in read_samples(path, uri.options["field"]))


def stream_files(uri: SourceURI, cache_dir: Path) -> dict[str, list[Path]]:
    return {"all": source_files(uri, cache_dir, FILE_SUFFIXES)}


def open_source(uri: SourceURI, spec: DataSpec, model: ModelSpec, cache_dir: Path) -> Dataset:
    return open_tokenized(uri, spec, model, cache_dir, files=stream_files(uri, cache_dir),
                          documents=lambda paths: documents_of(uri, paths))
