"""The runtime's packages import downward only (docs/runtime.md, "Modules"): among `runtime.config`,
`runtime.parallel`, `runtime.strategies`, `runtime.models`, ... no module-level import closes a
circle. (An import inside a function is a deliberate deferral, for torch or for Django, and is not
counted.) Read from the source, so a new circle fails here before anyone trips on it."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _package_edges(package: str) -> dict[str, set[str]]:
    """Sub-package -> the sibling sub-packages its modules import at module level."""
    edges: dict[str, set[str]] = defaultdict(set)
    for path in (ROOT / package).rglob("*.py"):
        here = ".".join(path.relative_to(ROOT).with_suffix("").parts[:2])
        for node in ast.parse(path.read_text()).body:
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                     else [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                there = ".".join(name.split(".")[:2])
                if name.startswith(f"{package}.") and there != here:
                    edges[here].add(there)
    return edges


def _a_circle(edges: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph, as the packages along it, or None."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        path.pop()
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_runtime_packages_import_downward_only() -> None:
    edges = _package_edges("runtime")
    assert edges["runtime.train"] and edges["runtime.sim"], "the scan found the runtime's imports"
    circle = _a_circle(edges)
    assert circle is None, f"a module-level import circle among the runtime's packages: {' -> '.join(circle or [])}"


def test_the_circle_finder_finds_a_circle() -> None:
    assert _a_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _a_circle({"a": {"b"}, "b": {"c"}}) is None
