"""Weights out (issue 19): safetensors in the Hugging Face layout, written by the designated writers
of a distributed run, loaded by `spotpipe.load_model`, sampled by `spotpipe sample`, and continued
with `--init-from` (2N steps == N steps, export, N more)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

import spotpipe
from runtime.checkpointing.checkpoints import Checkpoints
from runtime.checkpointing.export import (
    INFO,
    WeightsFolder,
    export_layers,
    export_model,
    model_entry,
    optimizer_tensors,
)
from runtime.config import JobConfig, ModelSpec
from runtime.models.load import load_model
from runtime.models.model import build_layer, build_model
from runtime.train.optim import LayerState
from runtime.train.reference import train_reference
from spotpipe.cli import main as cli_main
from spotpipe.train import TrainOptions, run_train
from tests.runtime.data.conftest import moto_s3, s3  # noqa: F401 (fixtures: moto's S3 server, a bucket)

CORPUS = Path(sysconfig.get_paths()["stdlib"]) / "argparse.py"
TINY_GPT = """target_steps = 4
strategy = "recycle"
[config]
global_batch = 8
op_timeout_s = 2.0
heartbeat_timeout_s = 4.0
[config.model]
kind = "gpt"
n_layer = 2
n_embd = 16
n_head = 2
seq_len = 16
vocab_size = 256
"""


def _as_state_dict(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`layer{i}.{name}` (the reference's names) -> `{i}.{name}` (the nn.Sequential's)."""
    return {name.removeprefix("layer"): t for name, t in params.items()}


def _assert_equal_state(loaded: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], **tol) -> None:
    assert set(loaded) == set(expected)
    for name, t in expected.items():
        torch.testing.assert_close(loaded[name], t, msg=lambda m, n=name: f"{n}: {m}", **tol)


def test_sharded_export_reassembles_into_the_full_state_dict(tmp_path: Path) -> None:
    spec = ModelSpec(kind="mlp", n_layer=3, n_embd=8, in_features=4, vocab_size=5)
    model = build_model(spec, seed=3)
    plan = export_model(tmp_path, model, spec=spec, max_shard_bytes=200)
    assert len(plan.shards) > 3
    files = sorted(p.name for p in tmp_path.glob("model*.safetensors"))
    assert files == [f"model-{k:05d}-of-{len(plan.shards):05d}.safetensors" for k in range(1, len(plan.shards) + 1)]
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(model.state_dict())
    assert set(index["weight_map"].values()) == set(files)
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in model.state_dict().values())
    _assert_equal_state(WeightsFolder(tmp_path).state_dict(), model.state_dict(), rtol=0, atol=0)
    loaded = spotpipe.load_model(tmp_path)
    x = torch.randn(3, 4)
    torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)

    small = tmp_path / "small"
    export_model(small, model, spec=spec)  # under the limit: one file, no index
    assert sorted(p.name for p in small.iterdir()) == sorted([INFO, "model.safetensors"])
    _assert_equal_state(load_model(small).state_dict(), model.state_dict(), rtol=0, atol=0)


def test_load_model_from_s3(tmp_path: Path, s3) -> None:  # noqa: F811 (the fixture)
    client, bucket = s3
    spec = ModelSpec(kind="mlp", n_layer=2, n_embd=8, in_features=4, vocab_size=5)
    model = build_model(spec, seed=1)
    export_model(tmp_path, model, spec=spec, max_shard_bytes=300)
    for path in tmp_path.iterdir():
        client.upload_file(str(path), bucket, f"runs/7/{path.name}")
    client.put_object(Bucket=bucket, Key="runs/7/ranks/node-0.pt", Body=b"not needed")
    _assert_equal_state(load_model(f"s3://{bucket}/runs/7").state_dict(), model.state_dict(), rtol=0, atol=0)


