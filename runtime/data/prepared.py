"""A prepared corpus: the token stream a text, jsonl, hf or wds source makes (documents in order, joined
by the tokenizer's separator), tokenized once and stored as shards plus an index.

    LOCATION/index.json                    written last: a location without it is not prepared
    LOCATION/shards/<stream>-<unit>-<part>.bin   pages of token ids, each checked by its own digest
    LOCATION/units/<stream>-<unit>.json    what each unit (one input file) wrote: a resumed
                                           prepare skips the units it finds

A shard is a run of pages of `page_bytes`: each page holds `page_bytes - 8` bytes of token ids (the
last page fewer) followed by the 8-byte blake2b digest of those bytes, so one range read brings a
page and what checks it. A stream ("all", or "train" and "val" when the source has its own
validation split) is the concatenation of its shards' tokens, each shard's first `skip` tokens left
out (the separator a unit writes before its first document, when no document came before it).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from runtime.data.errors import DataError
from runtime.data.location import Location, Missing

INDEX_NAME = "index.json"
FORMAT = "spotpipe-shards"
VERSION = 1
DIGEST_BYTES = 8


def page_digest(data: bytes) -> bytes:
    """The digest a page's tokens are checked against (blake2b, 8 bytes: corruption, not an adversary)."""
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES).digest()


def payload_bytes(page_bytes: int) -> int:
    """Bytes of token ids in a page of `page_bytes`."""
    return page_bytes - DIGEST_BYTES


def pack_pages(tokens: bytes, page_bytes: int) -> bytes:
    """A shard's bytes: the token bytes cut into pages, each followed by its digest."""
    size = payload_bytes(page_bytes)
    return b"".join(tokens[i : i + size] + page_digest(tokens[i : i + size]) for i in range(0, len(tokens), size))


def unpack_page(page: bytes) -> bytes | None:
    """The token bytes of one page, or None when they do not match its digest."""
    body, digest = page[:-DIGEST_BYTES], page[-DIGEST_BYTES:]
    return body if len(page) > DIGEST_BYTES and page_digest(body) == digest else None


def unpack_pages(shard: bytes, page_bytes: int) -> bytes:
    """A whole shard's token bytes (`ValueError` on a page that does not match its digest)."""
    parts = []
    for start in range(0, len(shard), page_bytes):
        body = unpack_page(shard[start : start + page_bytes])
        if body is None:
            raise ValueError(f"page {start // page_bytes} does not match its digest")
        parts.append(body)
    return b"".join(parts)


@dataclass(frozen=True, slots=True)
class Shard:
    name: str
    """The object's name under the location (`shards/...bin`)."""
    tokens: int
    """Token ids in the object."""
    bytes: int
    """The object's size: its pages, digests included."""
    sha256: str
    """Of the whole object."""
    skip: int = 0
    """Leading tokens that are not part of the stream."""


@dataclass(kw_only=True, slots=True)
class PreparedIndex:
    source: str
    """The source it was prepared from, as written."""
    source_format: str
    """That source's format (text, jsonl, hf, wds, mds)."""
    tokenizer: str
    """The `data.tokenizer` it was prepared with."""
    tokenizer_identity: str
    """`Tokenizer.identity`: a job reading the shards must use a tokenizer with the same identity."""
    vocab_size: int
    """The tokenizer's vocabulary: the model's must be at least this."""
    dtype: str
    page_bytes: int
    max_id: int
    content_hash: str
    """The node cache's key of the same source read whole (`runtime.data.cache.content_key`): equal
    hashes mean equal token streams."""
    streams: dict[str, list[Shard]] = field(default_factory=dict)

    def stream_tokens(self, name: str) -> int:
        return sum(s.tokens - s.skip for s in self.streams[name])

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for shards in self.streams.values() for s in shards)

    def to_json(self) -> str:
        body = asdict(self)
        # Compact: every node reads it when it opens the source (a 2,000-shard index is ~300 KB).
        return json.dumps({"format": FORMAT, "version": VERSION, **body}, separators=(",", ":"), sort_keys=True)


def read_index(location: Location) -> PreparedIndex:
    """The index at `location`; `DataError` naming the location and what was expected."""
    where = f"{location.url.rstrip('/')}/{INDEX_NAME}"
    try:
        raw = location.read(INDEX_NAME)
    except Missing:
        partial = location.exists("units/.started")
        hint = ("a prepare started there and did not finish: run the same `spotpipe data prepare` again to "
                "complete it" if partial else "prepare the corpus there with `spotpipe data prepare`")
        raise DataError(f"{where} does not exist: not a prepared corpus; {hint}") from None
    try:
        body = json.loads(raw)
        if body.get("format") != FORMAT or body.get("version") != VERSION:
            raise ValueError(f"format {body.get('format')!r} version {body.get('version')!r}, "
                             f"expected {FORMAT!r} version {VERSION}")
        body.pop("format"), body.pop("version")
        streams = {name: [Shard(**s) for s in shards] for name, shards in body.pop("streams").items()}
        index = PreparedIndex(**body, streams=streams)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise DataError(f"{where} is not a spotpipe shard index ({exc}); prepare the corpus again "
                        "with `spotpipe data prepare`") from None
    if not ("all" in index.streams or {"train", "val"} <= set(index.streams)):
        raise DataError(f"{where} has streams {sorted(index.streams)}; expected 'all', or 'train' and 'val'")
    if index.page_bytes <= DIGEST_BYTES or payload_bytes(index.page_bytes) % _width(index.dtype):
        raise DataError(f"{where}: page_bytes {index.page_bytes} leaves no whole tokens beside the page digest")
    return index


def _width(dtype: str) -> int:
    return 2 if dtype == "uint16" else 4


def index_as_dict(index: PreparedIndex) -> dict[str, Any]:
    return json.loads(index.to_json())
