"""`spotpipe train`: flags over a job file, real data, validation, failures, and what it writes; bad
input is one clear message with no process started."""

from __future__ import annotations

import io
import json
import sysconfig
from pathlib import Path

import pytest
import torch

import spotpipe
from spotpipe.train import TrainOptions, run_train

CORPUS = Path(sysconfig.get_paths()["stdlib"]) / "argparse.py"
TINY_GPT = """target_steps = 2
strategy = "recycle"
[config]
global_batch = 8
op_timeout_s = 2.0
[config.model]
kind = "gpt"
n_layer = 2
n_embd = 16
n_head = 2
seq_len = 16
vocab_size = 256
[plan]
dp = 1
pp = 1
"""


def _job_file(tmp_path: Path, config: str = "") -> Path:
    """TINY_GPT, with `config` lines added to its [config] table."""
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_GPT.replace("[config]\n", f"[config]\n{config}"))
    return path


def _train(options: TrainOptions) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return run_train(options, out=out, err=err), out.getvalue(), err.getvalue()


@pytest.mark.runtime
@pytest.mark.timeout(120)
def test_train_on_text_with_flags_over_the_file_a_kill_and_validation(tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    code, out, err = _train(TrainOptions(
        file=_job_file(tmp_path, "checkpoint_interval = 3\n"), data=f"text:{CORPUS}", dp=2, pp=2, microbatches=2,
        steps=8, val_every=4,
        lr=0.01, fails=["kill:1@3"], out=out_dir))
    assert code == 0, err
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    # One record per step, in order, none twice, numbered as steps done (as the console and checkpoints).
    assert [r["step"] for r in records] == list(range(1, 9))
    assert [r["step"] for r in records if "val_loss" in r] == [4, 8]
    assert all(r["tokens_per_s"] == pytest.approx(r["samples_per_s"] * 16) for r in records)  # 16-token windows
    assert records[-1]["loss"] < records[0]["loss"]
    summary = json.loads((out_dir / "spotpipe.json").read_text())
    assert summary["config"]["dp"] == 2 and summary["config"]["steps"] == 8  # the flags won over the file
    assert summary["config"]["model"]["n_embd"] == 16  # the file's model stayed
    assert summary["data"]["source"] == f"text:{CORPUS}" and len(summary["data"]["content_hash"]) == 64
    assert summary["tokenizer"] == "byte" and summary["final_val_loss"] == records[-1]["val_loss"]
    assert "val " in out and "tok/s" in out and "done: 8 steps" in out
    # The kill is told: a line when the survivors train on, the count in the summary, the record kept.
    (recovery,) = summary["recoveries"]
    assert (recovery["generation"], recovery["lost"], len(recovery["members"])) == (1, [1], 3)
    assert recovery["seconds"] is not None and recovery["seconds"] >= 0 and recovery["steps_redone"] >= 0
    assert "recovery: generation 1: lost rank 1; 3 ranks train on from step" in out
    assert "; 1 recovery (" in out
    assert len(list((out_dir / "ranks").glob("node-*.pt"))) == 3  # the killed rank saved nothing
    # Checkpoints every 3 steps beside the weights, in their format: step 3 (before the kill) and 6
    # (3 steps into the generation after it); each loads like the final weights.
    assert sorted(p.name for p in (out_dir / "checkpoints").iterdir()) == ["step-3", "step-6"]
    checkpoint = spotpipe.load_model(out_dir / "checkpoints" / "step-6")
    assert json.loads((out_dir / "checkpoints" / "step-6" / "spotpipe.json").read_text())["steps_done"] == 6
    final = spotpipe.load_model(out_dir).state_dict()
    assert checkpoint.state_dict().keys() == final.keys()
    assert any(not torch.equal(t, final[k]) for k, t in checkpoint.state_dict().items())  # 2 steps earlier
    # The same metrics as TensorBoard event files (tensorboard is in the dev extra).
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out_dir / "tb"))
    events.Reload()
    val = [records[3]["val_loss"], records[7]["val_loss"]]
    assert [e.value for e in events.Scalars("val/loss")] == pytest.approx(val)
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, 9))
    assert [e.step for e in events.Scalars("train/samples_per_s")] == list(range(1, 9))


@pytest.mark.parametrize(("options", "message"), [
    (dict(data="txt:corpus"), "data.source 'txt:corpus' is invalid: expected FORMAT:LOCATION"),
    (dict(data="text:/nonexistent/corpus.txt"), "/nonexistent/corpus.txt"),
    (dict(data="tokens:/nonexistent/train.bin"), "token file /nonexistent/train.bin does not exist"),
    (dict(fails=["kill:9@1"]), "rank 9 does not exist; expected 0..0"),
    (dict(fails=["boom"]), "expected KIND:RANK@STEP"),
    (dict(model="gpt-huge"), "model 'gpt-huge' is unknown; expected one of ['gpt-nano', 'gpt2'"),
    (dict(val_every=2), "val_every needs held-out data"),
])
def test_bad_input_is_one_message_and_starts_nothing(tmp_path: Path, options: dict, message: str) -> None:
    out_dir = tmp_path / "out"
    code, _, err = _train(TrainOptions(file=_job_file(tmp_path), out=out_dir, **options))
    assert code == 2
    assert message in err
    assert not (out_dir / "ranks").exists()  # no rank was started