def test_distributed_writers_write_their_shards_and_the_index_comes_last(tmp_path: Path) -> None:
    spec = ModelSpec(kind="mlp", n_layer=2, n_embd=8, in_features=4, vocab_size=5)
    states = {i: LayerState(i, build_layer(spec, i, 0)) for i in range(spec.num_layers)}
    for state in states.values():  # some optimizer state to carry
        state.step([torch.ones_like(p) for p in state.params], lr=0.1, weight_decay=0.0, snapshot=False)
    writers = {0: 5, 1: 5, 2: 7, 3: 7}  # node 5 writes layers 0-1, node 7 layers 2-3
    layers = {i: s.module for i, s in states.items()}  # the shard plan's shapes
    common = dict(layers=layers, writers=writers, steps_done=1, export_id="job/1",
                  info={"model": model_entry(spec)}, max_shard_bytes=10**9)
    assert not export_layers(tmp_path, node=7, states={i: states[i] for i in (2, 3)}, **common)
    assert sorted(p.name for p in tmp_path.glob("*.json")) == [INFO]  # no index before every shard is in
    assert export_layers(tmp_path, node=5, states={i: states[i] for i in (0, 1)}, **common)
    assert sorted(p.name for p in tmp_path.glob("model*")) == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    whole = {f"{i}.{k}": v for i in range(4) for k, v in states[i].module.state_dict().items()}
    _assert_equal_state(load_model(tmp_path).state_dict(), whole, rtol=0, atol=0)
    opt = WeightsFolder(tmp_path, "optimizer")
    assert opt.steps_done == 1
    expected_opt = {k: v for i in range(4) for k, v in optimizer_tensors(states[i]).items()}
    _assert_equal_state(opt.state_dict(), expected_opt, rtol=0, atol=0)
    # An export of a later step into the same folder: the old shards do not count as the new one's.
    assert not export_layers(tmp_path, node=7, states={i: states[i] for i in (2, 3)},
                             **{**common, "export_id": "job/2"})


def test_distributed_writers_upload_to_s3_and_the_index_comes_last(tmp_path: Path, s3) -> None:  # noqa: F811
    """The same export to `s3://` (moto): each writer stages its shards locally, uploads them tagged
    with the export id, and the last writer to finish uploads the indexes; load_model reads it back."""
    client, bucket = s3
    spec = ModelSpec(kind="mlp", n_layer=2, n_embd=8, in_features=4, vocab_size=5)
    states = {i: LayerState(i, build_layer(spec, i, 0)) for i in range(spec.num_layers)}
    for state in states.values():
        state.step([torch.ones_like(p) for p in state.params], lr=0.1, weight_decay=0.0, snapshot=False)
    url = f"s3://{bucket}/jobs/job-3"
    layers = {i: s.module for i, s in states.items()}  # the shard plan's shapes
    common = dict(layers=layers, writers={0: 5, 1: 5, 2: 7, 3: 7}, steps_done=1, export_id="job/1",
                  info={"model": model_entry(spec)}, max_shard_bytes=10**9)

    def keys() -> list[str]:
        listed = client.list_objects_v2(Bucket=bucket, Prefix="jobs/job-3/").get("Contents", [])
        return sorted(o["Key"].removeprefix("jobs/job-3/") for o in listed)

    staging = tmp_path / "node-7"
    assert not export_layers(url, node=7, states={i: states[i] for i in (2, 3)}, staging=staging, **common)
    assert not staging.exists()  # the staging folder is removed after the upload
    assert not [k for k in keys() if k.endswith(".index.json")]  # no index before every shard is in
    assert INFO in keys()
    assert export_layers(url, node=5, states={i: states[i] for i in (0, 1)}, **common)
    assert [k for k in keys() if k.startswith("model")] == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    head = client.head_object(Bucket=bucket, Key="jobs/job-3/model-00001-of-00002.safetensors")
    assert head["Metadata"]["export"] == "job/1"
    whole = {f"{i}.{k}": v for i in range(4) for k, v in states[i].module.state_dict().items()}
    _assert_equal_state(load_model(url).state_dict(), whole, rtol=0, atol=0)
    # A later export into the same prefix: the old objects do not count as the new one's shards.
    assert not export_layers(url, node=7, states={i: states[i] for i in (2, 3)}, **{**common, "export_id": "job/2"})


def test_checkpoints_on_s3_are_exports_found_pruned_and_loaded(s3) -> None:  # noqa: F811 (the fixture)
    """`runtime.checkpointing.checkpoints` under `s3://` (moto): complete once the last writer's upload is in,
    the last two kept, a layer restored from one, and load_model reads a checkpoint prefix."""
    client, bucket = s3
    spec = ModelSpec(kind="mlp", n_layer=2, n_embd=8, in_features=4, vocab_size=5)
    states = {i: LayerState(i, build_layer(spec, i, 0)) for i in range(spec.num_layers)}
    writers = {0: 5, 1: 5, 2: 7, 3: 7}
    store = Checkpoints(f"s3://{bucket}/jobs/job-4")
    for step in (2, 4, 6):
        for node in (7, 5):
            store.write(step, spec=spec, layers={i: s.module for i, s in states.items()}, writers=writers, node=node,
                        export_id=f"job-4/{step}", info={},
                        states={i: s for i, s in states.items() if writers[i] == node})
        if step == 2:
            assert store.latest() == 2
    assert store.complete_steps() == [4, 6]
    assert not client.list_objects_v2(Bucket=bucket, Prefix="jobs/job-4/checkpoints/step-2/").get("Contents")
    back = LayerState(3, build_layer(spec, 3, 99))
    store.load(6, back)
    torch.testing.assert_close(back.module.state_dict(), states[3].module.state_dict(), rtol=0, atol=0)
    whole = {f"{i}.{k}": v for i in range(4) for k, v in states[i].module.state_dict().items()}
    _assert_equal_state(load_model(store.step_dir(4)).state_dict(), whole, rtol=0, atol=0)


