"""A CSV renderer, so `?format=csv` and `Accept: text/csv` negotiate CSV on the views that offer it."""

from __future__ import annotations

import csv
import io
from typing import Any

from rest_framework.renderers import BaseRenderer


class CSVRenderer(BaseRenderer):
    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        if isinstance(data, str):
            return data.encode(self.charset)
        # Errors (404, 400) arrive as dicts: render them as a one-row CSV.
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        if isinstance(data, dict):
            writer.writerow(["detail"])
            writer.writerow([data.get("detail", "")])
        return out.getvalue().encode(self.charset)
