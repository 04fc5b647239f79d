"""Spot price history files: parsing and the bulk, idempotent loader.

A price file carries the fields of boto3 `describe_spot_price_history`: zone (ID such as
`use1-az4`, or name such as `us-east-1a`), instance type, product description, price (USD/hour)
and an ISO 8601 timestamp. Tab- or comma-separated, with or without a header line, plain or
gzipped. Without a header the columns are in that order; with one they are found by name.

Loading is `INSERT ... ON CONFLICT DO NOTHING` in multi-row statements against the pool-time
unique constraint, so loading the same history twice adds nothing and the database counts what
was new. A file with bad rows is rejected whole unless the caller asks to skip them."""

from __future__ import annotations

import csv
import gzip
import io
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, TextIO

from django.db import connections, transaction

from controlplane.common.errors import DomainError
from controlplane.market.models import InstanceType, SpotPool, SpotPrice, Zone
from controlplane.market.services import instance_types_ensure, zones_ensure
from controlplane.tunables import tunable
from runtime.storable import unstorable

COLUMNS = ("zone", "instance_type", "product", "price", "timestamp")
# Header names accepted for each column (lower-cased, without `_`), boto3's first.
_HEADER_NAMES = {
    "zone": ("availabilityzoneid", "zoneid", "availabilityzone", "zone", "az"),
    "instance_type": ("instancetype", "type"),
    "product": ("productdescription", "product", "os"),
    "price": ("spotprice", "price"),
    "timestamp": ("timestamp", "time", "date"),
}
MAX_PRICE = Decimal("999999.999999")  # what the column (12 digits, 6 decimals) holds
_LONG_FRACTION = re.compile(r"(\.\d{6})\d+")
ProgressCallback = Callable[[int, float], None]


@dataclass(frozen=True, slots=True)
class PriceRow:
    """One validated price change."""

    zone: str
    instance_type: str
    product: str
    price: Decimal
    timestamp: datetime


@dataclass(frozen=True, slots=True)
class BadRow:
    """A line that could not be read, with its 1-based line number in the file."""

    line: int
    reason: str


@dataclass(slots=True)
class ParseInfo:
    """What the parser found out about the file's layout."""

    header: bool = False
    delimiter: str = ""


@dataclass(slots=True)
class LoadCounts:
    """Rows handed to the loader, how many were new and how many were already stored."""

    rows: int = 0
    inserted: int = 0
    already_present: int = 0
    seconds: float = 0.0

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


@dataclass(slots=True)
class IngestReport:
    """What happened to one file. `written` is False when the file was rejected."""

    path: str
    good_rows: int = 0
    bad_rows: list[BadRow] = field(default_factory=list)
    header: bool = False
    written: bool = False
    counts: LoadCounts = field(default_factory=LoadCounts)


class PriceFileRejected(DomainError):
    """The file has bad rows and skipping them was not asked for; nothing of it was written."""

    def __init__(self, report: IngestReport) -> None:
        lines = ", ".join(str(b.line) for b in report.bad_rows[:20])
        more = f" and {len(report.bad_rows) - 20} more" if len(report.bad_rows) > 20 else ""
        super().__init__(
            f"{report.path}: {len(report.bad_rows)} bad row(s) at line(s) {lines}{more}; nothing loaded",
            field="path",
        )
        self.report = report


# --- Parsing ------------------------------------------------------------------------------------

def open_price_file(path: str | Path) -> TextIO:
    """Open a price file as text, decompressing it when it is gzipped (by content, not name)."""
    path = Path(path)
    with path.open("rb") as raw:
        magic = raw.read(2)
    if magic == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return path.open("r", encoding="utf-8", newline="")


def parse_price(text: str) -> Decimal:
    """A price in USD/hour; raises ValueError naming what is wrong."""
    try:
        price = Decimal(text.strip())
    except InvalidOperation:
        raise ValueError(f"price {text!r} is not a number") from None
    if not price.is_finite():
        raise ValueError(f"price {text!r} is not a finite number")
    if price < 0:
        raise ValueError(f"price {text!r} is negative")
    if price > MAX_PRICE:
        raise ValueError(f"price {text!r} is above {MAX_PRICE}")
    return price.quantize(Decimal("0.000001"))


