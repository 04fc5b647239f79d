"""JSON input every endpoint can store: parsed without a 500 on deep nesting, with no NUL anywhere
(PostgreSQL refuses U+0000 in text and jsonb, SQLite stores it: the same request must get the same
answer on both)."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from controlplane.common.errors import DomainError


def nul_path(value: Any, root: str) -> str | None:
    """Where the first NUL is in a parsed JSON value (a key or a string), or None (iterative: a
    deeply nested value cannot exhaust the stack)."""
    stack: list[tuple[Any, str]] = [(value, root)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return path
        elif isinstance(item, dict):
            for key, child in item.items():
                if "\x00" in key:
                    return f"a key of {path}"
                stack.append((child, key if path == root else f"{path}.{key}"))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))
    return None


class StorableJSONParser(JSONParser):
    """DRF's JSON parser with a 400 for a body nested too deeply for Python's parser and for a NUL
    character anywhere in it (naming where: `plan.zones[0]`)."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict | None = None) -> Any:
        try:
            value = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply") from None
        where = nul_path(value, "body")
        if where is not None:
            field = where.removeprefix("a key of ")
            raise DomainError(f"{where} contains a NUL character", field=field)
        return value
