"""Shared fixtures of the reliability tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _artifact_store(settings, tmp_path):
    """The artifact store (where `make_world` and the fuzzer upload packages) in a temporary folder."""
    settings.SPOTPIPE_ARTIFACTS = str(tmp_path / "artifacts")
