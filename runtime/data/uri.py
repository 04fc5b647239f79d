"""The grammar of a data source string, `FORMAT:LOCATION[?key=value&...]`, torch- and numpy-free.

One string names a job's data on the command line, in the API and in the dashboard:
`tokens:data/shakespeare` (nanoGPT's train.bin + val.bin), `text:s3://bucket/corpus/`,
`jsonl:data/*.jsonl?field=body`, `hf:data/wiki?column=text`, `py:mypkg.data:build`.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field

from runtime.config import TOKEN_WINDOW_FORMATS, LayoutError

DATA_FORMATS = (*TOKEN_WINDOW_FORMATS, "py")
"""Formats a source may name: nanoGPT token files, UTF-8 text, JSON Lines, Hugging Face `datasets`
folders, WebDataset tars and MosaicML MDS shards of text, a corpus prepared by `spotpipe data prepare` (shards), and a
user's map-style dataset by import path."""
FORMAT_OPTIONS: dict[str, dict[str, str]] = {
    "tokens": {"dtype": "uint16"},
    "text": {},
    "jsonl": {"field": "text"},
    "wds": {"field": "txt"},
    "mds": {"field": "text"},
    "hf": {"column": "text", "split": "train"},
    "py": {},
    "shards": {},
}
"""Options each format takes after `?`, with their defaults."""
PREPARABLE_FORMATS = ("text", "jsonl", "hf", "wds", "mds")
"""Formats `spotpipe data prepare` (and a job's `data.prepare` step) tokenizes into `shards:`;
`tokens:` and `py:` sources are read as they are."""
TOKEN_DTYPES = ("uint16", "uint32")
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")
_FIELD = "data.source"


@dataclass(frozen=True, slots=True)
class SourceURI:
    """A parsed data source."""

    format: str
    """One of `DATA_FORMATS`."""
    location: str
    """A local path or glob, an `s3://bucket/prefix` URI, or (py) `package.module:function`."""
    options: dict[str, str] = field(default_factory=dict)
    """The format's options, defaults filled in."""

    @property
    def is_s3(self) -> bool:
        return self.location.startswith("s3://")

    @property
    def bucket(self) -> str:
        """The S3 bucket (s3 locations only)."""
        return self.location.removeprefix("s3://").split("/", 1)[0]

    @property
    def key_prefix(self) -> str:
        """The S3 key or prefix (s3 locations only)."""
        rest = self.location.removeprefix("s3://").split("/", 1)
        return rest[1] if len(rest) > 1 else ""

    def __str__(self) -> str:
        given = {k: v for k, v in self.options.items() if v != FORMAT_OPTIONS[self.format].get(k)}
        query = f"?{urllib.parse.urlencode(given)}" if given else ""
        return f"{self.format}:{self.location}{query}"


def _bad(text: str, expected: str, field: str = _FIELD) -> LayoutError:
    return LayoutError(f"{field} {text!r} is invalid: {expected}", field=field)


def parse_source(text: str, *, field: str = _FIELD) -> SourceURI:
    """Parse `FORMAT:LOCATION[?options]`; raises `LayoutError` naming `field` and what was expected."""
    fmt, sep, rest = text.partition(":")
    if not sep or fmt not in DATA_FORMATS:
        raise _bad(text, f"expected FORMAT:LOCATION with FORMAT one of {DATA_FORMATS} "
                         "(for example text:corpus/ or tokens:data/train.bin)", field)
    location, _, query = rest.partition("?")
    if not location or location.strip() != location:
        raise _bad(text, "the location after the format is empty or has surrounding spaces", field)
    try:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise _bad(text, f"the options after '?' must be key=value pairs joined by '&', got {query!r}", field) from None
    known = FORMAT_OPTIONS[fmt]
    options = dict(known)
    for key, value in pairs:
        if key not in known:
            allowed = ", ".join(known) or "none"
            raise _bad(text, f"option {key!r} is unknown for {fmt}: sources; expected {allowed}", field)
        if not value:
            raise _bad(text, f"option {key!r} is empty", field)
        options[key] = value
    if fmt == "tokens" and options["dtype"] not in TOKEN_DTYPES:
        raise _bad(text, f"dtype={options['dtype']!r}; expected one of {TOKEN_DTYPES}", field)
    if fmt == "shards" and "://" not in location and any(c in location for c in "*["):
        raise _bad(text, "a shards: location is a folder or an s3://bucket/prefix/, not a glob", field)
    if fmt == "py":
        if not _IMPORT_PATH.match(location):
            raise _bad(text, "py: sources name a function as package.module:function", field)
    elif location.startswith("s3://"):
        _check_bucket(text, location, field)
    elif "://" in location:
        raise _bad(text, "the location must be a local path, a glob or an s3://bucket/prefix URI", field)
    return SourceURI(format=fmt, location=location, options=options)


def _check_bucket(text: str, location: str, field: str) -> None:
    bucket = location.removeprefix("s3://").split("/", 1)[0]
    if not re.fullmatch(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]", bucket):
        raise _bad(text, f"s3 bucket {bucket!r} is not a valid bucket name (3-63 lower-case letters, "
                         "digits, dots and hyphens)", field)


def check_prepare(source: str, out: str, *, field: str = "data.prepare") -> None:
    """A job's `data.prepare` step: `source` (its `data.source`) must be of a preparable format and
    `out` a folder or `s3://bucket/prefix/` that a `shards:` source can read; raises `LayoutError`."""
    if not source:
        raise _bad(out, "a prepare step needs a data.source to prepare", field)
    fmt = source.partition(":")[0]
    if fmt not in PREPARABLE_FORMATS:
        raise _bad(out, f"only {', '.join(PREPARABLE_FORMATS)} sources are prepared; data.source is {fmt}:", field)
    if not out or out.strip() != out or ("://" in out and not out.startswith("s3://")) \
            or any(c in out for c in "*?["):
        raise _bad(out, "expected a folder or an s3://bucket/prefix/ (not a glob)", field)
    if out.startswith("s3://"):
        _check_bucket(out, out, field)


def check_tokenizer(text: str, *, field: str = "data.tokenizer") -> None:
    """`byte`, or the path (or s3:// URI) of a Hugging Face `tokenizer.json`; raises `LayoutError`."""
    if text == "byte":
        return
    if not text or text.strip() != text:
        raise _bad(text, "expected 'byte' or the path of a tokenizer.json", field)
    if "://" in text and not text.startswith("s3://"):
        raise _bad(text, "a tokenizer is 'byte', a local path or an s3://bucket/key URI", field)