def test_load_model_imports_neither_django_nor_the_control_plane() -> None:
    code = ("import sys, spotpipe; spotpipe.load_model; "
            "assert not [m for m in sys.modules if m.startswith(('django', 'controlplane'))], sys.modules.keys()")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("value", [" ", " padded", "s3://"])
def test_init_from_must_be_a_path(value: str) -> None:
    problems = JobConfig(init_from=value).problems()
    assert [p.field for p in problems] == ["init_from"] and "is not a path" in problems[0].message


def _train(tmp_path: Path, **options) -> tuple[int, str, str]:
    job = tmp_path / "tiny.toml"
    job.write_text(TINY_GPT)
    out, err = io.StringIO(), io.StringIO()
    code = run_train(TrainOptions(file=job, data=f"text:{CORPUS}", dp=2, pp=2, microbatches=2, lr=0.01, **options),
                     out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.runtime
@pytest.mark.timeout(240)
def test_weights_of_a_run_with_a_kill_load_equal_the_reference_and_continue_with_init_from(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    first = tmp_path / "first"
    code, _, err = _train(tmp_path, steps=4, fails=["kill:1@2"], out=first)
    assert code == 0, err
    info = json.loads((first / INFO).read_text())
    assert info["model"]["kind"] == "gpt" and info["steps_done"] == 4
    # Which nodes write depends on the final layout (here a survivor may hold every layer: one file).
    assert WeightsFolder.exists(first, "model") and WeightsFolder.exists(first, "optimizer")
    config = JobConfig.from_dict(info["config"])
    reference = _as_state_dict(train_reference(config)[0])

    model = spotpipe.load_model(first)
    _assert_equal_state(model.state_dict(), reference, rtol=0, atol=0)  # the same math, and nothing lost
    reference_model = build_model(config.model, config.seed)
    reference_model.load_state_dict(reference)
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(model(tokens), reference_model(tokens), rtol=0, atol=0)

    # 8 steps == 4 steps, exported, then 4 more from the export with its optimizer state.
    second = tmp_path / "second"
    code, _, err = _train(tmp_path, steps=8, init_from=str(first), out=second)
    assert code == 0, err
    records = [json.loads(line) for line in (second / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [5, 6, 7, 8]  # the step counter (and data order) continued
    index = json.loads((second / "model.safetensors.index.json").read_text())  # two stages, two writers
    assert sorted(set(index["weight_map"].values())) == ["model-00001-of-00002.safetensors",
                                                         "model-00002-of-00002.safetensors"]
    full = JobConfig.from_dict({**info["config"], "steps": 8})
    expected = _as_state_dict(train_reference(full)[0])
    _assert_equal_state(spotpipe.load_model(second).state_dict(), expected)
    # The checkpoint strategy, killed before any checkpoint of its own: it restarts from the export.
    third = tmp_path / "third"
    code, _, err = _train(tmp_path, steps=8, init_from=str(first), strategy="checkpoint", fails=["kill:2@5"],
                          out=third)
    assert code == 0, err
    _assert_equal_state(spotpipe.load_model(third).state_dict(), expected)

    capsys.readouterr()
    assert cli_main(["sample", str(second), "--prompt", "import ", "--tokens", "20"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("import ") and len(printed.encode()) >= len("import ") + 1


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600)])
def test_weights_and_their_info_get_the_users_umask(tmp_path: Path, umask: int, mode: int) -> None:
    """Like any file the user writes: not mkstemp's (nor safetensors') 0600 whatever the umask."""
    import os

    spec = ModelSpec(kind="mlp", n_layer=1, n_embd=8)
    old = os.umask(umask)
    try:
        export_model(tmp_path, build_model(spec, 0), spec=spec, max_shard_bytes=64)  # several shards and an index
    finally:
        os.umask(old)
    written = sorted(tmp_path.iterdir())
    assert {p.name for p in written} >= {INFO, "model.safetensors.index.json"} and len(written) > 3
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in written} == {p.name: oct(mode) for p in written}