def parse_timestamp(text: str) -> datetime:
    """An ISO 8601 timestamp as an aware UTC datetime. A timestamp without offset is taken as
    UTC (the cloud APIs report UTC); fractions beyond microseconds are truncated."""
    value = _LONG_FRACTION.sub(r"\1", text.strip())
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"timestamp {text!r} is not ISO 8601") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    try:
        return parsed.astimezone(UTC)
    except OverflowError:  # year 1 or 9999 in its own zone, outside them in UTC
        raise ValueError(f"timestamp {text!r} is out of range in UTC") from None


# The columns each identifier of a row is stored in: it must fit the narrowest (their max_length).
_IDENTIFIER_COLUMNS = {
    "zone": ((Zone, "code"), (Zone, "zone_id")),
    "instance type": ((InstanceType, "name"),),
    "product": ((SpotPrice, "product"), (SpotPool, "product")),
}


def parse_identifier(what: str, text: str) -> str:
    """A row's zone, instance type or product (`what`) as stored; raises ValueError naming what is
    wrong: empty, what no store accepts (`runtime.storable`), unprintable (a control character:
    refused as in a plan's zone and type names, `planning.plans`) or longer than its columns (a 500
    on PostgreSQL, stored whole on SQLite)."""
    if not text:
        raise ValueError(f"{what} must not be empty")
    problem = unstorable(text)
    if problem is not None:
        raise ValueError(f"{what} contains {problem}")
    if not text.isprintable():
        raise ValueError(f"{what} {text[:60]!r} contains a control character or another unprintable one")
    limit = min(model._meta.get_field(name).max_length for model, name in _IDENTIFIER_COLUMNS[what])
    if len(text) > limit:
        raise ValueError(f"{what} is {len(text)} characters long; at most {limit}")
    return text


def normalise_product(text: str) -> str:
    """`Linux/UNIX (Amazon VPC)` and `Linux/UNIX` are the same product for pricing."""
    return text.strip().removesuffix(" (Amazon VPC)")


def _header_columns(cells: list[str]) -> dict[str, int] | None:
    """Column positions when `cells` is a header line, else None."""
    names = [c.strip().lower().replace("_", "").replace(" ", "") for c in cells]
    positions: dict[str, int] = {}
    for column, accepted in _HEADER_NAMES.items():
        for candidate in accepted:  # the first accepted name present wins (zone ID over zone name)
            if candidate in names:
                positions[column] = names.index(candidate)
                break
    return positions if len(positions) == len(COLUMNS) else None


def iter_price_rows(lines: Iterable[str], *, info: ParseInfo | None = None) -> Iterator[PriceRow | BadRow]:
    """Parse price lines into PriceRow or BadRow (with its line number). Blank lines are skipped.
    The delimiter (tab or comma) and the header are detected on the first non-blank line and
    recorded in `info` when given."""
    info = info if info is not None else ParseInfo()
    positions = {name: i for i, name in enumerate(COLUMNS)}
    width = len(COLUMNS)
    lines = iter(lines)
    line_no = 0
    for first in lines:
        line_no += 1
        if first.strip():
            break
    else:
        return
    delimiter = "\t" if "\t" in first else ","
    info.delimiter = delimiter
    first_cells = next(csv.reader([first], delimiter=delimiter))
    header = _header_columns(first_cells)
    if header is not None:
        positions, width = header, len(first_cells)
        info.header = True
        rest: Iterable[tuple[int, list[str]]] = ()
    else:
        rest = ((line_no, first_cells),)
    reader = csv.reader(lines, delimiter=delimiter)

    def numbered() -> Iterator[tuple[int, list[str]]]:
        yield from rest
        for cells in reader:
            # csv counts physical lines; a quoted field spanning lines is not expected here.
            yield line_no + reader.line_num, cells

    for number, cells in numbered():
        if not cells or (len(cells) == 1 and not cells[0].strip()):
            continue
        if len(cells) != width:
            yield BadRow(line=number, reason=f"expected {width} columns, got {len(cells)}")
            continue
        try:
            zone = parse_identifier("zone", cells[positions["zone"]].strip())
            itype = parse_identifier("instance type", cells[positions["instance_type"]].strip())
            product = parse_identifier("product", normalise_product(cells[positions["product"]]))
            price = parse_price(cells[positions["price"]])
            timestamp = parse_timestamp(cells[positions["timestamp"]])
        except ValueError as exc:
            yield BadRow(line=number, reason=str(exc))
            continue
        yield PriceRow(zone=zone, instance_type=itype, product=product, price=price, timestamp=timestamp)


