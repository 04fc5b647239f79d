"""The costly-to-collect modules (tests/conftest.py's COSTLY_TO_COLLECT) are left out exactly where
`-m` deselects every test they hold: make test's xdist part, never its one-process part."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import COSTLY_TO_COLLECT, REPO_ROOT, leaves_out

SERIAL = COSTLY_TO_COLLECT["reliability/test_api_fuzz.py"]


def _makefile(name: str) -> str:
    found = re.search(rf"^{name} :?= (.*)$", (REPO_ROOT / "Makefile").read_text(), re.MULTILINE)
    assert found, f"Makefile sets no {name}"
    return found.group(1)


def _ci_pass_marks() -> list[str]:
    """The `PYTEST_MARKS` of each of .ci/run's passes."""
    found = re.findall(r"PYTEST_MARKS='([^']*)'", (REPO_ROOT / ".ci" / "run").read_text())
    assert len(found) == 2, found
    return found


def test_make_tests_two_parts_leave_the_fuzz_out_of_the_xdist_part_only() -> None:
    serial_marks = _makefile("SERIAL_MARKS")
    for narrowed in ("", *(f" and ({marks})" for marks in _ci_pass_marks())):
        assert leaves_out(f"not ({serial_marks}){narrowed}", SERIAL)
        assert not leaves_out(f"({serial_marks}){narrowed}", SERIAL)


@pytest.mark.parametrize(("markexpr", "left_out"), [
    ("", False),  # no -m: everything is collected
    ("serial", False),
    ("not serial", True),
    ("parametrize and serial", False),  # the fuzz's own parametrized tests carry both
    ("not serial and not runtime", True),
    ("runtime", False),  # kept: a test of it could carry `runtime` too; only what cannot select it leaves it out
])
def test_left_out_only_where_nothing_of_it_could_be_selected(markexpr: str, left_out: bool) -> None:
    assert leaves_out(markexpr, SERIAL) is left_out


def test_every_declared_module_exists() -> None:
    for relative in COSTLY_TO_COLLECT:
        assert Path(REPO_ROOT / "tests" / relative).is_file(), relative
