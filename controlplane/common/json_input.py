"""JSON input every endpoint can store: parsed without a 500 on deep nesting, and refused with a
400 naming where it holds what no store accepts (`runtime.storable`: a NUL, a lone surrogate,
nesting deeper than jsonb can encode), so the same request gets the same answer on PostgreSQL and
SQLite."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from controlplane.common.errors import DomainError
from runtime.storable import unstorable_path


class StorableJSONParser(JSONParser):
    """DRF's JSON parser with a 400 for a body nested too deeply for Python's parser and for
    anything no store accepts (`runtime.storable`), naming where: `plan.zones[0]`."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict | None = None) -> Any:
        try:
            value = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply") from None
        found = unstorable_path(value, "body")
        if found is not None:
            where, what = found
            raise DomainError(f"{where} contains {what}", field=where.removeprefix("a key of "))
        return value
