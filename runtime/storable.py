"""Text every store of the product accepts, one rule for the job contract, every API body, every
webhook and every form.

PostgreSQL refuses U+0000 in text and jsonb, and no UTF-8 encoder takes a lone surrogate
(U+D800-U+DFFF, what a JSON "\\ud800" escape decodes to): SQLite stores both, and then the answer
that echoes them, or every later read of the row, fails. Refusing them on the way in gives the same
4xx on both databases. A value nested deeper than `MAX_JSON_DEPTH` is refused too: encoding it
for jsonb recurses once a level and can exhaust the stack (a 500) where parsing did not.
"""

from __future__ import annotations

from typing import Any

MAX_JSON_DEPTH = 64
"""The deepest nesting of objects and lists a stored JSON value may have."""


def unstorable(text: str) -> str | None:
    """What in `text` no store accepts ("a NUL character", "a lone surrogate ..."), or None."""
    if "\x00" in text:
        return "a NUL character"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "a lone surrogate (U+D800-U+DFFF, not a character)"
    return None


def unstorable_path(value: Any, root: str) -> tuple[str, str] | None:
    """Where the first unstorable key or string of a parsed JSON value is (`plan.zones[0]`, `a key
    of config.model`) and what it holds, or None. Iterative, so a deeply nested value cannot
    exhaust the stack while it is checked."""
    stack: list[tuple[Any, str, int]] = [(value, root, 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            what = unstorable(item)
            if what is not None:
                return path, what
        elif isinstance(item, dict | list):
            if depth >= MAX_JSON_DEPTH:  # named by its first 60 characters: [0][0]... says no more
                return path if len(path) <= 60 else f"{path[:60]}...", (
                    f"objects and lists nested more than {MAX_JSON_DEPTH} levels deep")
            if isinstance(item, list):
                stack.extend((child, f"{path}[{i}]", depth + 1) for i, child in enumerate(item))
                continue
            for key, child in item.items():
                what = unstorable(key) if isinstance(key, str) else None
                if what is not None:
                    return f"a key of {path}", what
                stack.append((child, key if path == root else f"{path}.{key}", depth + 1))
    return None
