"""No function in `runtime/` is longer than 80 lines (docstring and comments included), so the
trainer, the simulator and the schedules read top to bottom: a longer one is split where its steps
are, not grown in place."""

from __future__ import annotations

import ast
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
MAX_LINES = 80


def _function_lengths(root: Path) -> dict[str, int]:
    """`path:line name` -> lines, for every function and method below `root`."""
    lengths = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                where = f"{path.relative_to(root.parent)}:{node.lineno} {node.name}"
                lengths[where] = node.end_lineno - node.lineno + 1
    return lengths


def test_no_runtime_function_is_longer_than_80_lines() -> None:
    lengths = _function_lengths(RUNTIME)
    assert len(lengths) > 500  # the walk saw the runtime's functions, not an empty folder
    too_long = {where: lines for where, lines in lengths.items() if lines > MAX_LINES}
    assert too_long == {}, f"split these at their steps (at most {MAX_LINES} lines each): {too_long}"


def test_the_count_sees_a_long_function(tmp_path: Path) -> None:
    """The measure is not vacuous: a 90-line function is counted as 90 lines."""
    package = tmp_path / "runtime"
    package.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(89))
    (package / "long.py").write_text(f"def long():\n{body}\n")
    assert _function_lengths(package) == {"runtime/long.py:1 long": 90}
