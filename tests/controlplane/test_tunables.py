"""The control plane's SPOTPIPE_* tunables have one owner: controlplane/tunables.py declares each
once (default, meaning), `tunable()` reads it (settings, then the environment, then the default),
docs/configuration.md is the same list, and no control-plane module reads one another way."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from controlplane.tunables import TUNABLES, markdown_table, tunable

REPO = Path(__file__).resolve().parents[2]
# Read once by settings.py itself (before any tunable can be), or by processes that are not the
# control plane: the local provider's node process gets its own environment from the provider.
NOT_TUNABLES = {"SPOTPIPE_DEV", "SPOTPIPE_VAR_DIR"}
NODE_SIDE = REPO / "controlplane" / "orchestration" / "providers" / "local" / "node.py"


def test_the_docs_table_is_the_declared_list():
    doc = (REPO / "docs" / "configuration.md").read_text()
    assert markdown_table() in doc, (
        "docs/configuration.md is out of step; its table is the output of "
        "`python -c 'from controlplane.tunables import markdown_table; print(markdown_table(), end=\"\")'`")
    assert len({t.name for t in TUNABLES}) == len(TUNABLES)


def test_no_control_plane_module_reads_a_spotpipe_variable_another_way():
    """Every `SPOTPIPE_*` name a control-plane module reads through os.environ or settings is a
    declared tunable read with tunable() (names merely passed to child processes are allowed)."""
    reading = re.compile(
        r"""(os\.environ(\.get)?[\[(]|getenv\(|getattr\(settings,\s*|settings\.|\bsetting\()["']?(SPOTPIPE_[A-Z0-9_]+)""")
    offenders = []
    for path in sorted((REPO / "controlplane").rglob("*.py")):
        if path.name == "tunables.py" or path == NODE_SIDE or "migrations" in path.parts:
            continue
        for match in reading.finditer(path.read_text()):
            if match.group(3) not in NOT_TUNABLES:
                offenders.append(f"{path.relative_to(REPO)}: {match.group(0)}")
    assert offenders == []


def test_every_tunable_call_names_a_declared_tunable():
    declared = {t.name for t in TUNABLES}
    called = set()
    for path in (REPO / "controlplane").rglob("*.py"):
        text = path.read_text()
        called |= set(re.findall(r"""tunable(?:_from_env)?\(["'](SPOTPIPE_[A-Z0-9_]+)["']\)""", text))
        called |= set(re.findall(r"""rate_tunable = ["'](SPOTPIPE_[A-Z0-9_]+)["']""", text))  # common/throttles.py
    assert called - declared == set()
    assert declared - called == set(), "declared but never read: remove them or read them"


def test_settings_win_then_the_environment_then_the_default(settings, monkeypatch):
    monkeypatch.delenv("SPOTPIPE_HEARTBEAT_TIMEOUT_S", raising=False)
    assert tunable("SPOTPIPE_HEARTBEAT_TIMEOUT_S") == 2.0
    monkeypatch.setenv("SPOTPIPE_HEARTBEAT_TIMEOUT_S", "7.5")
    assert tunable("SPOTPIPE_HEARTBEAT_TIMEOUT_S") == 7.5
    settings.SPOTPIPE_HEARTBEAT_TIMEOUT_S = 3.0
    assert tunable("SPOTPIPE_HEARTBEAT_TIMEOUT_S") == 3.0
    monkeypatch.setenv("SPOTPIPE_AWS_INSTANCE_TYPES", "g5.xlarge, p4d.24xlarge")
    assert tunable("SPOTPIPE_AWS_INSTANCE_TYPES") == ["g5.xlarge", "p4d.24xlarge"]
    monkeypatch.setenv("SPOTPIPE_DATA_S3_CHECK", "false")
    assert tunable("SPOTPIPE_DATA_S3_CHECK") is False
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    assert tunable("SPOTPIPE_AWS_REGION") == "eu-west-1"
    settings.VAR_DIR = "/srv/spotpipe"
    monkeypatch.delenv("SPOTPIPE_ARTIFACTS", raising=False)
    assert tunable("SPOTPIPE_ARTIFACTS") == "/srv/spotpipe/artifacts"
    with pytest.raises(KeyError):
        tunable("SPOTPIPE_NOT_A_TUNABLE")