# --- Loading ------------------------------------------------------------------------------------

def _rows_per_statement(using: str, batch_size: int) -> int:
    connection = connections[using]
    if connection.vendor == "sqlite":
        import sqlite3

        # SQLite >= 3.32 accepts 32766 parameters per statement (999 before).
        limit = 32766 if sqlite3.sqlite_version_info >= (3, 32) else 999
        return max(1, min(batch_size, limit // len(COLUMNS)))
    return max(1, batch_size)  # PostgreSQL gets arrays: 5 parameters whatever the batch size


_PG_ARRAY_TYPES = ("bigint[]", "bigint[]", "varchar[]", "numeric[]", "timestamptz[]")
_COLUMN_NAMES = ("instance_type_id", "zone_id", "product", "price", "timestamp")
_POOL_COLUMN_NAMES = ("instance_type_id", "zone_id", "product", "latest_price", "latest_timestamp")
Prepared = tuple[int, int, str, Decimal, datetime]


def _insert_rows(using: str, table: str, columns: tuple[str, ...], rows: list[Prepared], conflict: str) -> int:
    """`INSERT INTO table (columns) <rows> <conflict>`, returning the affected row count.

    PostgreSQL gets five array parameters (unnest) instead of five per row: the driver does not
    scan and rewrite a statement with thousands of placeholders. SQLite gets multi-row VALUES."""
    connection = connections[using]
    ops = connection.ops
    cols = ", ".join(ops.quote_name(c) for c in columns)
    if connection.vendor == "postgresql":
        arrays = [list(col) for col in zip(*rows, strict=True)]
        casts = ", ".join(f"%s::{t}" for t in _PG_ARRAY_TYPES)
        sql = f"INSERT INTO {ops.quote_name(table)} ({cols}) SELECT * FROM unnest({casts}) {conflict}"
        params: list[object] = arrays
    else:
        params = []
        for itype_id, zone_id, product, price, ts in rows:
            params += [itype_id, zone_id, product, ops.adapt_decimalfield_value(price, 12, 6),
                       ops.adapt_datetimefield_value(ts)]
        values = ", ".join(["(%s, %s, %s, %s, %s)"] * len(rows))
        sql = f"INSERT INTO {ops.quote_name(table)} ({cols}) VALUES {values} {conflict}"
    # A plain (not debug-logging) cursor: with DEBUG on, Django would log every batch and, on
    # SQLite, quote its thousands of parameters through the database just to build the log line.
    connection.ensure_connection()
    with connection.wrap_database_errors:
        cursor = connection.create_cursor()
        try:
            cursor.execute(sql, params)
            return max(cursor.rowcount, 0)
        finally:
            cursor.close()


def _insert_batch(using: str, batch: list[Prepared]) -> int:
    """Insert one batch of price changes, ignoring those already stored; returns how many were new."""
    return _insert_rows(using, SpotPrice._meta.db_table, _COLUMN_NAMES, batch, "ON CONFLICT DO NOTHING")


def _upsert_pools(using: str, batch: list[Prepared]) -> None:
    """Record each pool of the batch with its newest change, keeping a newer one already stored."""
    newest: dict[tuple[int, int, str], Prepared] = {}
    for row in batch:
        key = row[:3]
        if key not in newest or row[4] > newest[key][4]:
            newest[key] = row
    ops = connections[using].ops
    table = ops.quote_name(SpotPool._meta.db_table)
    ts, price = ops.quote_name("latest_timestamp"), ops.quote_name("latest_price")
    conflict = (
        f"ON CONFLICT ({ops.quote_name('instance_type_id')}, {ops.quote_name('zone_id')}, {ops.quote_name('product')})"
        f" DO UPDATE SET {ts} = excluded.{ts}, {price} = excluded.{price} WHERE excluded.{ts} > {table}.{ts}"
    )
    _insert_rows(using, SpotPool._meta.db_table, _POOL_COLUMN_NAMES, list(newest.values()), conflict)


def spot_prices_load(
    *,
    rows: Iterable[PriceRow],
    batch_size: int = 2000,
    using: str = "default",
    progress: ProgressCallback | None = None,
) -> LoadCounts:
    """Store price rows idempotently, creating unknown zones and instance types on the way.

    Runs in one transaction: either every row is stored (or found already stored) or none."""
    counts = LoadCounts()
    started = time.perf_counter()
    per_statement = _rows_per_statement(using, batch_size)
    zone_ids: dict[str, int] = {}
    itype_ids: dict[str, int] = {}

    def flush(chunk: list[PriceRow]) -> None:
        new_zones = {r.zone for r in chunk} - zone_ids.keys()
        if new_zones:
            zone_ids.update(zones_ensure(values=new_zones, using=using))
        new_types = {r.instance_type for r in chunk} - itype_ids.keys()
        if new_types:
            itype_ids.update(instance_types_ensure(names=new_types, using=using))
        prepared = [(itype_ids[r.instance_type], zone_ids[r.zone], r.product, r.price, r.timestamp) for r in chunk]
        for i in range(0, len(prepared), per_statement):
            part = prepared[i : i + per_statement]
            inserted = _insert_batch(using, part)
            _upsert_pools(using, part)
            counts.rows += len(part)
            counts.inserted += inserted
            counts.already_present += len(part) - inserted
        if progress is not None:
            progress(counts.rows, time.perf_counter() - started)

    with transaction.atomic(using=using):
        chunk: list[PriceRow] = []
        for row in rows:
            chunk.append(row)
            if len(chunk) >= batch_size:
                flush(chunk)
                chunk = []
        if chunk:
            flush(chunk)
    counts.seconds = time.perf_counter() - started
    return counts


def spot_prices_ingest_file(
    *,
    path: str | Path,
    skip_bad: bool = False,
    batch_size: int = 2000,
    using: str = "default",
    progress: ProgressCallback | None = None,
) -> IngestReport:
    """Validate then load one price file.

    The file is read twice: a first pass finds every bad row, so that a file with bad rows is
    rejected (PriceFileRejected, nothing written) before any write unless `skip_bad` is set, in
    which case the good rows are loaded and the bad ones reported. Memory stays flat for any size."""
    report = IngestReport(path=str(path))
    info = ParseInfo()
    with open_price_file(path) as handle:
        for item in iter_price_rows(handle, info=info):
            if isinstance(item, BadRow):
                report.bad_rows.append(item)
            else:
                report.good_rows += 1
    report.header = info.header
    if report.bad_rows and not skip_bad:
        raise PriceFileRejected(report)
    with open_price_file(path) as handle:
        good = (item for item in iter_price_rows(handle) if isinstance(item, PriceRow))
        report.counts = spot_prices_load(rows=good, batch_size=batch_size, using=using, progress=progress)
    report.written = True
    return report


# --- Uploaded files (the API) ----------------------------------------------------------------------


def price_upload_max_bytes() -> int:
    return int(tunable("SPOTPIPE_PRICE_UPLOAD_MAX_BYTES"))


def spot_prices_ingest_upload(*, upload: Any, skip_bad: bool = False) -> IngestReport:
    """`spot_prices_ingest_file` for an uploaded file (Django's UploadedFile): copied to a
    temporary file (the loader reads it twice), bounded by `price_upload_max_bytes()`. Errors
    name the field `file`: too large, not UTF-8 or a broken gzip, or bad rows without `skip_bad`
    (PriceFileRejected: nothing written)."""
    import tempfile

    limit = price_upload_max_bytes()
    if upload.size is not None and upload.size > limit:
        raise DomainError(f"the file is {upload.size} bytes; at most {limit}", field="file")
    name = Path(upload.name or "upload").name[:200]
    with tempfile.NamedTemporaryFile(prefix="spotpipe-prices-", suffix=".upload") as tmp:
        written = 0
        for chunk in upload.chunks():
            written += len(chunk)
            if written > limit:
                raise DomainError(f"the file is over {limit} bytes", field="file")
            tmp.write(chunk)
        tmp.flush()
        try:
            report = spot_prices_ingest_file(path=tmp.name, skip_bad=skip_bad)
        except PriceFileRejected as exc:
            exc.report.path = name
            exc.field = "file"
            exc.message = exc.message.replace(tmp.name, name)
            raise
        except (UnicodeDecodeError, EOFError, OSError, gzip.BadGzipFile) as exc:
            raise DomainError(f"{name}: not a UTF-8 text or gzip price file ({type(exc).__name__})",
                              field="file") from None
    report.path = name
    return report
