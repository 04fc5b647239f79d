"""Fixed-width tables on stdout, for management commands and benchmarks alike."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import Any


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}"
    return str(value)


def print_table(title: str, headers: Sequence[str], rows: Iterable[Sequence[Any]], out: Any = None) -> None:
    """Print a fixed-width table with a title line (to `out`, default stdout)."""
    out = out if out is not None else sys.stdout
    cells = [[_fmt(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    print(f"\n{title}", file=out)
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for row in cells:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))),
              file=out)
    out.flush()
