"""`JobConfig.requirements` (issue 19) is checked torch-free when the contract is built: each entry
one plain requirement, s3:// package file or upload:<sha256>, never a pip option; the errors name
the entry (`requirements[1]`, which the control plane answers as `config.requirements[1]`)."""

from __future__ import annotations

import pytest

from runtime.config import REQUIREMENTS_MAX, LayoutError, build_job_config, each_error

LAYOUT = {"dp": 1, "pp": 1, "microbatches": 1}
GOOD = ["numpy>=1.26", "mypkg==1.2", "mypkg[extra]~=1.0", 'tomli; python_version < "3.12"', "numpy >= 2",
        "s3://bucket/pkgs/mypkg-1.0-py3-none-any.whl", "s3://bucket/mypkg-1.0.tar.gz", "upload:" + "ab" * 32]


def _problems(requirements: object) -> dict[str, str]:
    try:
        build_job_config({"requirements": requirements}, **LAYOUT)
    except LayoutError as exc:
        return {p.field: p.message for p in each_error(exc)}
    return {}


def test_requirements_round_trip_and_default_to_none() -> None:
    config = build_job_config({"requirements": GOOD}, **LAYOUT)
    assert config.requirements == GOOD and config.to_dict()["requirements"] == GOOD
    assert build_job_config({}, **LAYOUT).requirements == []


@pytest.mark.parametrize(("entry", "message"), [
    ("--index-url=http://evil", "is a pip option"),
    ("-e .", "is a pip option"),
    ("-r requirements.txt", "is a pip option"),
    ("numpy --index-url http://evil", "is not a valid requirement"),
    ("numpy\n--pre", "newline/tab"),
    (" numpy", "leading/trailing whitespace"),
    ("", "is empty"),
    ("mypkg @ https://example.com/mypkg.whl", "names a URL"),
    ("s3://bucket/notes.txt", "is not an s3://bucket/key URL of a package file"),
    ("s3://bucket", "is not an s3://bucket/key URL of a package file"),
    ("upload:abc", "is not upload:<sha256>"),
    ("upload:" + "AB" * 32, "is not upload:<sha256>"),
    ("x" * 501, "expected at most 500"),
])
def test_a_bad_entry_is_refused_naming_it(entry: str, message: str) -> None:
    problems = _problems(["numpy>=1.26", entry])
    assert list(problems) == ["requirements[1]"], problems
    assert message in problems["requirements[1]"]


def test_the_shape_is_checked_before_the_entries() -> None:
    assert _problems("numpy") == {"requirements": "requirements must be a list of strings, got 'numpy'"}
    assert _problems(["numpy", 3]) == {"requirements[1]": "requirements[1] must be a string, got 3"}
    too_many = _problems(["numpy"] * (REQUIREMENTS_MAX + 1))
    assert f"expected at most {REQUIREMENTS_MAX}" in too_many["requirements"]