def test_requirements_are_not_installed_here_and_it_says_so(tmp_path: Path) -> None:
    path = tmp_path / "reqs.toml"
    path.write_text(TINY_GPT.replace("[config]\n", '[config]\nrequirements = ["numpy>=1.26"]\n'))
    code, _, err = _train(TrainOptions(file=path, out=tmp_path / "out", data="text:/nonexistent/corpus.txt"))
    assert code == 2  # (stopped by the bad data, after the note)
    assert "note: requirements ['numpy>=1.26'] are not installed by spotpipe train" in err


def test_presets_have_gpt2_shapes_and_take_the_tokenizers_vocabulary(tmp_path: Path) -> None:
    import torch

    from runtime.models.model import build_model
    from spotpipe.train import resolve_config

    text = resolve_config(TrainOptions(model="gpt2", data=f"text:{CORPUS}"))
    assert (text.model.n_layer, text.model.n_head, text.model.n_embd, text.model.seq_len) == (12, 12, 768, 1024)
    assert text.model.vocab_size == 256  # the byte tokenizer's ids
    assert resolve_config(TrainOptions(model="gpt2-xl", data=f"tokens:{tmp_path}")).model.vocab_size == 50257
    with torch.device("meta"):
        params = sum(p.numel() for p in build_model(resolve_config(TrainOptions(model="gpt2")).model, 0).parameters())
    # GPT-2's 124M with its head untied (+ 50,257 x 768).
    assert params == 124_439_808 + 50_257 * 768


@pytest.mark.runtime
@pytest.mark.timeout(300)
def test_mlflow_and_wandb_get_the_config_losses_recoveries_and_the_weights(tmp_path: Path, monkeypatch) -> None:
    import mlflow

    monkeypatch.setenv("WANDB_MODE", "offline")  # W&B without its servers (the files stay under OUT/wandb)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out_dir = tmp_path / "tracked"
    code, _, err = _train(TrainOptions(file=_job_file(tmp_path), data=f"text:{CORPUS}", dp=2, steps=4,
                                       fails=["kill:1@2"], track=["mlflow", "wandb"], out=out_dir))
    assert code == 0, err
    summary = json.loads((out_dir / "spotpipe.json").read_text())
    runs = {t["tracker"]: t for t in summary["tracking"]}
    assert set(runs) == {"mlflow", "wandb"}  # --track replaces the default (no tb/ this time)
    assert not (out_dir / "tb").exists()

    client = mlflow.tracking.MlflowClient(tracking_uri=runs["mlflow"]["where"])
    run = client.get_run(runs["mlflow"]["run_id"])
    assert run.data.params["model.n_embd"] == "16" and run.data.params["dp"] == "2"
    assert run.data.tags["weights"] == str(out_dir.resolve())
    losses = client.get_metric_history(run.info.run_id, "loss")
    assert [m.step for m in losses] == [1, 2, 3, 4]
    assert [m.value for m in losses] == [json.loads(line)["loss"] for line in
                                          (out_dir / "metrics.jsonl").read_text().splitlines()]
    assert client.get_metric_history(run.info.run_id, "recoveries")[-1].value == 1.0

    wandb_dir = Path(runs["wandb"]["where"])
    assert runs["wandb"]["run_id"] and wandb_dir.is_dir() and wandb_dir.is_relative_to(out_dir)
    assert list(wandb_dir.glob("*.wandb")), sorted(p.name for p in wandb_dir.iterdir())


def test_a_tracker_not_installed_or_unknown_is_one_message(tmp_path: Path, monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    code, _, err = _train(TrainOptions(file=_job_file(tmp_path), track=["mlflow"], out=tmp_path / "out"))
    assert code == 2 and "tracking 'mlflow' needs the mlflow package: pip install 'spotpipe[mlflow]'" in err
    path = _job_file(tmp_path)
    path.write_text('tracking = ["neptune"]\n' + path.read_text())
    code, _, err = _train(TrainOptions(file=path, out=tmp_path / "out"))
    assert code == 2 and "tracking ['neptune'] is unknown" in err
    assert not (tmp_path / "out" / "ranks").exists()


@pytest.mark.runtime
@pytest.mark.timeout(180)
def test_data_prepare_trains_on_the_prepared_shards_with_the_losses_of_the_source(tmp_path: Path) -> None:
    prepared = tmp_path / "prepared"
    config = f'data = {{source = "text:{CORPUS}", prepare = "{prepared}"}}\n'
    code, out, err = _train(TrainOptions(file=_job_file(tmp_path, config), out=tmp_path / "a"))
    assert code == 0, err
    assert f"preparing text:{CORPUS} into {prepared}" in out and (prepared / "index.json").exists()
    summary = json.loads((tmp_path / "a" / "spotpipe.json").read_text())
    assert summary["data"]["source"] == f"shards:{prepared}"
    code, out, err = _train(TrainOptions(file=_job_file(tmp_path, config), out=tmp_path / "b"))
    assert code == 0 and "(there already)" in out, err  # prepared once: a second run takes it as it is
    code, _, err = _train(TrainOptions(file=_job_file(tmp_path), data=f"text:{CORPUS}", out=tmp_path / "c"))
    assert code == 0, err
    losses = [[json.loads(line)["loss"] for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
              for run in ("a", "b", "c")]
    assert losses[0] == losses[1] == losses[2]  # the shards give the source's samples, bit for bit
