"""`spotpipe pull JOB [DIR]` against a live control plane: a finished job's weights come down whole,
each file's size and sha256 checked against the listing, the completeness marks last; a second pull
keeps what is already whole; a file whose bytes differ from its listed checksum is never saved; a job
without complete weights is one message; `spotpipe status` says where an ended job's weights are."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
import torch

from controlplane.jobs.models import TrainingJob
from runtime.checkpointing.export import export_state_dict, write_json
from runtime.models.hf_layout import HF_FILES, HF_FOLDER
from spotpipe import commands
from tests.controlplane.api_helpers import make_api_token, make_api_user
from tests.controlplane.factories import make_job, make_team


def _export(folder: Path) -> None:
    state = {"0.weight": torch.arange(12.0).reshape(3, 4), "0.bias": torch.ones(3), "1.weight": torch.zeros(2, 3)}
    write_json(folder / "spotpipe.json", {"model": {"kind": "gpt"}, "steps_done": 4})
    export_state_dict(folder, state, max_shard_bytes=40, steps_done=4)  # sharded: several files and an index
    (folder / HF_FOLDER).mkdir()  # `export = "hf"`: the transport is what is tested (the files: test_hf_export)
    for name in HF_FILES:
        (folder / HF_FOLDER / name).write_text(f"the Hugging Face folder's {name}")


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()
                  and not p.name.startswith("."))


def _run(command, *args) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return command(*args, out=out, err=err), out.getvalue(), err.getvalue()


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_pull_downloads_verified_weights_and_never_saves_a_bad_file(control_plane, tmp_path: Path, monkeypatch,
                                                                    settings) -> None:
    settings.SPOTPIPE_ARTIFACTS = str(tmp_path / "artifacts")
    team = make_team()
    monkeypatch.setenv("SPOTPIPE_URL", control_plane.url)
    monkeypatch.setenv("SPOTPIPE_TOKEN", make_api_token(team, user=make_api_user(team)))
    job = make_job(team)

    code, _, err = _run(commands.pull, job.pk, tmp_path / "early")
    assert code == 1 and f"job {job.pk} has no complete weights yet" in err
    assert not (tmp_path / "early").exists()

    folder = tmp_path / "artifacts" / f"job-{job.pk}-{job.artifacts_key}"
    _export(folder)
    TrainingJob.objects.filter(pk=job.pk).update(status="finished", steps_done=job.target_steps)
    code, out, err = _run(commands.pull, job.pk, tmp_path / "weights")
    assert code == 0, err
    served, got = _files(folder), _files(tmp_path / "weights")
    assert got == served and len(got) >= 8 and "hf/config.json" in got
    for name in got:
        assert (tmp_path / "weights" / name).read_bytes() == (folder / name).read_bytes()
    lines = [line for line in out.splitlines() if line.startswith("  [")]
    assert "spotpipe.json" in lines[-1] and "model.safetensors.index.json" in lines[-2]  # the marks last
    assert "hf/config.json" in lines[-3] and not any("hf/" in line for line in lines[-2:])  # the folder's mark
    assert "spotpipe export-hf" in out and f'from_pretrained("{tmp_path / "weights" / "hf"}")' in out

    code, out, _ = _run(commands.pull, job.pk, tmp_path / "weights")
    assert code == 0 and out.count("already here, sha256 verified") == len(got)

    # The server's file changes under its recorded checksum (same size and time): not saved.
    shard = next(p for p in folder.iterdir() if p.name.startswith("model-0"))
    stat = shard.stat()
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    code, _, err = _run(commands.pull, job.pk, tmp_path / "again")
    assert code == 1 and f"{shard.name}: received" in err and "not saved" in err
    assert not (tmp_path / "again" / shard.name).exists()
    assert not [p for p in (tmp_path / "again").iterdir() if p.name.startswith(".")]  # no partial file left

    code, out, _ = _run(commands.status, job.pk)
    assert code == 0 and f"spotpipe pull {job.pk}" in out and f"at {folder}" in out


@pytest.mark.parametrize(("name", "written"), [
    ("model.safetensors", True), ("hf/config.json", True), ("spotpipe.json", True),
    ("../model.safetensors", False), ("hf/../x", False), ("other/config.json", False), ("hf/sub/x", False),
    (".sha256.json", False), ("hf/.hidden", False), ("hf", True), ("/etc/passwd", False), ("a\\b", False), ("", False),
])
def test_pull_writes_only_plain_names_and_the_hugging_face_folders(name: str, written: bool) -> None:
    assert commands._pullable(name) is written
